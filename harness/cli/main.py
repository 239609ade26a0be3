"""`harness` command line: assembles the command groups of harness/cli/ and maps errors to exit codes.

Each module of this package registers its subcommands with ``register(subparsers)`` and
sets ``func`` (the handler, which returns an exit code). This is the one place that turns
what a handler raises into an exit code: a config (or sweep file) error and a missing file
are 2, so is a run directory another trainer holds (`RunBusy`); a full disk or quota
(ENOSPC / EDQUOT, wherever it is raised) is 3, one line naming the path; Ctrl-C is 130.

    python -m harness.cli.main sweep sweeps/quickstart.yaml --dry-run   # same as `harness sweep ...`
"""
from __future__ import annotations

import argparse
import errno
import sys

from harness.engine import numerics

numerics.pin_process()  # before anything imports torch: portable unless GRPO_HARNESS_NUMERICS=native

from evals.datasets import DatasetError  # noqa: E402 (after the numerics pins)
from harness.cli import eval as eval_cmd
from harness.cli import report as report_cmd
from harness.cli import sweep as sweep_cmd
from harness.cli import tracking as tracking_cmd
from harness.cli.polish import blame_override, finish_parser, hydra_hint, quiet_third_party
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
EXIT_NO_SPACE = 3
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="harness",
        description="grpo-harness: train and compare RL fine-tuning algorithms (GRPO, PPO, online RFT, ...) "
                    "under matched budgets, with evaluation, memory and wall-clock tracking.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Start with `harness quickstart`. Every subcommand has --help.")
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return finish_parser(p)


def version() -> str:
    """The installed grpo-harness version (``unknown`` outside an install)."""
    try:
        from importlib.metadata import version as _v
        return _v("grpo-harness")
    except Exception:
        return "unknown"


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None):
    """Parse; Hydra-style ``key=value`` arguments are refused with the ``--set`` spelling."""
    args, extra = parser.parse_known_args(argv)
    positionals = [getattr(args, k, None) for k in ("config", "file", "sweep_dir", "results_dir")]
    hint = hydra_hint(getattr(args, "command", None) or "", [*extra, *positionals])
    if hint:
        print(hint, file=sys.stderr)
        raise SystemExit(2)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    quiet_third_party(getattr(args, "verbose", False))
    try:
        rc = args.func(args)
    except ConfigError as e:
        print(f"harness: config error: {blame_override(str(e), getattr(args, 'set', None))}", file=sys.stderr)
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
    except OSError as e:
        if e.errno not in NO_SPACE:
            raise
        print(_no_space_line(args.command, e), file=sys.stderr)
        return EXIT_NO_SPACE
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


def _no_space_line(command: str, e: OSError) -> str:
    """The one line for a full disk: what, where, and what to do (the run that hit it is
    marked failed where there was room, its temporary files removed; re-running resumes)."""
    where = f" writing {e.filename}" if e.filename else ""
    return (f"harness {command}: out of disk space{where} ({e.strerror or e}): free space (or raise the "
            f"quota) and re-run the same command to resume from the last checkpoint")


if __name__ == "__main__":
    sys.exit(main())
