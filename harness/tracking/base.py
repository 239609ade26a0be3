"""Trackers: metrics.jsonl is always written; MLflow / wandb mirror it.

The trainer talks to one :class:`TrackerSet`:

    ts = open_trackers(cfg, run_dir, run_id, sweep=cfg.name)
    ts.start(params=flat_config, tags={...})
    ts.log(row, step=budget_consumed)     # row: the dict also written to metrics.jsonl
    ts.log_artifact(path)
    ts.finish(summary, status)            # status: finished | failed | killed

A mirror that fails (server down, bad URI, package missing) warns once and is dropped;
the run and its JSONL go on.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from harness.config.base import effective_dict, effective_flat, expand_shorthand


class Tracker:
    name = "tracker"

    def start(self, params: dict, tags: dict) -> None: ...
    def log(self, row: dict, step: float) -> None: ...
    def log_artifact(self, path: str | Path) -> None: ...
    def finish(self, summary: dict, status: str) -> None: ...


class TrackerSet:
    """Fans calls out to mirrors; a mirror that raises is warned about once and dropped."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = list(trackers)

    def _call(self, method: str, *args: Any) -> None:
        for t in list(self.trackers):
            try:
                getattr(t, method)(*args)
            except Exception as e:  # never let a mirror stop a run
                warnings.warn(f"tracker '{t.name}' failed in {method}() and is disabled for this run: "
                              f"{type(e).__name__}: {e}. metrics.jsonl is intact; replay later with "
                              f"`harness sync`.", RuntimeWarning, stacklevel=2)
                self.trackers.remove(t)

    def start(self, params: dict, tags: dict) -> None:
        self._call("start", effective_flat(params or {}), tags)  # the algorithm's effective components

    def log(self, row: dict, step: float) -> None:
        self._call("log", row, step)

    def log_artifact(self, path) -> None:
        self._call("log_artifact", path)

    def finish(self, summary: dict, status: str) -> None:
        self._call("finish", summary, status)


def cfg_get(cfg: Any, dotted: str, default: Any = None) -> Any:
    """``cfg_get(cfg, "tracking.mlflow_uri")`` on a Config dataclass or a plain dict."""
    cur = cfg
    for part in dotted.split("."):
        if cur is None:
            return default
        if isinstance(cur, dict):
            cur = cur.get(part)
        else:
            cur = getattr(cur, part, None)
        if isinstance(cur, str) and part == "algorithm" and dotted != "algorithm":
            cur = expand_shorthand(cur)  # `algorithm: ppo`
    return default if cur is None else cur


def config_dict(cfg: Any) -> dict:
    """The config a mirror records (params, wandb config): the effective one, with the
    algorithm's preset-filled components written out (:func:`harness.config.base.effective_dict`)."""
    if cfg is None:
        return {}
    return effective_dict(cfg)
