"""`harness report RESULTS_DIR/<sweep> [--output-dir DIR] [--study]`: the paper-style table and plots of one sweep, or its study report."""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from harness.cli.checks import check_output_dir, check_runs_folder
from harness.report import build
from harness.report.build import build_report
from harness.report.study import build_study_report
from harness.report.tables import format_table


def cmd_report(args) -> int:
    try:
        for extra in ("matplotlib", "pandas"):
            importlib.import_module(extra)
    except ImportError as e:
        print(f"harness report: {e.name} is not installed (pip install 'grpo-harness[report]')", file=sys.stderr)
        return 2
    check_runs_folder(args.sweep_dir, "sweep_dir")
    if getattr(args, "study", False):
        return _cmd_study(args)
    out = Path(args.out) if args.out is not None else Path(args.sweep_dir) / "report"
    check_output_dir(out, "--output-dir")
    res = build_report(args.sweep_dir, args.out)
    print(format_table(res["table"]))
    print(f"\nwrote {res['html']}, {res['markdown']}, {res['csv']}, {res['runs_csv']} and "
          f"{len(res['plots'])} plots in {res['out_dir'] / 'plots'}")
    if res["excluded"]:
        print(f"excluded (not finished): {', '.join(res['excluded'])}")
    for line in res.get("unusable", []):
        print(f"harness report: warning: run {line}", file=sys.stderr)
    return 0


def _cmd_study(args) -> int:
    """`harness report SWEEP_DIR --study`: the DeepSeekMath small-study report (harness.report.study)."""
    out = Path(args.out) if args.out is not None else Path(args.sweep_dir) / "study"
    check_output_dir(out, "--output-dir")
    path = build_study_report(args.sweep_dir, out)
    print(f"wrote {path}, {out / 'claims.csv'}, {out / 'table5.csv'}, {out / 'compute_curves.csv'} "
          f"and the plots in {out / 'plots'}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="paper-style table and plots (Markdown, HTML, CSV) for one sweep",
        description=build.__doc__.replace("--out DIR", "--output-dir DIR"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir", help="a sweep directory: RESULTS_DIR/<name>")
    p.add_argument("--output-dir", dest="out", default=None, metavar="DIR",
                   help="output directory (default: <sweep_dir>/report, or <sweep_dir>/study with --study)")
    p.add_argument("--out", dest="out", default=None, help=argparse.SUPPRESS)  # the old spelling
    p.add_argument("--study", action="store_true",
                   help="the DeepSeekMath small-study report (Table 5, Figs. 5-7, compute curves, claims) instead")
    p.set_defaults(func=cmd_report)
