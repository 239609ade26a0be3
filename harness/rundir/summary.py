"""summary.json, defined and written in one place: its schema, and every write of it (trainer and sweep launchers).

Schema of ``<run_dir>/summary.json`` (one JSON object; keys the trainer has not reached yet
are absent, a launcher's placeholder fills them with empty values):

- ``run_id``      ``<algorithm>-s<seed>-<hash8>`` (:mod:`harness.rundir.ids`)
- ``name``        the sweep / experiment name (``cfg.name``)
- ``algorithm``   algorithm name; ``seed`` the run's seed
- ``status``      ``running`` | ``finished`` | ``failed`` | ``interrupted``
- ``error``       ``"<ExceptionType>: <message>"`` (or the launcher's reason) when not
  finished, else None; the traceback is in ``error.txt``
- ``config``      the loaded config as a nested dict, its ``algorithm`` section as given (components
  left to the preset are null; ``config.yaml`` writes them out)
- ``started``     unix time the (latest) attempt started (trainer only); ``ended`` when it
  finished or failed (trainer only)
- ``phase``       while running, what the attempt does besides training steps (``initial
  evaluation``, ``evaluation``, ``final evaluation``), for the sweep's live table; removed
  when training resumes and at the end
- ``distributed`` ``{"mode", "world_size"}`` under several processes (trainer only)
- ``budget``      ``{"unit", "amount", "consumed": {samples, tokens, steps, seconds}}``
  (``consumed`` keyed by unit, :func:`harness.foundation.budget.consumed_by_unit`)
- ``params``      parameter counts ``{"policy", "reference", "critic"}``; ``param_mb`` their
  sizes in MiB; ``start`` where the starting policy came from (trainer only)
- ``resumed_from_step``  the checkpoint step the latest attempt resumed from, if it did
- ``initial_eval`` / ``final_eval``  evaluation metrics before training / at the end
  (``{"eval/<task>/<metric>": value}``); with ``eval.validation``, ``initial_val_eval`` /
  ``final_val_eval`` the greedy scores on the validation split before training / at the end
- ``peak``        ``{"rss_mb", "rss_above_base_mb", "cuda_mb"}``; ``perf`` the full
  performance summary (``perf/...``); ``wall_seconds`` wall-clock of the latest attempt,
  without ``setup_seconds`` (``{"warmup_wait", "warmup_build", "initial_eval"}``: the
  shared warm-up and start evaluation, not the algorithm's cost); ``warmup_seconds`` their
  warm-up part. Durations are measured on the monotonic clock (a wall clock stepped back by
  NTP or by hand never makes one negative); ``started`` / ``ended`` are unix stamps only
- ``final_model`` path of the saved policy when ``train.save_final_model``
- ``reward_model`` with a learned reward model (``reward_model.type``): its type, rounds,
  trainings, examples, per-round log and ``cost`` (the samples, tokens and seconds charged to the
  budget; ``seconds_in_stages`` spent scoring inside stages), :mod:`harness.rewards.run`

Writers: the trainer (:func:`new_summary` at start, :func:`record_end` then
:func:`write_summary` at the end, :func:`record_exception` when it raises) and the sweep
launchers for runs that could not record themselves (:func:`record_failure`,
:func:`mark_interrupted`). Every write is atomic (:func:`harness.foundation.files.write_json_atomic`).
Recording an end (:func:`record_exception`, :func:`record_failure`, :func:`mark_interrupted`)
is best effort: on a full disk (any ``OSError``) it logs one warning and returns, so the
error being recorded, not the failure to record it, reaches the user (docs/faults.md).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

from harness.foundation.base import to_dict
from harness.foundation.budget import consumed_by_unit
from harness.foundation.files import write_json_atomic, write_text_atomic
from harness.rundir.layout import ERROR_TXT, METRICS, SUMMARY, read_json, read_metrics
from harness.rundir.read import finished_problem

__all__ = ["STATUSES", "read_summary", "write_summary", "new_summary", "record_end", "record_exception",
           "placeholder_summary", "record_failure", "mark_interrupted", "INTERRUPTED_ERROR", "set_phase"]

log = logging.getLogger(__name__)

STATUSES = ("running", "finished", "failed", "interrupted")
INTERRUPTED_ERROR = "interrupted by the sweep launcher; re-launch the sweep to resume from the checkpoint"


def read_summary(run_dir: str | Path) -> Optional[dict]:
    """The run's summary.json, or None when there is none (or it is unreadable: not a regular
    file, too large, not UTF-8 JSON, not an object; a warning names it)."""
    return read_json(Path(run_dir) / SUMMARY)


def write_summary(run_dir: str | Path, summary: dict) -> None:
    """Atomically (re)write the run's summary.json."""
    write_json_atomic(Path(run_dir) / SUMMARY, summary)


def _best_effort(what: str, path: Path, write, *args) -> bool:
    """``write(*args)``; an OSError (disk full, read-only folder) is logged, not raised."""
    try:
        write(*args)
        return True
    except OSError as e:
        log.warning("could not record %s in %s: %s", what, path, e.strerror or e)
        return False


# --------------------------------------------------------------------------- the trainer's summary


def new_summary(cfg, rid: str, distributed: Optional[dict] = None) -> dict:
    """A ``running`` summary for a training attempt that starts now (``cfg``: a loaded Config)."""
    summary = {"run_id": rid, "name": cfg.name, "algorithm": cfg.algo.name, "seed": cfg.seed,
               "status": "running", "error": None, "config": to_dict(cfg), "started": time.time(),
               "budget": {"unit": cfg.budget.unit, "amount": cfg.budget.amount}}
    if distributed:
        summary["distributed"] = dict(distributed)
    return summary


def record_end(summary: dict, counters: dict, final_eval: dict, perf: dict, elapsed: Optional[float] = None) -> dict:
    """Fill in what a completed training loop knows: final evaluation, budget consumed, peak
    memory, the performance summary and the wall-clock of the attempt (``elapsed``: seconds
    since it started on the monotonic clock; without it, ``ended - started``, never below 0)
    less the shared setup (``setup_seconds``: waiting for and building the warm-up, the start
    evaluation), which is recorded as its own phase (``warmup_seconds`` = the warm-up part)."""
    summary["final_eval"] = final_eval
    summary["budget"]["consumed"] = consumed_by_unit(counters)
    summary["peak"] = {"rss_mb": perf["perf/peak_rss_mb"], "rss_above_base_mb": perf["perf/peak_rss_above_base_mb"],
                       "cuda_mb": perf.get("perf/peak_cuda_mb")}
    summary["perf"] = perf
    setup = summary.get("setup_seconds") or {}
    summary["warmup_seconds"] = float(setup.get("warmup_wait", 0.0)) + float(setup.get("warmup_build", 0.0))
    summary["ended"] = time.time()
    if elapsed is None:
        elapsed = summary["ended"] - summary["started"]
    summary["wall_seconds"] = max(0.0, float(elapsed) - sum(float(v) for v in setup.values()))
    summary.pop("phase", None)
    return summary


def record_exception(run_dir: str | Path, summary: dict, exc: BaseException, traceback_text: str) -> str:
    """The trainer raised: status ``interrupted`` (Ctrl-C) or ``failed`` with the error, and
    ``error.txt`` with the traceback for a failure. Returns the status. When summary.json
    cannot be written (a full disk, a read-only folder), ``exc.unrecorded`` names it, so the
    one line the user sees can say the status on disk is stale."""
    run_dir = Path(run_dir)
    interrupted = isinstance(exc, KeyboardInterrupt)
    summary["status"] = "interrupted" if interrupted else "failed"
    summary["error"] = f"{type(exc).__name__}: {exc}"
    summary["ended"] = time.time()
    summary.pop("phase", None)
    if not _best_effort(f"status {summary['status']}", run_dir, write_summary, run_dir, summary):
        try:
            exc.unrecorded = str(run_dir / SUMMARY)
        except Exception:
            pass
    if not interrupted:
        _best_effort("the traceback", run_dir, write_text_atomic, run_dir / ERROR_TXT, traceback_text)
    return summary["status"]


def set_phase(run_dir: str | Path, summary: dict, phase: Optional[str]) -> None:
    """Record what a running attempt is busy with outside its training steps (``phase``:
    ``initial evaluation``, ``evaluation``, ``final evaluation``; the sweep's live table shows
    it), or that it is back to training (None). Best effort."""
    if phase:
        summary["phase"] = phase
    else:
        summary.pop("phase", None)
    _best_effort(f"phase {phase}", Path(run_dir), write_summary, run_dir, summary)


# --------------------------------------------------------------------------- the launchers' records


def _consumed(run_dir: Path) -> dict:
    """Budget consumed by unit, from the last row of the run's metrics.jsonl (zeros without one)."""
    rows = read_metrics(Path(run_dir) / METRICS)
    return consumed_by_unit(rows[-1] if rows else {})


def placeholder_summary(run_dir: Path, run_id: str, config: dict) -> dict:
    """The summary of a run that never wrote one (``config``: the loaded config as a dict,
    ``to_dict(cfg)``, whose ``algorithm`` section is a mapping)."""
    b = config.get("budget", {})
    alg = config.get("algorithm")
    return {"run_id": run_id, "name": config.get("name"),
            "algorithm": alg.get("name") if isinstance(alg, dict) else None, "seed": config.get("seed"),
            "status": "running", "budget": {"unit": b.get("unit"), "amount": b.get("amount"),
                                            "consumed": _consumed(run_dir)},
            "initial_eval": {}, "final_eval": {}, "peak": {}, "params": {}, "wall_seconds": None,
            "error": None, "config": config}


def _base_summary(run_dir: Path, run_id: str, config: dict) -> dict:
    """The run's summary.json if it has one, else :func:`placeholder_summary`."""
    s = read_summary(run_dir)
    if isinstance(s, dict) and s:
        return s
    return placeholder_summary(run_dir, run_id, config)


def record_failure(run_dir: str | Path, run_id: str, config: dict, error: str, details: str = "") -> None:
    """Mark a run failed: summary status/error, and error.txt unless the trainer wrote one
    (best effort: a launcher survives a disk too full to record it)."""
    run_dir = Path(run_dir)
    _best_effort("status failed", run_dir, _record_failure, run_dir, run_id, config, error, details)


def _record_failure(run_dir: Path, run_id: str, config: dict, error: str, details: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    s = _base_summary(run_dir, run_id, config)
    s["status"] = "failed"
    if not (s.get("error") and (run_dir / ERROR_TXT).exists()):
        s["error"] = error
    write_summary(run_dir, s)
    if not (run_dir / ERROR_TXT).exists():
        write_text_atomic(run_dir / ERROR_TXT, f"{error}\n\n{details}".rstrip() + "\n")


def mark_interrupted(run_dir: str | Path, run_id: str, config: dict) -> str:
    """After a stop: ``interrupted`` unless the run managed to finish, as its files bear out
    (:func:`harness.rundir.read.finished_problem`; returns the status)."""
    run_dir = Path(run_dir)
    s = _base_summary(run_dir, run_id, config)
    budget = config.get("budget") if isinstance(config, dict) and isinstance(config.get("budget"), dict) else None
    if s.get("status") == "finished" and finished_problem(run_dir, s, budget) is None:
        return "finished"
    s["status"] = "interrupted"
    s["error"] = INTERRUPTED_ERROR
    s.setdefault("budget", {})["consumed"] = _consumed(run_dir)
    _best_effort("status interrupted", run_dir, write_summary, run_dir, s)
    return "interrupted"
