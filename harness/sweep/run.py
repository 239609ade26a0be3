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

Setup jobs
==========

Runs with ``warmup.enabled`` (the built-in tiny model, or a pretrained model with ``warmup.pretrained``) start
from a cached supervised warm-up and share a cached start evaluation (one per evaluation setting, and per seed
where it draws samples). Before its runs, the sweep builds each of
those its unfinished runs need in a *setup job*: a worker process of its own
(``harness.train.loop:prepare``, folder ``<output_dir>/<name>/setup/<job>/``: its summary's
``setup_seconds`` are the setup's time, which the study report counts) that fills the caches and exits. Without it, the first run of each seed would build them in-process, and its
wall-clock and peak memory would carry work the other arms only read (a process that ran the
n = 256 start evaluation keeps ~170 MiB more resident): the peak-memory comparison between arms
would be biased against whichever arm the plan lists first. A setup job whose caches exist
exits in seconds. Setup jobs run with the real trainer only (not under ``HARNESS_TRAIN_FN``),
for single-process runs (``procs`` 1: a multi-process run builds its warm-up on its main rank
and evaluates collectively), and not for runs that resume from a checkpoint (they are past
their start evaluation). A failed setup job is reported and the sweep goes on: its runs build
what is missing themselves (and fail there, recorded, if it cannot be built).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from harness.config.schema import config_from_dict, config_hash
from harness.foundation.base import to_dict
from harness.foundation.budget import consumed_by_unit
from harness.foundation.files import write_json_atomic
from harness.report.format import table
from harness.rundir.ids import run_id as config_run_id
from harness.rundir.layout import METRICS, SETUP_DIR, SUMMARY, SWEEP_JSON, read_json, read_metrics
from harness.rundir.read import columns_in_no_run, summary_value
from harness.rundir.lock import FileLock, LockBusy
from harness.sweep import launchers
from harness.sweep.launchers import LocalLauncher, RayLauncher, RunResult, RunSpec, callable_path
from harness.sweep.plan import PlannedRun, Sweep, cell_label, matches_only, only_problem
from harness.report.study import DESIGN
from harness.sweep import sequential
from harness.sweep.progress import Progress
from harness.sweep.spec import LaunchOptions, SweepError, fmt_value, refresh_problem
from harness.train.evalpoints import initial_eval_settings
from harness.config.paths import uses_warmup_cache, warmup_cache_root
from harness.train.warmup import warmup_key

__all__ = ["run_sweep", "format_results", "summary_value", "unfinished_runs", "DEFAULT_TRAIN", "TRAIN_FN_ENV",
           "SWEEP_FILE"]

DEFAULT_TRAIN = "harness.train.loop:train"
SETUP_TRAIN = "harness.train.loop:prepare"
"""What a setup job's worker calls: build the warm-up and the start evaluation, then exit."""
TRAIN_FN_ENV = "HARNESS_TRAIN_FN"
"""Test seam: ``module:function`` the workers call instead of :data:`DEFAULT_TRAIN`."""
SWEEP_FILE = SWEEP_JSON


# --------------------------------------------------------------------------- results table


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
        "report": {"study": sw.report_study, **({"baseline": sw.report_baseline} if sw.report_baseline else {}),
                   "selection": str(sw.report_selection) if sw.report_selection is not None else None,
                   **({"prm_selection": str(sw.report_prm_selection)} if sw.report_prm_selection is not None else {}),
                   **({"retired": dict(sw.report_retired)} if sw.report_retired else {}),
                   **({"amendments": list(sw.report_amendments)} if sw.report_amendments else {}),
                   **({"cap": sw.report_cap} if sw.report_cap is not None else {})},
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
    (``new`` without one) and that the sequential design did not leave out (``sw.not_needed``), in
    plan order: what keeps the study report from being written."""
    out = []
    for r in sw.runs:
        if r.run_id in sw.not_needed:
            continue
        s = read_json(r.run_dir / SUMMARY)
        st = s.get("status") if isinstance(s, dict) else None
        if st != "finished":
            out.append((r.run_id, st if isinstance(st, str) else "new"))
    return out


# --------------------------------------------------------------------------- running


def _select(sw: Sweep, only: Optional[list[str]], skip_failed: bool) -> list[PlannedRun]:
    """The runs to launch: not finished, matching ``only`` (glob or substring), not failed with ``skip_failed``."""
    todo = [r for r in sw.runs if r.state != "finished"]
    if only is not None:
        todo = [r for r in todo if matches_only(r.run_id, only)]
    if skip_failed:
        todo = [r for r in todo if r.state != "failed"]
    return todo


def _nothing_to_run(sw: Sweep, results: dict, stream) -> int:
    left = [r for r in sw.runs if r.state != "finished"]
    print("nothing to run: every selected run is finished" if not left else
          f"nothing to run: {len(left)} run(s) not finished but not selected", file=stream)
    _write_sweep_json(sw, results, "finished" if not left else "incomplete")
    print(format_results(sw, results), file=stream)
    _warn_columns(sw)
    return 0 if not left else 1


def _warn_columns(sw: Sweep) -> None:
    """One line on stderr per ``report.columns`` path that no run's summary.json holds (its column
    would be all '-'); nothing when no run has a summary yet."""
    if not sw.report_columns:
        return
    summaries = [read_json(r.run_dir / SUMMARY) for r in sw.runs]
    for line in columns_in_no_run(summaries, sw.report_columns):
        print(f"harness sweep: warning: {line}", file=sys.stderr)


def _runner(opts: LaunchOptions):
    if opts.type == "ray":
        return RayLauncher(address=opts.address, workers=opts.workers, options=opts)
    return LocalLauncher(workers=opts.workers, options=opts)


def setup_key(cfg) -> str:
    """What a run's warm-up and start evaluation depend on (`harness.train.warmup.warmup_key` with
    the cache's folder, and `harness.train.evalpoints.initial_eval_settings`; the thread count, the
    rest of the start evaluation's key, is the launcher's and alike for every run): runs with one
    key share one setup job."""
    return config_hash({"warmup": str(warmup_cache_root(cfg) / warmup_key(cfg)), **initial_eval_settings(cfg)}, 12)


def setup_jobs(sweep_dir: Path, todo: list[PlannedRun], opts: LaunchOptions) -> list[RunSpec]:
    """One setup job (see the module doc) per distinct `setup_key` among the runs of ``todo``
    that start from a warm-up (the tiny model's or a pretrained model's) and have no checkpoint yet; [] when the
    launcher runs another trainer (a test seam) or several processes per run."""
    if opts.train != DEFAULT_TRAIN or opts.procs > 1:
        return []
    jobs: dict = {}
    seeds: dict = {}
    for r in todo:
        cfg = r.config
        if not uses_warmup_cache(cfg):
            continue
        if (r.run_dir / "checkpoint").is_dir():  # resumes past its start evaluation
            continue
        key = setup_key(cfg)
        seeds.setdefault(key, set()).add(cfg.seed)
        if key in jobs:
            continue
        d = to_dict(cfg)
        d["warmup"]["cache_dir"] = str(warmup_cache_root(cfg))  # the runs' cache, whatever output_dir says
        d["output_dir"], d["name"] = str(sweep_dir), SETUP_DIR  # <sweep_dir>/setup/<run id>/
        d["tracking"] = dict(d["tracking"], mlflow=False, wandb=False)  # a setup job is not a run to mirror
        job = config_from_dict(d)
        jobs[key] = RunSpec(run_id=f"setup-{key}", run_dir=str(Path(job.output_dir) / job.name / config_run_id(job)),
                            config=d, label="")
    for key, job in jobs.items():  # a greedy-only start evaluation serves every seed of its warm-up
        ss = sorted(seeds[key])
        job.label = f"seed {ss[0]}" if len(ss) == 1 else "seeds " + ", ".join(map(str, ss))
    return list(jobs.values())


class _SetupProgress:
    """The launcher's monitor for setup jobs: a line when each starts and when it ends (with its
    warm-up and start-evaluation seconds), since a seed's setup can take a quarter of an hour."""

    def __init__(self, jobs: list[RunSpec], stream):
        self.jobs, self.stream, self.t0 = {j.run_id: j for j in jobs}, stream, {}

    def update(self, run_id: str, state: str) -> None:
        job = self.jobs.get(run_id)
        if job is None or state in ("queued", "pending"):
            return
        if state == "running":
            self.t0[run_id] = time.monotonic()
            print(f"setup ({job.label}): building the warm-up and the start evaluation, or reading their caches",
                  file=self.stream, flush=True)
            return
        if state == "finished":
            secs = (read_json(Path(job.run_dir) / SUMMARY) or {}).get("setup_seconds") or {}
            shown = (("warmup_build", "warm-up built", 1e-9), ("warmup_wait", "waited for it", 0.5),
                     ("initial_eval", "start evaluation", 0.0))   # (key, words, the least worth a mention)
            parts = ", ".join(f"{name} {secs[k]:.1f} s" for k, name, least in shown
                              if isinstance(secs.get(k), (int, float)) and secs[k] >= least)
            took = time.monotonic() - self.t0.get(run_id, time.monotonic())
            print(f"setup ({job.label}): done in {took:.0f} s ({parts or 'nothing recorded'})",
                  file=self.stream, flush=True)

    def tick(self) -> None:
        pass


def _run_setup(sw: Sweep, todo: list[PlannedRun], opts: LaunchOptions, stream, ahead: tuple = ()) -> bool:
    """Run the setup jobs of ``todo`` before its runs; True if interrupted. ``ahead``: runs that may follow
    (the sequential design's next seed), whose setup jobs are built alongside, so a worker that would wait for
    the last setup job builds the next one (its caches are then read when that seed comes; wasted only if the
    design stops there)."""
    jobs = setup_jobs(sw.sweep_dir, list(todo) + list(ahead), opts)
    if not jobs:
        return False
    for job in jobs:  # always checked anew: a kept folder would say "finished" whatever the caches hold
        shutil.rmtree(job.run_dir, ignore_errors=True)
    print(f"setup: {len(jobs)} warm-up and start-evaluation job(s) ({', '.join(j.label for j in jobs)}), each in a "
          f"process of its own, before the runs (built once, then read from the cache)", file=stream, flush=True)
    t0 = time.monotonic()
    try:
        results = _runner(dataclasses.replace(opts, train=SETUP_TRAIN)).run(jobs, _SetupProgress(jobs, stream))
    except KeyboardInterrupt:
        return True
    for job in jobs:
        res = results.get(job.run_id)
        if res is None or res.status != "finished":
            why = (res.error or "").strip().splitlines() if res else []
            print(f"setup ({job.label}) {res.status if res else 'not run'}: {why[-1] if why else 'no error recorded'}"
                  f"; its runs build what is missing themselves (see {Path(job.run_dir) / 'worker.log'})", file=stream)
        if res is not None and res.status == "interrupted":
            return True
    print(f"setup: done in {time.monotonic() - t0:.0f} s", file=stream, flush=True)
    return False


def _launch(sw: Sweep, todo: list[PlannedRun], opts: LaunchOptions, results: dict, progress: bool | str,
            refresh: Optional[float], stream) -> bool:
    """Run ``todo`` with the launcher ``opts`` names, filling ``results``; True if interrupted."""
    specs = [RunSpec(run_id=r.run_id, run_dir=str(r.run_dir), config=r.config_dict, label=cell_label(r.cell))
             for r in todo]
    mon = Progress([(r.run_id, r.run_dir) for r in sw.runs], unit=sw.budget["unit"],
                   amount=sw.budget["amount"], initial={r.run_id: ("finished" if r.state == "finished"
                                                                   else "pending") for r in sw.runs},
                   mode=progress, stream=stream, interval=refresh)
    runner = _runner(opts)
    try:
        with mon:
            results.update(runner.run(specs, mon))
    except KeyboardInterrupt:
        results.update(getattr(runner, "results", {}) or {})
        return True
    return False


def _launch_sequential(sw: Sweep, todo: list[PlannedRun], opts: LaunchOptions, results: dict,
                       progress: bool | str, refresh: Optional[float], stream) -> bool:
    """``report.sequential``: the runs of ``todo`` seed by seed (`harness.sweep.sequential`); from
    the design's first look, only the arms of open claims. The seeds before the first look run as one batch
    (nothing is decided before it), and each batch's setup jobs build the next batch's alongside (`_run_setup`'s
    ``ahead``), so no worker waits on a setup job alone. True if interrupted; a batch whose runs
    did not all finish stops the sweep there (the next decision needs the whole look)."""
    all_seeds = sorted({r.config.seed for r in sw.runs})
    looks = _looks(sequential.seed_batches(todo), all_seeds, DESIGN.first_look)
    for k, (seeds, batch) in enumerate(looks):
        seed = seeds[0]
        if all_seeds.index(seed) >= DESIGN.first_look:
            drop, lines = sequential.decide(sw, batch)
            for line in lines:
                print(f"seed {seed}: {line}", file=stream)
            for r in batch:
                if r.run_id in drop:
                    sw.not_needed[r.run_id] = drop[r.run_id]
                    results[r.run_id] = RunResult(r.run_id, "not needed", error=drop[r.run_id])
            if drop:
                print(f"seed {seed}: {len(drop)} run(s) not needed ({', '.join(sorted(drop))})", file=stream,
                      flush=True)
            batch = [r for r in batch if r.run_id not in drop]
        if not batch:
            continue
        ahead = looks[k + 1][1] if k + 1 < len(looks) else []
        if _run_setup(sw, batch, opts, stream, ahead) or _launch(sw, batch, opts, results, progress, refresh, stream):
            return True
        left = [r.run_id for r in batch if results.get(r.run_id) is None or results[r.run_id].status != "finished"]
        if left:
            later = [r for r in todo if r.config.seed > seeds[-1] and r.run_id not in results]
            said = f"seed {seed}" if len(seeds) == 1 else f"seeds {', '.join(str(x) for x in seeds)}"
            print(f"{said}: {len(left)} run(s) did not finish ({', '.join(left)}): the sequential design stops "
                  f"here ({len(later)} later run(s) not started); fix them and run the same command again",
                  file=stream)
            return False
    return False


def _looks(batches: list, all_seeds: list, first_look: int) -> list:
    """``[(seeds, runs)]``: the seeds before the design's first look in one batch (nothing is decided before it,
    so their runs share the workers without waiting for each other), then one batch per seed."""
    head = [(s, b) for s, b in batches if all_seeds.index(s) < first_look]
    out = [([s for s, _ in head], [r for _, b in head for r in b])] if head else []
    return out + [([s], b) for s, b in batches if all_seeds.index(s) >= first_look]


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
    _warn_columns(sw)


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
    why = refresh_problem(refresh, "refresh") or only_problem(sw, only, "only")
    if why:
        raise SweepError(why)
    problem = launchers.resource_problem(opts)
    if problem:
        raise SweepError(f"this sweep cannot run on this machine: {problem}")
    todo = _select(sw, only, skip_failed)
    lock = _lock(sw.sweep_dir)
    results: dict = {r.run_id: RunResult(r.run_id, "skipped") for r in sw.runs if r.state == "finished"}
    try:
        _write_sweep_json(sw, results, "running")
        if not todo:
            return _nothing_to_run(sw, results, stream)
        if sw.report_sequential:
            interrupted = _launch_sequential(sw, todo, opts, results, progress, refresh, stream)
        else:
            interrupted = (_run_setup(sw, todo, opts, stream)
                           or _launch(sw, todo, opts, results, progress, refresh, stream))
        interrupted = interrupted or any(res.status == "interrupted" for res in results.values())  # SIGTERMed
        failed = [rid for rid, res in results.items() if res.status == "failed"]
        _write_sweep_json(sw, results, "interrupted" if interrupted else ("failed" if failed else "finished"))
        _print_outcome(sw, results, failed, interrupted, stream)
        if interrupted:
            return 130
        return 1 if failed else 0
    finally:
        lock.close()
