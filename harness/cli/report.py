"""`harness report RESULTS_DIR/<sweep> [--output-dir DIR] [--study [--selection DIR]]`: the paper-style table and plots of one sweep, or its study report."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli.checks import check_runs_folder
from harness.foundation.files import check_output_dir
from harness.cli.polish import lazy, not_installed
from harness.foundation.base import ConfigError
from harness.foundation.files import dir_problem
from harness.rundir import read
from harness.rundir.layout import SUMMARY, read_json
from harness.rundir.outputs import check_output, output_problem

# loaded when the command runs (numpy, pandas, matplotlib; the trackers), so `--help` answers at once
build = lazy("harness.report.build")
study = lazy("harness.report.study")
tables = lazy("harness.report.tables")
report_upload = lazy("harness.tracking.report_upload")
rundir_export = lazy("harness.rundir.export")

DESCRIPTION = ("The paper-style comparison of one sweep: report.md, report.html (plots embedded), table.csv "
               "(one row per algorithm and the starting checkpoint: mean over seeds with a 95% Student-t "
               "interval), runs.csv and plots/*.png, written to <sweep_dir>/report/ (harness sweep writes the "
               "same report when its runs finish). --study writes the DeepSeekMath small-study report "
               "instead. Methods and columns: docs/tracking.md and the report's own notes.")


def cmd_report(args) -> int:
    check_runs_folder(args.sweep_dir, "sweep_dir")
    missing = not_installed("matplotlib", "pandas")
    if missing:
        print(f"harness report: {missing} is not installed (it is a dependency of the harness: pip install -e . "
              f"again)", file=sys.stderr)
        return 2
    bad = rundir_export.sweep_json_problem(args.sweep_dir)
    if bad:
        print(f"harness report: warning: {bad}: ignored (its report.columns and study settings are not read)",
              file=sys.stderr)
    if getattr(args, "study", False):
        if getattr(args, "baseline", None) is not None:
            print("harness report: --baseline is read by the plain report only (the study report's comparisons "
                  "are its claims)", file=sys.stderr)
            return 2
        return _cmd_study(args)
    if getattr(args, "selection", None) is not None:
        print("harness report: --selection is read by the study report only (add --study)", file=sys.stderr)
        return 2
    if getattr(args, "baseline", None) is not None and not args.baseline.strip():
        raise ConfigError("--baseline is empty: give the algorithm the paired differences are taken from (e.g. grpo)")
    out = Path(args.out) if args.out is not None else Path(args.sweep_dir) / "report"
    why = dir_problem(out) or output_problem(out, "report", "--output-dir")  # every check before anything is
    if why:  # written; the folder is replaced whole: never one that holds what harness report did not write
        raise ConfigError(why if why.startswith("--output-dir=") else f"--output-dir={str(out)!r} is invalid: {why}")
    _check_some_finished(Path(args.sweep_dir).expanduser())
    check_output_dir(out, "--output-dir")
    res = build.build_report(args.sweep_dir, args.out, baseline=getattr(args, "baseline", None))
    _warn_columns(Path(args.sweep_dir).expanduser())
    print(tables.format_table(res["table"]))
    print(f"\nwrote {res['html']}, {res['markdown']}, {res['csv']}, {res['runs_csv']} and "
          f"{len(res['plots'])} plots in {res['out_dir'] / 'plots'}")
    if res["excluded"]:
        print(f"excluded (not finished): {', '.join(res['excluded'])}")
    for line in res.get("unusable", []):
        print(f"harness report: warning: run {line}", file=sys.stderr)
    # the trackers the runs mirrored to (their configs' tracking.mlflow / tracking.wandb) get the
    # report too, as at the end of `harness sweep`; a tracker that fails is a warning, not a failure
    reached = report_upload.attach_report(Path(args.sweep_dir), res["out_dir"])
    if reached:
        print(report_upload.reached_line(reached, Path(args.sweep_dir).resolve().name))
    return 0


def _check_some_finished(sweep_dir: Path) -> None:
    """As `harness export`: a sweep folder none of whose runs finished (every one unreadable, failed,
    unfinished or not borne out) is refused in one line (exit 2) before anything is written; the
    report of it would be an empty table. A folder with no run folders directly in it is left to the
    report's own message (which names the sweeps found further down)."""
    choice = rundir_export.choose_runs(sweep_dir)
    if not choice.finished and (choice.skipped or read.is_run_dir(sweep_dir)):
        raise ConfigError(rundir_export.none_finished(choice, f"sweep_dir={str(sweep_dir)!r}", sweep_dir, "report"))


def _warn_columns(sweep_dir: Path) -> None:
    """One line on stderr per report.columns path (as sweep.json records them) that no run's
    summary.json holds: its column of the report is empty."""
    columns = build.sweep_columns(sweep_dir)
    if not columns:
        return
    summaries = [read_json(d / SUMMARY) for d in read.find_run_dirs(sweep_dir, skip_unreadable=False)]
    for line in read.columns_in_no_run(summaries, columns):
        print(f"harness report: warning: {line}", file=sys.stderr)


def _cmd_study(args) -> int:
    """`harness report SWEEP_DIR --study`: the DeepSeekMath small-study report (harness.report.study)."""
    out = Path(args.out) if args.out is not None else Path(args.sweep_dir) / "study"
    check_output(out, "report --study", "--output-dir")  # replaced whole: only an earlier study report
    check_output_dir(out, "--output-dir")
    selection = getattr(args, "selection", None)
    if selection is not None:
        check_runs_folder(selection, "--selection")
    path = study.build_study_report(args.sweep_dir, out, selection_dir=selection)
    print(f"wrote {path}, {out / 'claims.csv'}, {out / 'table5.csv'}, {out / 'compute_curves.csv'} "
          f"and the plots in {out / 'plots'}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="paper-style table and plots (Markdown, HTML, CSV) for one sweep",
        description=DESCRIPTION)
    p.add_argument("sweep_dir", help="a sweep directory: RESULTS_DIR/<name>")
    p.add_argument("--output-dir", dest="out", default=None, metavar="DIR",
                   help="output directory (default: <sweep_dir>/report, or <sweep_dir>/study with --study)")
    p.add_argument("--out", dest="out", default=None, help=argparse.SUPPRESS)  # the old spelling
    p.add_argument("--study", action="store_true",
                   help="the DeepSeekMath small-study report (Table 5, Figs. 5-7, compute curves, claims) instead")
    p.add_argument("--selection", default=None, metavar="DIR",
                   help="with --study: the learning-rate selection sweep's runs folder (default: <sweep_dir>/selection "
                        "when it exists, else the sweep's report.selection)")
    p.add_argument("--baseline", default=None, metavar="ALGORITHM",
                   help="the algorithm every other row's paired difference is taken from (default: the sweep "
                        "file's report.baseline, else the first row)")
    p.set_defaults(func=cmd_report)
