"""Trackers: metrics.jsonl is always written; MLflow / wandb mirror it.

The trainer talks to one :class:`TrackerSet`:

    ts = open_trackers(cfg, run_dir, run_id, sweep=cfg.name)
    ts.start(params=flatten(cfg.effective_dict()), tags={...})   # the algorithm's effective components
    ts.log(row, step=budget_consumed)     # row: the dict also written to metrics.jsonl
    ts.log_artifact(path)
    ts.finish(summary, status)            # status: finished | failed | killed

A mirror that fails (server down, bad URI, package missing) warns once and is dropped;
the run and its JSONL go on.

Every file a mirror uploads or copies (live logging, ``harness sync``, the sweep report) goes
through :func:`artifact_files`: only regular files whose real path is inside the folder being
uploaded. A symlink in a run directory (``worker.log -> ~/.ssh/id_rsa``, ``eval -> /etc``) is
skipped with one warning naming it, never followed out; a FIFO or device is skipped too (a
copy would block on it or never end).

Shared by both mirrors: the chart-only percent metric (:func:`percent_metrics`,
``accuracy_pct/<task>``) and one definition of a run's start and end (:func:`run_times`), so
a live mirror, a replay and the sweep's parent run show the same duration.
"""
from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Optional

from harness.config.schema import effective_dict
from harness.foundation.files import outside_problem, regular_inside_problem
from harness.rundir.layout import METRICS, SUMMARY, RunFileError, open_regular, read_json

PERCENT_PREFIX = "accuracy_pct"
"""Charts' percent accuracy: ``accuracy_pct/<task>`` = 100 x ``eval/<task>/acc`` (the fraction is
logged too; files keep fractions). MLflow's default chart view sorts its sections by name, and
"accuracy_pct" comes before "budget", "eval", "train"."""
_ACC = re.compile(r"^eval/(.+)/acc$")


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
        self._call("start", params or {}, tags)

    def log(self, row: dict, step: float) -> None:
        self._call("log", row, step)

    def log_artifact(self, path) -> None:
        self._call("log_artifact", path)

    def finish(self, summary: dict, status: str) -> None:
        self._call("finish", summary, status)


def cfg_get(cfg: Any, dotted: str, default: Any = None) -> Any:
    """``cfg_get(cfg, "tracking.mlflow_uri")`` on a Config dataclass or a plain dict (a run's config
    read back, whose ``algorithm`` section is a mapping: ``harness.tracking.sync`` resolves it)."""
    cur = cfg
    for part in dotted.split("."):
        if cur is None:
            return default
        if isinstance(cur, dict):
            cur = cur.get(part)
        else:
            cur = getattr(cur, part, None)
    return default if cur is None else cur


def config_dict(cfg: Any) -> dict:
    """The config a mirror records (params, wandb config): the effective one, with the
    algorithm's preset-filled components written out (:func:`harness.config.schema.effective_dict`)."""
    if cfg is None:
        return {}
    return effective_dict(cfg)


# ---------------------------------------------------------------------------------------------
# what may be uploaded
# ---------------------------------------------------------------------------------------------
_SKIP_WARNED: set[str] = set()


def _skip(path: Path, why: str) -> None:
    """One warning per skipped path and reason, per process."""
    key = f"{path}\0{why}"
    if key not in _SKIP_WARNED:
        _SKIP_WARNED.add(key)
        warnings.warn(f"not uploading {path}: {why}", RuntimeWarning, stacklevel=3)


_outside_problem = outside_problem  # the one rule (harness.foundation.files): sync, export, live tracking
upload_problem = regular_inside_problem
"""Why a file may not be uploaded as an artifact of a folder (:func:`harness.foundation.files.regular_inside_problem`)."""


def artifact_dir(f: str | os.PathLike, root: str | os.PathLike) -> Path:
    """The folder of an accepted artifact ``f`` relative to ``root``: where ``f`` itself sits (a
    link keeps its own name and place), else where it points."""
    f, root_real = Path(f), Path(root).resolve()
    try:
        return f.parent.resolve().relative_to(root_real)
    except ValueError:
        return f.resolve().relative_to(root_real).parent


def artifact_files(path: str | os.PathLike, root: str | os.PathLike) -> list[Path]:
    """The files of ``path`` (one file, or a folder's files at any depth) that may be uploaded
    as artifacts of ``root``: regular files whose real path is inside ``root``. Each one left
    out is named in a warning (once); a path that does not exist gives nothing, silently."""
    p, root_real = Path(path), Path(root).resolve()
    if not os.path.lexists(p):
        return []
    if not p.is_dir():
        why = upload_problem(p, root_real)
        if why:
            _skip(p, why)
            return []
        return [p]
    why = _outside_problem(p, root_real)
    if why:
        _skip(p, why)
        return []
    out = []
    for dirpath, dirnames, filenames in os.walk(p):  # symlinked folders are listed, not entered
        d = Path(dirpath)
        for name in sorted(dirnames):
            sub = d / name
            why = _outside_problem(sub, root_real) if sub.is_symlink() else None
            if why:
                _skip(sub, why)
        dirnames.sort()
        for name in sorted(filenames):
            f = d / name
            why = upload_problem(f, root_real)
            if why:
                _skip(f, why)
            else:
                out.append(f)
    return out


# ---------------------------------------------------------------------------------------------
# what the charts show
# ---------------------------------------------------------------------------------------------
def _number(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def percent_metrics(row: dict) -> dict[str, float]:
    """``accuracy_pct/<task>`` (percent, for charts) for every ``eval/<task>/acc`` of a metrics row."""
    out = {}
    for k, v in row.items():
        m = _ACC.match(k)
        if m and _number(v) is not None:
            out[f"{PERCENT_PREFIX}/{m.group(1)}"] = round(100.0 * float(v), 10)
    return out


# ---------------------------------------------------------------------------------------------
# a run's start and end, the same for every mirror
# ---------------------------------------------------------------------------------------------
def run_times(summary: Optional[dict], first: Optional[float], last: Optional[float]) -> tuple[Optional[float], Optional[float]]:
    """(start, end) unix times a tracker records for a run; ``first`` / ``last``: the ``time`` of
    the first and last rows of its metrics.jsonl (None without rows).

    start: the first metrics row (its training history begins there, after the shared warm-up
    and the start evaluation; a live mirror opens its run at that row), else summary ``started``.
    end (None while running): start + summary ``wall_seconds`` for a run that finished in one
    attempt, so the tracker's duration is the run's wall-clock as summary.json records it;
    otherwise (a resumed run spans its attempts; a failed one has no ``wall_seconds``) summary
    ``ended``, else ``started + wall_seconds``, else the last row; never before the start."""
    summary = summary if isinstance(summary, dict) else {}
    started, ended = _number(summary.get("started")), _number(summary.get("ended"))
    wall = _number(summary.get("wall_seconds"))
    wall = wall if wall is not None and wall >= 0 else None
    start = first if first is not None else started
    if summary.get("status") in (None, "running"):
        return start, None
    if first is not None and wall is not None and "resumed_from_step" not in summary:
        end = first + wall
    elif ended is not None:
        end = ended
    elif started is not None and wall is not None:
        end = started + wall
    else:
        end = last
    if end is not None and start is not None:
        end = max(end, start)
    return start, end


def _row_time(line: bytes) -> Optional[float]:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return _number(row.get("time")) if isinstance(row, dict) else None


def metrics_time_span(run_dir: str | os.PathLike, tail_bytes: int = 1 << 16) -> tuple[Optional[float], Optional[float]]:
    """``time`` of the first and last complete rows of a run's metrics.jsonl, read without
    loading the file (its first line and its last ``tail_bytes``); (None, None) when there is
    none or it is not a regular file (never blocks on a FIFO)."""
    try:
        with open_regular(Path(run_dir) / METRICS, "rb") as f:
            first = _row_time(f.readline(1 << 20))
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - tail_bytes))
            lines = [ln for ln in f.read(tail_bytes).split(b"\n") if ln.strip()]
    except (OSError, RunFileError):
        return None, None
    last = next((t for t in (_row_time(ln) for ln in reversed(lines)) if t is not None), None)
    return first, last if last is not None else first


def dir_run_times(run_dir: str | os.PathLike) -> tuple[Optional[float], Optional[float]]:
    """:func:`run_times` of a run directory, from its summary.json and metrics.jsonl."""
    return run_times(read_json(Path(run_dir) / SUMMARY, default={}), *metrics_time_span(run_dir))
