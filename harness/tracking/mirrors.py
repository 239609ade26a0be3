"""Which mirrors a run gets: MLflow and/or wandb, as ``cfg.tracking`` says; a mirror that cannot start warns and is left out."""
from __future__ import annotations

import warnings
from pathlib import Path

from harness.tracking.base import Tracker, TrackerSet
from harness.tracking.mlflow_tracker import MlflowTracker
from harness.tracking.wandb_tracker import WandbTracker


def open_trackers(cfg, run_dir: Path, run_id: str, sweep: str) -> TrackerSet:
    """Mirrors named by ``cfg.tracking``. (MLflow / wandb implementations plug in here.)"""
    trackers: list[Tracker] = []
    tc = cfg.tracking
    if tc.mlflow:
        try:
            trackers.append(MlflowTracker(cfg, run_dir, run_id, sweep))
        except Exception as e:
            warnings.warn(f"MLflow tracking disabled: {type(e).__name__}: {e}", RuntimeWarning)
    if tc.wandb:
        try:
            trackers.append(WandbTracker(cfg, run_dir, run_id, sweep))
        except Exception as e:
            warnings.warn(f"wandb tracking disabled: {type(e).__name__}: {e}", RuntimeWarning)
    return TrackerSet(trackers)
