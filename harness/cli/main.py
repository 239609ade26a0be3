"""`harness` command line. Subcommands live in their own modules, each exposing
``register(subparsers)``; this file only assembles them."""
from __future__ import annotations

import argparse
import importlib
import sys

# Each module registers one or more subcommands; optional ones are skipped if absent.
COMMAND_MODULES = [
    "harness.cli.train",      # train, quickstart, warmup, config
    "harness.cli.eval",              # eval
    "harness.sweep.spec",          # sweep
    "harness.report.build",         # report
    "harness.tracking.sync",           # sync, ui
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="harness",
        description="grpo-harness: train and compare RL fine-tuning algorithms (GRPO, PPO, online RFT, ...) "
                    "under matched budgets, with evaluation, memory and wall-clock tracking.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Start with `harness quickstart`. Every subcommand has --help.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod in COMMAND_MODULES:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:
                continue
            raise
        m.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from harness.config.base import ConfigError
    try:
        rc = args.func(args)
    except ConfigError as e:
        print(f"harness: config error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"harness: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
