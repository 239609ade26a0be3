"""Trackers: metrics.jsonl is always written; MLflow / wandb mirror it.

The trainer talks to one :class:`TrackerSet`:

    ts = open_trackers(cfg, run_dir, run_id, sweep=cfg.name)
    ts.start(params=flat_config, tags={...})
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
"""
from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
from typing import Any, Optional

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


# ---------------------------------------------------------------------------------------------
# what may be uploaded
# ---------------------------------------------------------------------------------------------
_SKIP_WARNED: set[str] = set()


def _inside(real: Path, root_real: Path) -> bool:
    return real == root_real or root_real in real.parents


def _skip(path: Path, why: str) -> None:
    """One warning per skipped path and reason, per process."""
    key = f"{path}\0{why}"
    if key not in _SKIP_WARNED:
        _SKIP_WARNED.add(key)
        warnings.warn(f"not uploading {path}: {why}", RuntimeWarning, stacklevel=3)


def _outside_problem(p: Path, root_real: Path) -> Optional[str]:
    """Why ``p`` is not inside ``root_real`` once every symlink on its way is resolved (None when it is)."""
    try:
        real = p.resolve()  # every symlink on the way, the file's own included
    except (OSError, RuntimeError) as e:  # a symlink loop
        return f"it cannot be resolved ({e})"
    if not _inside(real, root_real):
        return f"it resolves to {real}, outside {root_real}; links out of the folder are never followed"
    return None


def upload_problem(path: str | os.PathLike, root: str | os.PathLike) -> Optional[str]:
    """Why the file ``path`` may not be uploaded as an artifact of the folder ``root`` (None when
    it may): it resolves outside ``root`` (a symlink, or a symlinked folder on its way), or it
    is not a regular file."""
    p, root_real = Path(path), Path(root).resolve()
    why = _outside_problem(p, root_real)
    if why:
        return why
    try:
        mode = os.stat(p).st_mode
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    if not stat.S_ISREG(mode):
        return "it is not a regular file"
    return None


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
