"""Run directory layout (the contract every other part reads).

``<output_dir>/<name>/<run_id>/``
  - ``config.yaml``   the resolved config (every default filled in)
  - ``metrics.jsonl`` one JSON object per line: the budget counters ``step``, ``samples``,
    ``tokens``, ``seconds`` (training wall-clock, evaluation excluded; the vocabulary is
    :mod:`harness.rundir.budget`), ``time`` (unix), then namespaced metrics ``train/…``,
    ``rollout/…``, ``eval/…``, ``perf/…``
  - ``summary.json``  status (running | finished | failed | interrupted), budget consumed in
    every unit, final and initial evaluation metrics, peak memory, parameter counts, error
    (schema and writers: :mod:`harness.rundir.summary`)
  - ``eval/``         per-problem evaluation records, ``<task>_<step>.jsonl``
  - ``checkpoint/``   latest resumable state (policy, critic, optimizers, RNG, counters)
  - ``error.txt``     traceback of a failed run
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from harness.rundir.budget import STEP

SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
ERROR_TXT = "error.txt"


def _clean(v: Any) -> Any:
    if hasattr(v, "item") and callable(v.item):
        try:
            v = v.item()
        except Exception:
            pass
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def read_json(path: str | os.PathLike, default: Any = None) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All complete lines of a JSONL file (a torn last line, from a kill, is skipped)."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return rows


class MetricsWriter:
    """Append-only metrics.jsonl; each row flushed and fsynced so a kill loses nothing logged."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a")

    def write(self, row: dict) -> dict:
        row = {k: _clean(v) for k, v in row.items()}
        row.setdefault("time", time.time())
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        return row

    def truncate_after(self, step: int) -> None:
        """On resume: drop rows logged after the checkpoint's step (they will be redone)."""
        self._f.close()
        rows = [r for r in read_jsonl(self.path) if r.get(STEP, 0) <= step]
        with open(self.path, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        self._f = open(self.path, "a")

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
