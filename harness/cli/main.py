"""`harness` command line: assembles the command groups of harness/cli/ and maps errors to exit codes.

Each module of this package registers its subcommands with ``register(subparsers)`` and
sets ``func`` (the handler, which returns an exit code). This is the one place that turns
what a handler raises into an exit code: a config (or sweep file) error and a missing file
are 2, so is a run directory another trainer holds (`RunBusy`); Ctrl-C is 130.

    python -m harness.cli.main sweep sweeps/quickstart.yaml --dry-run   # same as `harness sweep ...`
"""
from __future__ import annotations

import argparse
import sys

from evals.datasets import DatasetError
from harness.cli import eval as eval_cmd
from harness.cli import report as report_cmd
from harness.cli import sweep as sweep_cmd
from harness.cli import tracking as tracking_cmd
from harness.cli import train as train_cmd
from harness.config.base import ConfigError
from harness.rundir.lock import RunBusy

GROUPS = (
    train_cmd,      # train, quickstart, warmup, config
    eval_cmd,       # eval
    sweep_cmd,      # sweep
    report_cmd,     # report
    tracking_cmd,   # sync, ui
)
COMMAND_MODULES = [m.__name__ for m in GROUPS]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="harness",
        description="grpo-harness: train and compare RL fine-tuning algorithms (GRPO, PPO, online RFT, ...) "
                    "under matched budgets, with evaluation, memory and wall-clock tracking.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Start with `harness quickstart`. Every subcommand has --help.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except ConfigError as e:
        print(f"harness: config error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"harness: {e}", file=sys.stderr)
        return 2
    except (DatasetError, RunBusy) as e:  # bad data file; another process writes the run
        print(f"harness {args.command}: {e}", file=sys.stderr)
        return 2
    except FloatingPointError as e:  # a run that went non-finite: recorded failed, traceback in error.txt
        print(f"harness {args.command}: run failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
