"""`harness` command line: assembles the command groups of harness/cli/ and maps errors to exit codes.

Each module of this package registers its subcommands with ``register(subparsers)`` and
sets ``func`` (the handler, which returns an exit code). This is the one place that turns
what a handler raises into an exit code: a config (or sweep file) error and a missing file
are 2, so is a run directory another trainer holds (`RunBusy`) and a run file that is there
but unusable (`RunFileError`: a corrupt checkpoint or summary, a FIFO as metrics.jsonl), a model
folder that cannot be loaded (`ModelLoadError`) and an option given as ''; every such error prints
as one line of at most ~1,000 characters (`harness.cli.polish.one_line`); the
environment is 3, one line naming the path: a full disk or quota (ENOSPC / EDQUOT, wherever
it is raised, also as torch's or safetensors' RuntimeError: `harness.foundation.files.disk_error`)
and a file or disk that may not be written (EACCES / EPERM / EROFS); Ctrl-C is 130.

    python -m harness.cli.main sweep sweeps/quickstart.yaml --dry-run   # same as `harness sweep ...`
"""
from __future__ import annotations

import argparse
import errno
import sys

from harness.foundation import numerics

numerics.pin_process()  # before anything imports torch: portable unless GRPO_HARNESS_NUMERICS=native

from evals.datasets import DatasetError  # noqa: E402 (after the numerics pins)
from harness.cli import eval as eval_cmd
from harness.cli import export as export_cmd
from harness.cli import report as report_cmd
from harness.cli import rm as rm_cmd
from harness.cli import sweep as sweep_cmd
from harness.cli import tracking as tracking_cmd
from harness.cli.polish import (blame_override, empty_argument, finish_parser, hydra_hint, one_line, quiet_third_party,
                                subparser, unknown_command_hint, unknown_hint)
from harness.cli import train as train_cmd
from harness.foundation.base import ConfigError
from harness.foundation.errors import ModelLoadError, NumericsError
from harness.foundation.files import NO_PERMISSION, NO_SPACE, disk_error
from harness.rundir.layout import RunFileError
from harness.rundir.lock import RunBusy

GROUPS = (
    train_cmd,      # train, quickstart, warmup, config
    eval_cmd,       # eval
    sweep_cmd,      # sweep
    report_cmd,     # report
    tracking_cmd,   # sync, ui
    rm_cmd,         # rm train
    export_cmd,     # export
)
COMMAND_MODULES = [m.__name__ for m in GROUPS]
EXIT_NO_SPACE = 3
EXIT_ENVIRONMENT = EXIT_NO_SPACE  # a full disk, or one that may not be written


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
    """Parse; Hydra-style ``key=value`` arguments are refused with the ``--set`` spelling, an
    unknown command or flag with the nearest right spelling (`harness.cli.polish.unknown_hint`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    hint = unknown_command_hint(parser, argv)
    if hint:
        print(hint, file=sys.stderr)
        raise SystemExit(2)
    args, extra = parser.parse_known_args(argv)
    positionals = [getattr(args, k, None) for k in ("config", "file", "sweep_dir", "results_dir")]
    hint = hydra_hint(getattr(args, "command", None) or "", [*extra, *positionals])
    if hint:
        print(hint, file=sys.stderr)
        raise SystemExit(2)
    if extra:
        command = getattr(args, "command", None) or ""
        hint = unknown_hint(command, subparser(parser, command), extra)
        if hint:
            print(hint, file=sys.stderr)
            raise SystemExit(2)
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    empty = empty_argument(parser, args)  # `--output-dir ''` would read as "not given" or as "."
    if empty:
        print(f"harness {args.command}: {empty}", file=sys.stderr)
        return 2
    quiet_third_party(getattr(args, "verbose", False))
    try:
        rc = args.func(args)
    except ConfigError as e:
        print(one_line(f"harness: config error: {blame_override(str(e), getattr(args, 'set', None))}"), file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(one_line(f"harness: {e}"), file=sys.stderr)
        return 2
    except (DatasetError, RunBusy, RunFileError, ModelLoadError, NumericsError) as e:  # bad data, run file or
        print(one_line(f"harness {args.command}: {e}"), file=sys.stderr)  # model; another process writes the run;
        # numerics that cannot hold here
        return 2
    except FloatingPointError as e:  # a run that went non-finite: recorded failed, traceback in error.txt
        print(f"harness {args.command}: run failed: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        if e.errno in NO_SPACE:
            print(_no_space_line(args.command, e), file=sys.stderr)
            return EXIT_NO_SPACE
        if e.errno in NO_PERMISSION:
            print(_no_permission_line(args.command, e), file=sys.stderr)
            return EXIT_ENVIRONMENT
        raise
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # torch.save / safetensors on a full disk: a RuntimeError / SafetensorError
        full = disk_error(e)
        if full is None:
            raise
        if not full.filename:
            full.filename = getattr(e, "filename", None)
        print(_no_space_line(args.command, full, e), file=sys.stderr)
        return EXIT_NO_SPACE
    return int(rc or 0)


def _stale(e: BaseException) -> str:
    """What the line adds when the run's status could not be recorded (``record_exception``)."""
    where = getattr(e, "unrecorded", None)
    return f"; the run's status could not be recorded ({where} still says running)" if where else ""


def _no_space_line(command: str, e: OSError, raised: BaseException | None = None) -> str:
    """The one line for a full disk: what, where, and what to do (the run that hit it is
    marked failed where there was room, its temporary files removed; re-running resumes)."""
    target = e.filename2 or e.filename  # a copy (shutil) names its source first, the file written second
    where = f" writing {target}" if target else ""
    return (f"harness {command}: out of disk space{where} ({e.strerror or e}){_stale(raised or e)}: free space "
            f"(or raise the quota) and re-run the same command to resume from the last checkpoint")


def _no_permission_line(command: str, e: OSError) -> str:
    """The one line for a file or disk that may not be written (made read-only mid-run, a
    read-only mount): what, where, and what to do (re-running resumes from the checkpoint)."""
    where = f" on {e.filename}" if e.filename else ""
    fix = "remount it read-write" if e.errno == errno.EROFS else "make it (and its folder) writable for this user"
    return (f"harness {command}: permission denied{where} ({e.strerror or e}){_stale(e)}: {fix} and re-run the "
            f"same command to resume from the last checkpoint")


if __name__ == "__main__":
    sys.exit(main())
