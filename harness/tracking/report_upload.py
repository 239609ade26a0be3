"""A sweep's written report to the trackers its runs used: MLflow parent-run artifacts, a wandb report run.

When a sweep's runs mirror to MLflow (``tracking.mlflow``), the report folder (HTML,
Markdown, CSV, plots) becomes the artifacts of the sweep's parent run (under ``report/``),
so the MLflow UI shows it beside the runs it summarises. When they mirror to wandb, one run
named ``<sweep>-report`` (job type ``report``, in the sweep's group, id ``<sweep>-report``)
holds the plots as images, the per-run table as a ``wandb.Table`` and the report files.
Only regular files inside the report folder go (a symlink out of it is skipped with a
warning). A tracker that fails warns once and never fails the sweep (as for runs).

Three callers: `harness sweep` when its runs finish (:func:`upload_report`, the planned
runs), `harness report` (:func:`attach_report`: the runs found in the sweep folder, trackers
from their configs) and `harness sync` (:func:`attach_to`: the tracker being synced, with its
``--uri`` / ``--project`` / ``--mode``). Attaching again replaces the MLflow artifacts; for
wandb an unchanged report is skipped (``<sweep_dir>/wandb/harness_report.json`` records what
was written) and a changed one replaces the previous offline report run (moved to
``<sweep_dir>/wandb/superseded/``).
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional

from harness.rundir.layout import read_json
from harness.rundir.read import find_run_dirs, load_run
from harness.tracking.base import artifact_dir, artifact_files, cfg_get
from harness.tracking.mlflow_tracker import MlflowTracker, _store_lock
from harness.tracking.wandb_tracker import quiet_settings, wandb_id, wandb_mode

log_ = logging.getLogger(__name__)

REPORT_MARKER = "harness_report.json"
TRACKERS = ("mlflow", "wandb")


def upload_report(runs: list, sweep: str, report_dir: Path) -> list[str]:
    """Log ``report_dir`` to the trackers named by the runs' configs (``runs``: the sweep's
    planned runs, with ``config``, ``run_dir`` and ``run_id``). Returns the trackers it reached."""
    reached = []
    for name in TRACKERS:
        run = next((r for r in runs if cfg_get(r.config, f"tracking.{name}")), None)
        if run is not None and attach_to(name, run, sweep, report_dir):
            reached.append(name)
    return reached


def attach_report(results_dir: Path, report_dir: Path) -> list[str]:
    """Attach the report in ``report_dir`` to the trackers the runs under ``results_dir`` (a
    sweep folder) used, as their configs say (``tracking.mlflow`` / ``tracking.wandb``), the
    way :func:`upload_report` does at the end of `harness sweep`. Returns the trackers reached
    (none when no run mirrored anywhere). For `harness report`."""
    runs = sweep_runs(results_dir)
    if not runs:
        return []
    return upload_report(runs, runs[0].sweep, Path(report_dir))


def reached_line(reached: list[str], sweep: str) -> str:
    """Where the report went, for people (`harness report` and `harness sweep`): ``report logged
    to mlflow: artifacts of the sweep's parent run 'quickstart'``."""
    where = {"mlflow": f"artifacts of the sweep's parent run '{sweep}'", "wandb": f"run '{sweep}-report'"}
    if len(reached) == 1:
        return f"report logged to {reached[0]}: {where.get(reached[0], reached[0])}"
    label = {"mlflow": "MLflow", "wandb": "wandb"}
    return (f"report logged to {' and '.join(reached)} ("
            + "; ".join(f"{label.get(t, t)}: {where.get(t, t)}" for t in reached) + ")")


def sweep_runs(results_dir: Path) -> list:
    """The readable runs under ``results_dir`` (:func:`harness.rundir.read.load_run`), those
    directly in it first (the sweep folder itself), then by path."""
    root = Path(results_dir).resolve()
    runs = []
    for d in find_run_dirs(root):
        try:
            runs.append(load_run(d))
        except Exception as e:  # an unreadable run has no say in where the report goes
            log_.debug("report: skipping %s (%s)", d, e)
    return sorted(runs, key=lambda r: (Path(r.run_dir).resolve().parent != root, str(r.run_dir)))


def attach_to(tracker: str, run: Any, sweep: str, report_dir: Path, uri: Optional[str] = None,
              project: Optional[str] = None, mode: Optional[str] = None) -> bool:
    """Attach ``report_dir`` to one tracker (``mlflow``: the parent run of ``run``'s sweep folder;
    ``wandb``: the sweep's report run); True when it got there. A failure is a warning."""
    try:
        if tracker == "mlflow":
            _to_mlflow(run, sweep, Path(report_dir), uri=uri)
        else:
            _to_wandb(run, sweep, Path(report_dir), project=project, mode=mode)
        return True
    except Exception as e:  # the report is on disk; a tracker outage costs nothing else
        warnings.warn(f"report not logged to {tracker}: {type(e).__name__}: {e}", RuntimeWarning)
        return False


def _to_mlflow(run: Any, sweep: str, report_dir: Path, uri: Optional[str] = None) -> str:
    """The report folder as artifacts of the sweep's parent run; returns that run's id."""
    tracker = MlflowTracker(run.config, run.run_dir, run.run_id, sweep, uri=uri)
    tracker.open_store()
    with _store_lock(tracker.uri):
        parent = tracker.parent_run_id()
    root = Path(report_dir).resolve()
    for f in artifact_files(report_dir, root):  # regular files inside the report folder; links out skipped
        rel = artifact_dir(f, root)
        tracker.client.log_artifact(parent, str(f), "report" if rel == Path(".") else f"report/{rel.as_posix()}")
    return parent


def _runs_table(report_dir: Path) -> Optional[tuple[list[str], list[list[str]]]]:
    path = report_dir / "runs.csv"
    if not artifact_files(path, report_dir):  # absent, or a link out of the report folder (named)
        return None
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    return (rows[0], rows[1:]) if rows else None


def report_fingerprint(report_dir: Path) -> str:
    """What a wandb report run depends on: the names and bytes of the report's files."""
    h = hashlib.sha256()
    root = Path(report_dir).resolve()
    for f in artifact_files(report_dir, root):
        h.update((artifact_dir(f, root) / f.name).as_posix().encode() + b"\0")
        h.update(f.resolve().read_bytes())
    return h.hexdigest()


def _write_marker(path: Path, data: dict) -> None:
    """Written to a temporary file and renamed over the marker (whatever is there is replaced, never opened)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _to_wandb(run: Any, sweep: str, report_dir: Path, project: Optional[str] = None,
              mode: Optional[str] = None) -> Optional[str]:
    """One ``<sweep>-report`` run with the plots, the per-run table and the files; returns its
    id (None when the same report is already there)."""
    import wandb

    cfg = run.config
    root = Path(run.run_dir).parent
    mode = mode or wandb_mode(cfg)
    rid = wandb_id(sweep, "report")
    wdir, marker = root / "wandb", root / "wandb" / REPORT_MARKER
    fp = report_fingerprint(report_dir)
    seen = read_json(marker, default={}) or {}
    old = sorted(wdir.glob(f"offline-run-*-{rid}")) if wdir.is_dir() else []
    if seen.get("fingerprint") == fp and seen.get("mode") == mode and (mode != "offline" or old):
        return None
    if mode == "offline" and old:
        (wdir / "superseded").mkdir(parents=True, exist_ok=True)
        for d in old:
            shutil.move(str(d), str(wdir / "superseded" / d.name))
    wb = wandb.init(project=project or str(cfg_get(cfg, "tracking.wandb_project", "grpo-harness")), dir=str(root),
                    id=rid, name=f"{sweep}-report", group=sweep, job_type="report", mode=mode,
                    resume="allow", reinit="create_new", settings=quiet_settings())
    try:
        images = {f"report/{p.stem}": wandb.Image(str(p.resolve()))
                  for p in artifact_files(report_dir / "plots", report_dir) if p.suffix == ".png"}
        table = _runs_table(report_dir)
        if table:
            images["report/runs"] = wandb.Table(columns=table[0], data=table[1])
        wb.log(images)
        dest = Path(wb.dir) / "report"
        rroot = report_dir.resolve()
        for f in artifact_files(report_dir, rroot):  # regular files inside the report folder; links out skipped
            target = dest / artifact_dir(f, rroot) / f.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f.resolve(), target)
            wb.save(str(target), base_path=wb.dir, policy="end")
        done = wb.id
    finally:
        wb.finish()
    _write_marker(marker, {"fingerprint": fp, "wandb_id": rid, "mode": mode, "time": time.time()})
    return done
