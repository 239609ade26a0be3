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
import logging
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, TextIO

log = logging.getLogger(__name__)

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


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def rewrite_atomic(path: str | os.PathLike, write: Callable[[TextIO], None]) -> None:
    """Replace ``path`` with what ``write(f)`` writes, atomically: into a temporary file in
    the same directory, flushed and fsynced, then ``os.replace``d over ``path`` (and the
    directory fsynced). If ``write`` (or the disk) fails, ``path`` is untouched and the
    temporary file is removed. Every rewrite of a run file goes through here."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def remove_temp_files(run_dir: str | os.PathLike) -> list[Path]:
    """Remove the temporary files failed writes left under a run directory (``*.tmp``: a
    checkpoint's ``state.tmp``, a rewrite's ``.<name>.<random>.tmp``), best effort; returns
    the ones removed. Called by the run's one writer (it holds the run lock) when it fails."""
    removed = []
    for tmp in Path(run_dir).rglob("*.tmp"):
        try:
            tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass
    return removed


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """``Path(path).write_text(text)``, atomically (:func:`rewrite_atomic`)."""
    rewrite_atomic(path, lambda f: f.write(text))


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    text = json.dumps(obj, indent=2, default=str)
    write_text_atomic(path, text)


def read_json(path: str | os.PathLike, default: Any = None) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def _jsonl_lines(path: str | os.PathLike, warn: bool = True) -> Iterable[tuple[str, dict]]:
    """(raw line, object) for every line of a JSONL file that holds a JSON object. A torn
    line (a kill mid-write) or a line that is valid JSON but not an object (``123``,
    ``[1]``, ``null``) is skipped with one warning per file naming the line numbers."""
    bad: list[int] = []
    try:
        with open(path, errors="replace") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, ValueError):
                    bad.append(n)
                    continue
                if not isinstance(obj, dict):
                    bad.append(n)
                    continue
                yield line, obj
    except FileNotFoundError:
        pass
    if bad and warn:
        shown = ", ".join(map(str, bad[:10])) + (" …" if len(bad) > 10 else "")
        log.warning("%s: skipped %d line(s) that are not JSON objects (line %s)", path, len(bad), shown)


def read_jsonl(path: str | os.PathLike, warn: bool = True) -> list[dict]:
    """Every JSON-object line of a JSONL file; torn and non-object lines are skipped with a
    warning (:func:`_jsonl_lines`)."""
    return [obj for _, obj in _jsonl_lines(path, warn)]


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

        def _step(r: dict) -> float:
            v = r.get(STEP, 0)
            return v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

        keep = [line for line, r in _jsonl_lines(self.path) if _step(r) <= step]
        try:
            rewrite_atomic(self.path, lambda f: f.writelines(line + "\n" for line in keep))
        finally:
            self._f = open(self.path, "a")

    def close(self) -> None:
        """Close the file; every row was flushed when written, so a flush that fails here is
        the row whose write already raised (disk full): not raised a second time."""
        if not self._f.closed:
            try:
                self._f.close()
            except OSError:
                pass
