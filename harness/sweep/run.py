"""Running a sweep: launch the unfinished runs under the sweep lock, keep sweep.json, print the results table.

Test seam: each worker calls ``harness.train.loop:train`` unless :func:`run_sweep` is given
another ``train``, or the environment variable ``HARNESS_TRAIN_FN`` names one
(``module:function``); the tests use it to run sweeps with a fast fake trainer. It is not a
user setting.

Runs, resume and failures
=========================

Run ids are :func:`harness.rundir.ids.run_id` (``<algorithm>-s<seed>-<hash8>``; the hash covers
everything that changes what a run computes). Re-launching a sweep skips runs whose
``summary.json`` says ``finished``, and hands interrupted or failed ones to the trainer,
which resumes from their ``checkpoint/``. A failing run is recorded (``summary.json``
status ``failed`` + ``error``, ``error.txt`` with the traceback; written by the launcher
when the worker died without writing them, e.g. killed or segfault) and the sweep goes on;
the command then exits 1 and lists the failures. Ctrl-C (or SIGTERM) stops the workers,
marks in-flight runs ``interrupted`` (they resume next time) and keeps finished runs; exit
code 130. Each run's stdout/stderr go to ``<run_dir>/worker.log``. The sweep writes
``<output_dir>/<name>/sweep.json`` (the plan, ``report.columns``, ``report.study`` /
``report.selection`` and each run's final state) for reports. When every run has finished,
``harness sweep`` writes the report (``<output_dir>/<name>/report/``, as ``harness report`` would)
and, with ``report.study``, the study report (``<output_dir>/<name>/study/``), and prints where.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from harness.report.format import table
from harness.rundir.budget import consumed_by_unit
from harness.rundir.layout import METRICS, SUMMARY, read_json, read_metrics, write_json_atomic
from harness.rundir.lock import FileLock, LockBusy
from harness.sweep.launchers import LocalLauncher, RayLauncher, RunResult, RunSpec, callable_path
from harness.sweep.plan import PlannedRun, Sweep, cell_label
from harness.sweep.progress import Progress
from harness.sweep.spec import LaunchOptions, SweepError, fmt_value

__all__ = ["run_sweep", "format_results", "summary_value", "unfinished_runs", "DEFAULT_TRAIN", "TRAIN_FN_ENV",
           "SWEEP_FILE"]

DEFAULT_TRAIN = "harness.train.loop:train"
TRAIN_FN_ENV = "HARNESS_TRAIN_FN"
"""Test seam: ``module:function`` the workers call instead of :data:`DEFAULT_TRAIN`."""
SWEEP_FILE = "sweep.json"


# --------------------------------------------------------------------------- results table


def summary_value(summary: dict, path: str) -> Any:
    """Look up a dotted path in a summary, where keys may themselves contain '/' or '.'."""
    cur: Any = summary
    rest = path
    while rest:
        if not isinstance(cur, dict):
            return None
        if rest in cur:
            return cur[rest]
        parts = rest.split(".")
        for i in range(len(parts) - 1, 0, -1):
            k = ".".join(parts[:i])
            if k in cur:
                cur, rest = cur[k], ".".join(parts[i:])
                break
        else:
            return None
    return cur


def _default_columns(summaries: list[dict]) -> list[str]:
    cols: list[str] = []
    for s in summaries:
        for k in (s.get("final_eval") or {}):
            if (k.endswith("/acc") or k.endswith("/pass@1")) and f"final_eval.{k}" not in cols:
                cols.append(f"final_eval.{k}")
    return cols[:3] + ["peak.rss_mb", "wall_seconds"]


def _consumed(run: PlannedRun, summary: dict, unit: str) -> Any:
    """Budget consumed in ``unit``: from the summary, else from the last metrics row (None without either)."""
    cons = summary_value(summary, f"budget.consumed.{unit}")
    if cons is None and (run.run_dir / METRICS).exists():
        rows = read_metrics(run.run_dir / METRICS)
        cons = consumed_by_unit(rows[-1] if rows else {}).get(unit)
    return cons


_HEADERS = {"peak.rss_mb": "peak RSS MiB", "peak.rss_above_base_mb": "RSS above base MiB",
            "peak.cuda_mb": "peak CUDA MiB", "wall_seconds": "wall s"}  # memory in MiB everywhere


def format_results(sw: Sweep, results: dict) -> str:
    """One row per run: status, budget consumed, and the report columns (default: final accuracies, peak RSS, wall)."""
    summaries = {r.run_id: (read_json(r.run_dir / SUMMARY) or {}) for r in sw.runs}
    cols = sw.report_columns or _default_columns(list(summaries.values()))
    headers = ["run id", "status", "consumed"] + [c.split(".", 1)[-1] if c.startswith("final_eval.") else
                                                  _HEADERS.get(c, c) for c in cols]
    rows = []
    unit = sw.budget["unit"]
    for r in sw.runs:
        s = summaries[r.run_id]
        res = results.get(r.run_id)
        status = res.status if res else (r.state if r.state == "unverified" else s.get("status", r.state))
        status = "finished" if status == "skipped" else status
        cons = _consumed(r, s, unit)
        cons_s = f"{fmt_value(cons)}/{fmt_value(sw.budget['amount'])}" if cons is not None else "-"
        vals = []
        for c in cols:
            v = summary_value(s, c)
            vals.append("-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)))
        rows.append([r.run_id, status, cons_s] + vals)
    return table(headers, rows)


# --------------------------------------------------------------------------- the sweep directory


def _lock(sweep_dir: Path):
    """Exclusive lock on the sweep directory: two launchers on one sweep would run runs twice."""
    try:
        return FileLock(sweep_dir / ".sweep.lock").acquire(blocking=False)
    except LockBusy as e:
        raise SweepError(f"another sweep launcher is running on {sweep_dir} ({e.holder or 'pid unknown'}); "
                         f"wait for it or stop it first") from None


def _write_sweep_json(sw: Sweep, results: dict, status: str) -> None:
    launcher = {k: v for k, v in dataclasses.asdict(sw.launcher).items() if k != "train"}
    doc = {
        "name": sw.name, "source": sw.source, "description": sw.description, "status": status,
        "budget": sw.budget, "varying": sw.varying, "launcher": launcher, "report_columns": list(sw.report_columns),
        "report": {"study": sw.report_study,
                   "selection": str(sw.report_selection) if sw.report_selection is not None else None},
        "updated": time.time(),
        "runs": [{"run_id": r.run_id, "algorithm": r.config.algo.name, "seed": r.config.seed,
                  "cell": r.cell, "dir": str(r.run_dir),
                  "state": (results[r.run_id].status if r.run_id in results else r.state)} for r in sw.runs],
    }
    try:
        write_json_atomic(sw.sweep_dir / SWEEP_FILE, doc)
    except OSError as e:  # disk full: the runs go on (each is recorded in its own folder, best effort)
        print(f"harness sweep: could not write {sw.sweep_dir / SWEEP_FILE} (status {status}): "
              f"{e.strerror or e}", file=sys.stderr)


def unfinished_runs(sw: Sweep) -> list[tuple[str, str]]:
    """``(run id, status)`` of each run of ``sw`` whose summary.json does not say ``finished`` now
    (``new`` without one), in plan order: what keeps the study report from being written."""
    out = []
    for r in sw.runs:
        s = read_json(r.run_dir / SUMMARY)
        st = s.get("status") if isinstance(s, dict) else None
        if st != "finished":
            out.append((r.run_id, st if isinstance(st, str) else "new"))
    return out


# --------------------------------------------------------------------------- running


def _select(sw: Sweep, only: Optional[list[str]], skip_failed: bool) -> list[PlannedRun]:
    """The runs to launch: not finished, matching ``only`` (glob or substring), not failed with ``skip_failed``."""
    todo = [r for r in sw.runs if r.state != "finished"]
    if only:
        todo = [r for r in todo if any(fnmatch.fnmatch(r.run_id, pat) or pat in r.run_id for pat in only)]
    if skip_failed:
        todo = [r for r in todo if r.state != "failed"]
    return todo


def _nothing_to_run(sw: Sweep, results: dict, stream) -> int:
    left = [r for r in sw.runs if r.state != "finished"]
    print("nothing to run: every selected run is finished" if not left else
          f"nothing to run: {len(left)} run(s) not finished but not selected", file=stream)
    _write_sweep_json(sw, results, "finished" if not left else "incomplete")
    print(format_results(sw, results), file=stream)
    return 0 if not left else 1


def _launch(sw: Sweep, todo: list[PlannedRun], opts: LaunchOptions, results: dict, progress: bool | str,
            refresh: Optional[float], stream) -> bool:
    """Run ``todo`` with the launcher ``opts`` names, filling ``results``; True if interrupted."""
    specs = [RunSpec(run_id=r.run_id, run_dir=str(r.run_dir), config=r.config_dict, label=cell_label(r.cell))
             for r in todo]
    mon = Progress([(r.run_id, r.run_dir) for r in sw.runs], unit=sw.budget["unit"],
                   amount=sw.budget["amount"], initial={r.run_id: ("finished" if r.state == "finished"
                                                                   else "pending") for r in sw.runs},
                   mode=progress, stream=stream, interval=refresh)
    if opts.type == "ray":
        runner = RayLauncher(address=opts.address, workers=opts.workers, options=opts)
    else:
        runner = LocalLauncher(workers=opts.workers, options=opts)
    try:
        with mon:
            results.update(runner.run(specs, mon))
    except KeyboardInterrupt:
        results.update(getattr(runner, "results", {}) or {})
        return True
    return False


def _print_outcome(sw: Sweep, results: dict, failed: list[str], interrupted: bool, stream) -> None:
    print("", file=stream)
    print(format_results(sw, results), file=stream)
    if failed:
        print(f"\n{len(failed)} run(s) failed:", file=stream)
        for rid in failed:
            res = results[rid]
            first = (res.error or "").strip().splitlines()
            print(f"  {rid}: {first[-1] if first else 'unknown error'}", file=stream)
            print(f"      see {Path(next(r.run_dir for r in sw.runs if r.run_id == rid)) / 'error.txt'}",
                  file=stream)
    if interrupted:
        n = sum(1 for r in results.values() if r.status == "interrupted")
        print(f"\ninterrupted: {n} in-flight run(s) marked interrupted; re-launch the same command to "
              f"resume (finished runs are kept)", file=stream)


def run_sweep(sw: Sweep, *, train: str | Callable | None = None, launcher: Optional[str] = None,
              workers: Optional[int] = None, address: Optional[str] = None, only: Optional[list[str]] = None,
              skip_failed: bool = False, progress: bool | str = True, refresh: Optional[float] = None,
              stream=None) -> int:
    """Launch the runs of ``sw`` that are not finished; returns an exit code (0 all
    finished, 1 some failed, 130 interrupted). ``train`` defaults to ``$HARNESS_TRAIN_FN``
    (a test seam), else :data:`DEFAULT_TRAIN`."""
    stream = stream or sys.stdout
    train = train or os.environ.get(TRAIN_FN_ENV) or DEFAULT_TRAIN
    opts = dataclasses.replace(sw.launcher, train=callable_path(train), env=dict(sw.launcher.env))
    if launcher:
        opts.type = launcher
    if address:
        opts.address = address
    if workers is not None:
        opts.workers = workers
    todo = _select(sw, only, skip_failed)
    lock = _lock(sw.sweep_dir)
    results: dict = {r.run_id: RunResult(r.run_id, "skipped") for r in sw.runs if r.state == "finished"}
    try:
        _write_sweep_json(sw, results, "running")
        if not todo:
            return _nothing_to_run(sw, results, stream)
        interrupted = _launch(sw, todo, opts, results, progress, refresh, stream)
        interrupted = interrupted or any(res.status == "interrupted" for res in results.values())  # SIGTERMed
        failed = [rid for rid, res in results.items() if res.status == "failed"]
        _write_sweep_json(sw, results, "interrupted" if interrupted else ("failed" if failed else "finished"))
        _print_outcome(sw, results, failed, interrupted, stream)
        if interrupted:
            return 130
        return 1 if failed else 0
    finally:
        lock.close()
