"""Weights & Biases mirror of a run (metrics.jsonl stays the source of truth).

- Mode: ``cfg.tracking.wandb_mode`` if set, else ``$WANDB_MODE`` if set, else **offline**
  (nothing leaves the machine; upload later with ``wandb sync <run_dir>/wandb/offline-run-*``).
- Files under the run directory: ``<run_dir>/wandb/``.
- project = ``cfg.tracking.wandb_project``, group = sweep, job_type = algorithm,
  name = run_id, id = ``<sweep>-<run_id>`` (so the same cell in two sweeps stays two runs),
  config = the resolved config (nested), tags = [algorithm, sweep, seed<N>].
- History: every numeric entry of a metrics.jsonl row plus ``budget/consumed`` (budget
  consumed in the budget unit), declared as the x-axis of every metric
  (``define_metric("*", step_metric="budget/consumed")``). Counters are logged as
  ``budget/steps|samples|tokens|seconds``, declared hidden (no automatic panel: they are
  x-axes to pick, not charts). Each ``eval/<task>/acc`` is also logged in percent as
  ``accuracy_pct/<task>`` (a panel section of its own). Each row carries its own time
  (``_timestamp``), so a replay shows when the run logged it, not when it was replayed.
- Grouping: runs of a sweep share ``group`` = sweep and ``job_type`` = algorithm, so wandb's
  "Group by job type" inside the sweep's group compares algorithms (the workspace's own
  grouping and panel layout are UI settings an offline run cannot carry).
- Summary: ``final/<task>/<metric>``, ``initial/...``, ``peak/...``, ``wall_seconds``,
  ``budget/consumed``, ``n_params/...``, ``status``, and the run's ``started`` / ``ended``
  (unix times) and ``duration_seconds`` as every mirror records them
  (:func:`harness.tracking.base.run_times`; wandb's ``_runtime`` counts the process that wrote
  the offline run, which for a replay is the sync, and cannot be set).
- ``<run_dir>/wandb/harness_sync.json`` records which metrics.jsonl content the offline run
  holds, so ``harness sync --to wandb`` does not replay a run twice.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # no crash reports to sentry
os.environ.setdefault("WANDB_DISABLE_CODE", "true")

from harness.foundation.budget import COUNTER_UNIT, row_consumed, unit_of  # noqa: E402
from harness.rundir.ids import parse_run_id  # noqa: E402
from harness.rundir.read import is_number, summary_metrics  # noqa: E402
from harness.tracking.base import (Tracker, artifact_dir, artifact_files, cfg_get, config_dict,  # noqa: E402
                                   percent_metrics, run_times)

MARKER = "harness_sync.json"


def wandb_mode(cfg: Any) -> str:
    return str(cfg_get(cfg, "tracking.wandb_mode") or os.environ.get("WANDB_MODE") or "offline")


def quiet_settings():
    """wandb settings of every run the harness opens: no console capture, stats or job, silent."""
    import wandb

    return wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_job_creation=True,
                          init_timeout=60)


def wandb_id(sweep: str, run_id: str) -> str:
    rid = re.sub(r"[^A-Za-z0-9_-]", "-", f"{sweep}-{run_id}")
    if len(rid) > 64:
        rid = rid[:55] + "-" + hashlib.sha1(rid.encode()).hexdigest()[:8]
    return rid


def fingerprint(run_dir: str | os.PathLike, status: Optional[str] = None) -> str:
    """What a replay of ``run_dir`` depends on: metrics.jsonl's bytes and the run status."""
    h = hashlib.sha256()
    try:
        h.update(Path(run_dir, "metrics.jsonl").read_bytes())
    except FileNotFoundError:
        pass
    h.update(f"|{status}".encode())
    return h.hexdigest()


def row_history(row: dict, step: Any, unit: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in row.items():
        if k == "time" or not is_number(v):
            continue
        out[f"budget/{unit_of(k)}" if unit_of(k) else k] = float(v)
    out.update(percent_metrics(row))
    if step is None:
        step = row_consumed(row, unit)
    if is_number(step):
        out["budget/consumed"] = float(step)
    if is_number(row.get("time")):
        out["_timestamp"] = float(row["time"])  # the row's own time (a replay is not "now")
    return out


class WandbTracker(Tracker):
    """Mirror of one run into wandb (offline by default). ``cfg`` is a Config or a dict."""

    name = "wandb"

    def __init__(self, cfg: Any, run_dir: str | os.PathLike, run_id: str, sweep: str,
                 mode: Optional[str] = None, project: Optional[str] = None):
        import wandb  # noqa: F401  (fail in open_trackers when the package is missing)

        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_id = str(run_id)
        self.sweep = str(sweep)
        self.mode = mode or wandb_mode(cfg)
        self.project = project or str(cfg_get(cfg, "tracking.wandb_project", "grpo-harness"))
        self.unit = str(cfg_get(cfg, "budget.unit", "steps"))
        self.algorithm = str(cfg_get(cfg, "algorithm.name", "") or parse_run_id(self.run_id).algorithm)
        self.seed = cfg_get(cfg, "seed")
        self.task = str(cfg_get(cfg, "task.name", "task"))
        self.id = wandb_id(self.sweep, self.run_id)
        self.span: tuple = (None, None)  # a replay's (start, end) unix times, set by `harness sync`
        self.run = None
        self.previous: list[Path] = []  # offline runs of the same id from before a resume
        self._row_times: tuple = (None, None)  # first and last row times logged live

    @property
    def offline_dir(self) -> Optional[Path]:
        """The run's own directory (``<run_dir>/wandb/offline-run-...``)."""
        if self.run is None:
            return None
        return Path(self.run.dir).parent

    def start(self, params: dict, tags: dict) -> None:
        import wandb

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.previous = sorted((self.run_dir / "wandb").glob(f"offline-run-*-{self.id}"))
        config = dict(config_dict(self.cfg))
        config["harness"] = {"run_id": self.run_id, "sweep": self.sweep,
                             **{str(k): v for k, v in (tags or {}).items()}}
        settings = quiet_settings()
        self.run = wandb.init(project=self.project, dir=str(self.run_dir), id=self.id, name=self.run_id,
                              group=self.sweep, job_type=self.algorithm, config=config,
                              tags=[t for t in (self.algorithm, self.sweep,
                                                None if self.seed is None else f"seed{self.seed}") if t],
                              mode=self.mode, resume="allow", reinit="create_new", settings=settings)
        self.run.define_metric("budget/consumed")
        for unit in sorted(set(COUNTER_UNIT.values())):  # x-axes to pick, not panels of their own
            self.run.define_metric(f"budget/{unit}", step_metric="budget/consumed", hidden=True)
        self.run.define_metric("*", step_metric="budget/consumed")

    def log(self, row: dict, step: float) -> None:
        if is_number(row.get("time")):
            t = float(row["time"])
            self._row_times = (t if self._row_times[0] is None else self._row_times[0], t)
        data = row_history(row, step, self.unit)
        if data:
            self.run.log(data)

    def log_artifact(self, path: str | os.PathLike) -> None:
        """Copy a file (or a directory's files) into the run's ``files/harness/`` at its path
        relative to the run directory (uploaded at finish when online, by `wandb sync` when
        offline)."""
        dest_root = Path(self.run.dir)
        root = self.run_dir.resolve()
        for f in artifact_files(path, root):  # regular files inside the run directory; links out skipped
            real = f.resolve()
            rel = artifact_dir(f, root) / f.name
            if rel.parts and rel.parts[0] == "wandb":
                continue
            dest = dest_root / "harness" / rel  # config.yaml etc. are reserved names in files/
            st = real.stat()
            if dest.exists() and (dest.stat().st_size, dest.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns):
                continue  # already copied (the trainer and finish() both log the eval files)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(real, dest)
            self.run.save(str(dest), base_path=str(dest_root), policy="end")

    def standard_artifacts(self) -> list[Path]:
        d = self.run_dir
        files = [d / "config.yaml", d / "summary.json", d / "error.txt", d / "worker.log"]
        files += sorted((d / "eval").glob("*.jsonl")) + sorted((d / "plots").glob("*"))
        # links and non-regular files too: log_artifact skips them, naming each
        return [f for f in files if f.is_symlink() or f.is_file() or (f.exists() and not f.is_dir())]

    def finish(self, summary: dict, status: str) -> None:
        summary = summary or {}
        s = summary_metrics(summary, self.unit, self.task)
        s["status"] = str(status)
        start, end = self.span if self.span != (None, None) else \
            run_times({**summary, "status": str(status)}, *self._row_times)
        s.update({k: v for k, v in (("started", start), ("ended", end)) if v is not None})
        if start is not None and end is not None:
            s["duration_seconds"] = round(end - start, 6)  # wandb's own _runtime counts the replay, not the run
        if summary.get("error"):
            s["error"] = str(summary["error"])
        self.run.summary.update(s)
        for f in self.standard_artifacts():
            self.log_artifact(f)
        offline_dir = self.offline_dir
        self.run.finish(exit_code=0 if status == "finished" else 1)
        marker = self.run_dir / "wandb" / MARKER
        if self.previous and self.mode == "offline":
            # a resumed run: its history is split over several offline runs (each restarting
            # wandb's step counter). No marker, so `harness sync --to wandb` writes one
            # complete offline run from metrics.jsonl and sets the pieces aside.
            marker.unlink(missing_ok=True)
            warnings.warn(f"wandb: run {self.run_id} was resumed; its offline history is split over "
                          f"{len(self.previous) + 1} runs in {self.run_dir / 'wandb'}. Run `harness sync "
                          f"{self.run_dir} --to wandb` for one complete offline run before `wandb sync`.",
                          RuntimeWarning, stacklevel=2)
            return
        self.write_marker(status, offline_dir)

    def write_marker(self, status: str, offline_dir: Optional[Path]) -> None:
        """Written to a temporary file and renamed over the marker: whatever is there (a FIFO,
        which an open for writing would block on; a symlink out of the run) is replaced, never
        opened."""
        marker = self.run_dir / "wandb" / MARKER
        marker.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"fingerprint": fingerprint(self.run_dir, status), "wandb_id": self.id,
                           "mode": self.mode, "run_path": str(offline_dir) if offline_dir else None,
                           "time": time.time()}, indent=2)
        fd, tmp = tempfile.mkstemp(prefix=MARKER + ".", suffix=".tmp", dir=marker.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, marker)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
