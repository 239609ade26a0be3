"""`harness sweep FILE.yaml`: print the plan of a sweep, then launch its unfinished runs."""
from __future__ import annotations

import argparse
import importlib
import sys

from harness.cli.checks import check_output_dir
from harness.report.build import build_report
from harness.sweep import run as sweep_run
from harness.sweep import spec as sweep_spec
from harness.sweep.plan import format_plan, load_sweep
from harness.sweep.run import run_sweep
from harness.sweep.spec import LAUNCHER_TYPES, SweepError


def _section(doc: str, heading: str) -> str:
    """The part of a module docstring from ``heading`` on (the user documentation)."""
    return doc[doc.index(heading + "\n"):].strip("\n")


DESCRIPTION = ("`harness sweep FILE.yaml`: expand a grid of runs, launch them, resume, report.\n\n"
               + _section(sweep_spec.__doc__, "Sweep file") + "\n\n"
               + _section(sweep_run.__doc__, "Runs, resume and failures") + "\n")


def cmd_sweep(args) -> int:
    sw = load_sweep(args.file, output_dir=args.output_dir, overrides=args.set)
    if args.launcher:
        sw.launcher.type = args.launcher
    if args.address:
        sw.launcher.address = args.address
    if args.workers is not None:
        if args.workers < 1:
            raise SweepError(f"--workers {args.workers}: must be >= 1")
        sw.launcher.workers = args.workers
    print(format_plan(sw))
    if args.dry_run:
        return 0
    check_output_dir(sw.output_dir, "output_dir")
    print("", flush=True)
    progress: bool | str = False if args.no_progress else True
    rc = run_sweep(sw, only=args.only, skip_failed=args.skip_failed, progress=progress, refresh=args.refresh)
    return _write_report(sw) if rc == 0 else rc


def _write_report(sw) -> int:
    """Every run finished: the sweep's report (as `harness report <sweep_dir>`, with report.columns)."""
    try:
        for extra in ("matplotlib", "pandas"):
            importlib.import_module(extra)
    except ImportError as e:
        print(f"\nno report written: {e.name} is not installed (pip install 'grpo-harness[report]')")
        return 0
    try:
        res = build_report(sw.sweep_dir, columns=sw.report_columns)
    except Exception as e:  # the runs are done; say so and how to retry the report alone
        print(f"harness sweep: every run finished but the report failed ({type(e).__name__}: {e}); "
              f"retry with `harness report {sw.sweep_dir}`", file=sys.stderr)
        return 1
    print(f"\nreport: {res['html']} (also {res['markdown'].name}, {res['csv'].name}, {res['runs_csv'].name} "
          f"and {len(res['plots'])} plots in {res['out_dir'] / 'plots'})")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="run a grid of training runs (algorithms x seeds x ...) at a matched budget",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="sweep YAML (see `harness sweep --help` or harness/sweep/spec.py for the schema)")
    p.add_argument("--dry-run", action="store_true", help="print the expanded plan and run nothing")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="runs in parallel (default: launcher.workers, else fit the CPUs/GPUs)")
    p.add_argument("--launcher", choices=LAUNCHER_TYPES, default=None,
                   help="local worker processes or an existing Ray cluster (default: launcher.type)")
    p.add_argument("--address", default=None, metavar="ADDR", help="Ray cluster address host:port")
    p.add_argument("--output-dir", default=None, metavar="DIR",
                   help="root of run outputs (default: the sweep's output_dir, else the config's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every run (changes run ids), e.g. --set budget.amount=64")
    p.add_argument("--only", action="append", default=None, metavar="PATTERN",
                   help="launch only runs whose id matches (glob or substring); repeatable")
    p.add_argument("--skip-failed", action="store_true", help="do not re-run runs recorded as failed")
    p.add_argument("--no-progress", action="store_true", help="no live progress table")
    p.add_argument("--refresh", type=float, default=None, metavar="SECONDS",
                   help="progress refresh period (default 1 s on a terminal, 30 s otherwise)")
    p.set_defaults(func=cmd_sweep)
