"""`harness sweep FILE.yaml`: print the plan of a sweep, then launch its unfinished runs."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from harness.admission.gate import admit
from harness.foundation.files import check_output_dir
from harness.cli.polish import lazy, not_installed, split_list
from harness.foundation.files import dir_problem
from harness.rundir.outputs import root_problem
from harness.sweep.plan import format_plan, load_sweep, matches_only, only_problem
from harness.sweep.spec import LAUNCHER_TYPES, SweepError, count_problem, refresh_problem

# loaded when a sweep runs (torch, numpy, trackers), so `--help` answers at once
sweep_run = lazy("harness.sweep.run")
sweep_launchers = lazy("harness.sweep.launchers")
report_build = lazy("harness.report.build")
report_study = lazy("harness.report.study")
report_upload = lazy("harness.tracking.report_upload")
sweep_sequential = lazy("harness.sweep.sequential")


DESCRIPTION = ("Expand a sweep file's grid into runs (algorithms x seeds x ...) at one matched budget, "
               "print the plan, launch the unfinished runs (a finished run is never redone, an "
               "interrupted or failed one resumes from its checkpoint), show a live table with ETAs, "
               "and write the report when every run finished (with report.study: true, also the study report "
               "in <sweep_dir>/study, reading report.selection's learning-rate selection runs). The sweep "
               "file format: docs/sweeps.md (or harness/sweep/spec.py).")


def cmd_sweep(args) -> int:
    # every check before the plan is printed (and before anything is written): the command's own
    # options, the sweep file, the selection, the output folders, and what this machine can run
    why = refresh_problem(args.refresh)
    if why:
        raise SweepError(why)
    why = count_problem("--workers", args.workers) if args.workers is not None else None  # launcher.workers' rule
    if why:
        raise SweepError(why)
    sw = load_sweep(args.file, output_dir=args.output_dir, overrides=args.set)
    if args.launcher:
        sw.launcher.type = args.launcher
    if args.address:
        sw.launcher.address = args.address
    if args.workers is not None:
        sw.launcher.workers = args.workers
    only = split_list(args.only)
    why = only_problem(sw, only)
    if why:
        raise SweepError(why)
    field = "--output-dir" if args.output_dir is not None else "output_dir"
    _admit_runs(sw, only)
    if sw.report_study:
        why = sweep_sequential.arm_setting_problem(sw)
        if why:
            raise SweepError(f"{sw.source}: {why}")
    _check_dirs_unwritten(sw, field)
    _check_run_dirs(sw)
    cannot = sweep_launchers.resource_problem(sw.launcher)
    if not args.dry_run:
        if cannot:
            raise SweepError(f"this sweep cannot run on this machine: {cannot}")
        check_output_dir(sw.output_dir, field)  # created, and a file written and removed in it
        check_output_dir(sw.sweep_dir, "sweep folder")
    print(format_plan(sw))
    if sw.report_sequential:
        for line in sweep_sequential.design_warnings(sw):
            print(f"warning: {line}")
    if args.dry_run:
        if cannot:  # the plan is sound (a dry run checks the plan, not this machine), but running it here would not
            print(f"warning: the plan is valid, but this sweep could not run on this machine: {cannot}",
                  file=sys.stderr)
        return 0
    print("", flush=True)
    progress: bool | str = False if args.no_progress else True
    rc = sweep_run.run_sweep(sw, only=only, skip_failed=args.skip_failed, progress=progress, refresh=args.refresh)
    if rc != 0:
        if sw.report_study:
            _study_not_written(sw)
        return rc
    left = sweep_run.unfinished_runs(sw)
    if left:  # --only ran a part: the reports wait for the whole sweep (a study report of a part would
        # read as the study's verdicts)
        print(f"\nreports not written: {len(left)} run(s) of the sweep not finished (not selected by --only); "
              f"they are written when the last run finishes (run the command again for the rest)")
        return 0
    rc = _write_report(sw)
    if sw.report_study:
        rc = max(rc, _write_study(sw))
    return rc


def _admit_runs(sw, only) -> None:
    """Every run to launch through the admission gate (its device, thread counts and the paths it reads; the
    folders are the sweep's, below), before the plan is printed: a run refused here would fail in its worker after
    others started. Runs that read the same paths are checked once."""
    seen = set()
    for r in (r for r in sw.runs if not only or matches_only(r.run_id, only)):
        c = r.config
        key = (c.device, c.train.threads, c.numerics, c.model.name_or_path, c.model.gguf_file, c.algo.prm,
               c.reward_model.init, c.reward_model.type, repr(c.task))
        if key not in seen:
            seen.add(key)
            admit(c, here=False, warmup_cache=False)


def _check_dirs_unwritten(sw, field: str) -> None:
    """The output folder and the sweep's folder could be made and written (as
    `harness.foundation.files.check_output_dir` checks, and creates them, before a real run), without creating
    either: so ``--dry-run`` checks them too, and a real run refuses before it writes anything."""
    for path, name in ((sw.output_dir, field), (sw.sweep_dir, "sweep folder")):
        why = dir_problem(path)
        if not why and path == sw.output_dir:
            why = root_problem(path, name)  # not a run's folder, a final_model, a reward model, a report, ...
            if why:
                raise SweepError(why)
        if why:
            raise SweepError(f"{name}={str(path)!r} is invalid: {why}")


def _check_run_dirs(sw) -> None:
    """Every run's folder is a folder, or absent: a file (or a dangling link) where a run goes would
    stop the sweep part-way, with other runs already started."""
    for r in sw.runs:
        d = Path(r.run_dir)
        if os.path.lexists(d) and not d.is_dir():
            what = (f"a symbolic link to {os.readlink(d)}, which does not exist" if d.is_symlink() and not d.exists()
                    else "a file, not a folder")
            raise SweepError(f"{d} is {what}, where run {r.run_id} of the sweep goes: move it out of the way")


def _study_not_written(sw) -> None:
    """Runs failed (or were interrupted, or not selected): say which, and that no study report was written."""
    left = sweep_run.unfinished_runs(sw)
    which = ", ".join(f"{rid} ({st})" for rid, st in left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
    print(f"\nstudy report not written: {len(left)} run(s) not finished: {which or 'none recorded'}; "
          f"re-run the same command to finish them, and the study report is written at the end")


def _write_study(sw) -> int:
    """report.study: every run finished, so the study report (harness.report.study) into <sweep_dir>/study."""
    kw = {"selection_dir": sw.report_selection} if sw.report_selection is not None else {}
    retry = f"harness report {sw.sweep_dir} --study" + (f" --selection {sw.report_selection}" if kw else "")
    try:
        path = report_study.build_study_report(sw.sweep_dir, sw.study_dir, **kw)
    except Exception as e:  # the runs are done; say so and how to retry the study report alone
        print(f"harness sweep: every run finished but the study report failed ({type(e).__name__}: {e}); "
              f"retry with `{retry}`", file=sys.stderr)
        return 1
    sel = f" (learning-rate selection: {sw.report_selection})" if kw else ""
    print(f"study report: {path}{sel}")
    return 0


def _write_report(sw) -> int:
    """Every run finished: the sweep's report (as `harness report <sweep_dir>`, with report.columns)."""
    missing = not_installed("matplotlib", "pandas")
    if missing:
        print(f"\nno report written: {missing} is not installed (it is a dependency of the harness: pip install -e . again)")
        return 0
    try:
        res = report_build.build_report(sw.sweep_dir, columns=sw.report_columns, baseline=sw.report_baseline)
    except Exception as e:  # the runs are done; say so and how to retry the report alone
        print(f"harness sweep: every run finished but the report failed ({type(e).__name__}: {e}); "
              f"retry with `harness report {sw.sweep_dir}`", file=sys.stderr)
        return 1
    print(f"\nreport: {res['html']} (also {res['markdown'].name}, {res['csv'].name}, {res['runs_csv'].name} "
          f"and {len(res['plots'])} plots in {res['out_dir'] / 'plots'})")
    reached = report_upload.upload_report(sw.runs, sw.name, res["out_dir"])
    if reached:
        print(report_upload.reached_line(reached, sw.name))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="run a grid of training runs (algorithms x seeds x ...) at a matched budget",
        description=DESCRIPTION)
    p.add_argument("file", help="sweep YAML (format: docs/sweeps.md)")
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
    p.add_argument("--only", action="append", nargs="+", default=None, metavar="PATTERN",
                   help="launch only runs whose id matches a glob or substring: --only a b, --only a,b or repeated")
    p.add_argument("--skip-failed", action="store_true", help="do not re-run runs recorded as failed")
    p.add_argument("--no-progress", action="store_true", help="no live progress table")
    p.add_argument("--refresh", type=float, default=None, metavar="SECONDS",
                   help="progress refresh period (default 1 s on a terminal, 30 s otherwise)")
    p.set_defaults(func=cmd_sweep)
