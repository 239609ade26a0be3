"""A sweep's written report to the trackers its runs used: MLflow parent-run artifacts, a wandb report run.

When a sweep's runs mirror to MLflow (``tracking.mlflow``), the report folder (HTML,
Markdown, CSV, plots) becomes the artifacts of the sweep's parent run (under ``report/``),
so the MLflow UI shows it beside the runs it summarises. When they mirror to wandb, one run
named ``<sweep>-report`` (job type ``report``, in the sweep's group) holds the plots as
images, the per-run table as a ``wandb.Table`` and the report files. Only regular files inside
the report folder go (a symlink out of it is skipped with a warning). A tracker that fails
warns once and never fails the sweep (as for runs).
"""
from __future__ import annotations

import csv
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any, Optional

from harness.tracking.base import artifact_dir, artifact_files
from harness.tracking.mlflow_tracker import MlflowTracker, _store_lock
from harness.tracking.wandb_tracker import quiet_settings, wandb_mode

log_ = logging.getLogger(__name__)


def upload_report(runs: list, sweep: str, report_dir: Path) -> list[str]:
    """Log ``report_dir`` to the trackers named by the runs' configs (``runs``: the sweep's
    planned runs, with ``config`` and ``run_dir``). Returns the trackers it reached."""
    reached = []
    mlflow_run = next((r for r in runs if r.config.tracking.mlflow), None)
    wandb_run = next((r for r in runs if r.config.tracking.wandb), None)
    for name, run, fn in (("mlflow", mlflow_run, _to_mlflow), ("wandb", wandb_run, _to_wandb)):
        if run is None:
            continue
        try:
            fn(run, sweep, Path(report_dir))
            reached.append(name)
        except Exception as e:  # the report is on disk; a tracker outage costs nothing else
            warnings.warn(f"report not logged to {name}: {type(e).__name__}: {e}", RuntimeWarning)
    return reached


def _to_mlflow(run: Any, sweep: str, report_dir: Path) -> str:
    """The report folder as artifacts of the sweep's parent run; returns that run's id."""
    tracker = MlflowTracker(run.config, run.run_dir, run.run_id, sweep)
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


def _to_wandb(run: Any, sweep: str, report_dir: Path) -> str:
    """One ``<sweep>-report`` run with the plots, the per-run table and the files."""
    import wandb

    cfg = run.config
    root = Path(run.run_dir).parent
    wb = wandb.init(project=cfg.tracking.wandb_project, dir=str(root), name=f"{sweep}-report", group=sweep,
                    job_type="report", mode=wandb_mode(cfg), reinit="create_new", settings=quiet_settings())
    try:
        images = {f"report/{p.stem}": wandb.Image(str(p.resolve()))
                  for p in artifact_files(report_dir / "plots", report_dir) if p.suffix == ".png"}
        table = _runs_table(report_dir)
        if table:
            images["report/runs"] = wandb.Table(columns=table[0], data=table[1])
        wb.log(images)
        dest = Path(wb.dir) / "report"
        root = report_dir.resolve()
        for f in artifact_files(report_dir, root):  # regular files inside the report folder; links out skipped
            target = dest / artifact_dir(f, root) / f.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f.resolve(), target)
            wb.save(str(target), base_path=wb.dir, policy="end")
        return wb.id
    finally:
        wb.finish()
