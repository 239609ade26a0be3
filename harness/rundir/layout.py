"""Run directory layout (the contract every other part reads).

``<output_dir>/<name>/<run_id>/``
  - ``config.yaml``   the resolved config (every default filled in)
  - ``metrics.jsonl`` one JSON object per line: the budget counters ``step``, ``samples``,
    ``tokens``, ``seconds`` (training wall-clock, evaluation excluded; the vocabulary is
    :mod:`harness.foundation.budget`), ``time`` (unix), then namespaced metrics ``train/…``,
    ``rollout/…``, ``eval/…``, ``perf/…``
  - ``summary.json``  status (running | finished | failed | interrupted), budget consumed in
    every unit, final and initial evaluation metrics, peak memory, parameter counts, error
    (schema and writers: :mod:`harness.rundir.summary`)
  - ``eval/``         per-problem evaluation records, ``<task>_<step>.jsonl``
  - ``checkpoint/``   latest resumable state (policy, critic, optimizers, RNG, counters)
  - ``error.txt``     traceback of a failed run

Reading is bounded and never blocks (:func:`open_regular`, :func:`load_json`,
:func:`read_jsonl`): only regular files are opened (a FIFO, a device such as ``/dev/zero``
behind a symlink, a directory are refused), a JSON file is refused above
:data:`MAX_JSON_BYTES` before it is read, a JSONL line above :data:`MAX_ROW_BYTES` is
skipped, and nesting deeper than :data:`MAX_DEPTH` is refused. A file that is there but
unusable raises :class:`RunFileError` (its message: one line naming the file, what is wrong
and what to do; exit 2 in the CLI) from the strict readers and is a warning plus the default
from the tolerant ones (:func:`read_json`, :func:`read_jsonl`).
"""
from __future__ import annotations

import errno
import json
import logging
import math
import os
import stat
import time
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Optional, TextIO

log = logging.getLogger(__name__)

from harness.foundation.budget import COUNTERS, STEP
from harness.foundation.files import _named, rewrite_atomic, writing

SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
ERROR_TXT = "error.txt"
SETUP_DIR = "setup"
"""A sweep folder's setup jobs (`harness.sweep.run`): each seed's warm-up and start evaluation, built in a
process of its own before the runs; not run folders (`harness.rundir.read.setup_records` reads them)."""
SWEEP_JSON = "sweep.json"
"""A sweep folder's record of its plan and its runs' states (written by `harness.sweep.run`)."""
STUDY_DIR = "study"
"""A sweep folder's study report (`harness.report.study`)."""

NON_RUN_DIRS = frozenset({"checkpoint", "eval", "wandb", "mlartifacts", "mlruns", "report", "plots", "_cache",
                          "__pycache__", "superseded"})
"""Folders that never hold runs, wherever they are (a run's checkpoint and evaluation records, tracker
stores, reports, caches): no reader of run folders (`harness.rundir.read.find_run_dirs`: sync, report,
ui; `harness.rundir.export`) looks into them. Hidden folders (``.name``) neither."""
SWEEP_NON_RUN_DIRS = frozenset({SETUP_DIR, STUDY_DIR})
"""Folders of a sweep folder (one holding :data:`SWEEP_JSON`) that hold no runs of the sweep: its setup
jobs (whose folders look like runs) and its study report. Elsewhere, e.g. directly in a results root, a
folder of one of these names is a sweep's folder like any other (a sweep may be named ``study``)."""


def is_non_run_dir(parent: str | os.PathLike, name: str) -> bool:
    """Whether the folder ``name`` in ``parent`` holds no runs (:data:`NON_RUN_DIRS`, hidden folders, and
    :data:`SWEEP_NON_RUN_DIRS` in a sweep folder): the one rule every reader of run folders applies."""
    if name.startswith(".") or name in NON_RUN_DIRS:
        return True
    return name in SWEEP_NON_RUN_DIRS and os.path.lexists(Path(parent) / SWEEP_JSON)


MAX_JSON_BYTES = 64 * 2**20
"""Largest JSON run file read (summary.json, sweep.json, warmup.json, a cached evaluation):
a real summary is a few hundred KiB at most."""
MAX_ROW_BYTES = 16 * 2**20
"""Largest metrics.jsonl line read; a longer one is skipped like a torn line."""
MAX_DEPTH = 64
"""Deepest nesting of a JSON run file read (a real summary nests 5 levels): deeper ones are
refused rather than left to overflow the recursion of whatever walks them later."""

class RunFileError(Exception):
    """A run file that is there but cannot be used: not a regular file, too large, not UTF-8
    JSON, nested too deeply, of the wrong type, inconsistent. ``str(e)`` is one line:
    ``<path>: <problem>; <what to do>``. The CLI exits 2 with it."""

    def __init__(self, path: str | os.PathLike, problem: str, todo: Optional[str] = None):
        self.path, self.problem = Path(path), problem
        self.todo = todo if todo is not None else "delete it (or restore the run's own file) and re-run"
        super().__init__(f"{path}: {problem}; {self.todo}")


def make_run_dir(path: str | os.PathLike) -> Path:
    """Create a run (or sweep) folder, refusing in one line what mkdir would turn into a
    traceback: a symbolic link whose target does not exist, or a file where the folder goes."""
    p = Path(path)
    if p.is_symlink() and not p.exists():
        raise RunFileError(p, f"is a symbolic link to {os.readlink(p)}, which does not exist",
                           "remove the link (or create the folder it points to) and re-run")
    if p.exists() and not p.is_dir():
        raise RunFileError(p, "is not a folder", "move it out of the way and re-run")
    p.mkdir(parents=True, exist_ok=True)
    return p


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def nonregular(path: str | os.PathLike) -> Optional[str]:
    """What ``path`` is when it exists but is not a regular file (``"a FIFO"``, ``"a character
    device"``, ...; symlinks followed, a dangling one counts as absent), else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else _kind(mode)


def check_regular(path: str | os.PathLike, todo: Optional[str] = None) -> None:
    """Raise :class:`RunFileError` when ``path`` exists but is not a regular file (a FIFO would
    block whoever opens it, ``/dev/zero`` never ends)."""
    kind = nonregular(path)
    if kind:
        raise RunFileError(path, f"is {kind}, not a regular file", todo)


def open_regular(path: str | os.PathLike, mode: str = "rb", todo: Optional[str] = None) -> IO:
    """Open an existing regular file for reading (``mode`` ``"rb"`` or ``"r"``) without ever
    blocking: it is opened non-blocking and checked with ``fstat`` before anything is read, so a
    FIFO, a device (a symlink to ``/dev/zero``), a socket or a directory raises
    :class:`RunFileError` instead of hanging or reading forever. FileNotFoundError when absent, also when
    a folder on its path is a file (ENOTDIR: ``<a file>/summary.json``)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ENOTDIR:  # a folder on the way is a file: the file is absent (as os.path.exists says)
            raise FileNotFoundError(errno.ENOTDIR, f"{e.strerror} (a folder on its path is a file)",
                                    str(path)) from None
        if e.errno in (errno.ENXIO, errno.EISDIR, errno.ENODEV, errno.EOPNOTSUPP):  # a socket, a dir, ...
            raise RunFileError(path, f"cannot be opened as a file ({e.strerror})", todo) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RunFileError(path, f"is {_kind(st.st_mode)}, not a regular file", todo)
        os.set_blocking(fd, True)
        return open(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def read_bytes_bounded(path: str | os.PathLike, max_bytes: Optional[int] = None, todo: Optional[str] = None,
                       tail: bool = False) -> bytes:
    """The bytes of a regular file (:func:`open_regular`), refused (:class:`RunFileError`) when
    larger than ``max_bytes`` (default :data:`MAX_JSON_BYTES`); with ``tail`` its last
    ``max_bytes`` instead."""
    max_bytes = max_bytes or MAX_JSON_BYTES
    with open_regular(path, "rb", todo) as f:
        size = os.fstat(f.fileno()).st_size
        if tail and size > max_bytes:
            f.seek(size - max_bytes)
        elif size > max_bytes:
            raise RunFileError(path, f"is {size} bytes, more than the {max_bytes} such a file can hold", todo)
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes and not tail:  # it grew while being read
        raise RunFileError(path, f"is more than the {max_bytes} bytes such a file can hold", todo)
    return data[-max_bytes:] if tail else data


def json_depth_ok(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``obj`` (parsed JSON) nests at most ``limit`` containers deep (iterative)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            if d > limit:
                return False
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return True


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


def json_type(obj: Any) -> str:
    """``an object``, ``an array``, ... : what a parsed JSON value is, in words."""
    return _JSON_TYPES.get(type(obj), type(obj).__name__)


def parse_json(path: str | os.PathLike, data: bytes, expect: Optional[type] = dict,
               todo: Optional[str] = None) -> Any:
    """Decode ``data`` read from ``path`` as UTF-8 JSON of type ``expect`` (None: any),
    nested at most :data:`MAX_DEPTH` deep; :class:`RunFileError` naming ``path`` otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RunFileError(path, "is not UTF-8 text (a binary file?)", todo) from None
    try:
        obj = json.loads(text)
    except RecursionError:
        raise RunFileError(path, f"nests more than {MAX_DEPTH} levels deep", todo) from None
    except ValueError as e:
        raise RunFileError(path, f"is not valid JSON ({e})", todo) from None
    if not json_depth_ok(obj):
        raise RunFileError(path, f"nests more than {MAX_DEPTH} levels deep", todo)
    if expect is not None and not isinstance(obj, expect):
        want = _JSON_TYPES.get(expect, expect.__name__)
        raise RunFileError(path, f"holds {json_type(obj)} where {want} is expected", todo)
    return obj


def load_json(path: str | os.PathLike, expect: Optional[type] = dict, max_bytes: Optional[int] = None,
              todo: Optional[str] = None) -> Any:
    """The JSON value in ``path`` (an object unless ``expect`` says otherwise), read bounded
    (:func:`read_bytes_bounded`). FileNotFoundError when absent; :class:`RunFileError` (one
    line naming the file, ``todo`` what to do) when it is not a regular file, too large, not
    UTF-8 JSON, too deep or of another type; other OSErrors (permissions) as raised."""
    return parse_json(path, read_bytes_bounded(path, max_bytes, todo), expect, todo)


_warned: set = set()


def warn_once(message: str) -> None:
    """Log a warning once per process (readers that poll, like the sweep's live table, would
    repeat it every second)."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def save_torch(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` through a Python file object, so that a full disk is the
    ``OSError(ENOSPC)`` of the write (naming ``path``) rather than torch's RuntimeError
    ("unexpected pos ...", which names no cause); see :func:`harness.foundation.files.writing`."""
    import torch

    with writing(path):
        with open(path, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())


def _clean(v: Any) -> Any:
    if hasattr(v, "item") and callable(v.item):
        try:
            v = v.item()
        except Exception:
            pass
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


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


def read_json(path: str | os.PathLike, default: Any = None, expect: Optional[type] = dict) -> Any:
    """The JSON object in ``path`` (``expect``: another type, or None for any), else
    ``default``: when the file is absent (or a folder on its path is a file), and, with a warning naming the file, when it is not
    usable (:func:`load_json`: not a regular file, too large, not UTF-8 JSON, too deep, of
    another type). Other OSErrors (permissions) are raised."""
    try:
        return load_json(path, expect)
    except FileNotFoundError:
        return default
    except RunFileError as e:
        warn_once(f"{e.path}: {e.problem}: ignored")
        return default


def row_problem(row: dict, need_step: bool = False) -> Optional[str]:
    """Why a metrics row's budget counters cannot be used (None when they can): a counter that
    is present must be a finite, non-negative number (not a string, not a boolean), ``step``
    a whole one; ``need_step``: the row must have ``step``."""
    for c in COUNTERS:
        if c not in row:
            if c == STEP and need_step:
                return f"no {STEP!r} counter"
            continue
        v = row[c]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            return f"{c}={v!r} is not a non-negative number"
        if c == STEP and isinstance(v, float) and not v.is_integer():
            return f"{c}={v!r} is not a whole number"
    return None


def _jsonl_lines(path: str | os.PathLike, warn: bool = True, strict: bool = False,
                 valid: Optional[Callable[[dict], Optional[str]]] = None) -> Iterable[tuple[str, dict]]:
    """(raw line, object) for every line of a JSONL file that holds a JSON object. A torn
    line (a kill mid-write), a line that is valid JSON but not an object (``123``, ``[1]``,
    ``null``), one longer than :data:`MAX_ROW_BYTES` or nested deeper than :data:`MAX_DEPTH`,
    and one that ``valid(obj)`` finds a problem with, is skipped with one warning per file
    naming the line numbers. The file is opened with :func:`open_regular` (a FIFO or a device
    is never read): absent, nothing; not a regular file, :class:`RunFileError` with ``strict``,
    else a warning and nothing."""
    bad: list[int] = []
    why: list[str] = []
    try:
        f = open_regular(path, "rb", "delete it (or restore the run's own file) and re-run")
    except FileNotFoundError:
        return
    except RunFileError as e:
        if strict:
            raise
        if warn:
            warn_once(f"{e.path}: {e.problem}: not read")
        return
    with f:
        n = 0
        while True:
            raw = f.readline(MAX_ROW_BYTES + 1)
            if not raw:
                break
            n += 1
            if len(raw) > MAX_ROW_BYTES and not raw.endswith(b"\n"):
                while True:  # skip the rest of the over-long line
                    more = f.readline(MAX_ROW_BYTES)
                    if not more or more.endswith(b"\n"):
                        break
                bad.append(n)
                continue
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                bad.append(n)
                continue
            if not isinstance(obj, dict) or not json_depth_ok(obj):
                bad.append(n)
                continue
            problem = valid(obj) if valid is not None else None
            if problem:
                bad.append(n)
                why.append(problem)
                continue
            yield line, obj
    if bad and warn:
        shown = ", ".join(map(str, bad[:10])) + (" …" if len(bad) > 10 else "")
        reason = f" (e.g. {why[0]})" if why else ""
        log.warning("%s: skipped %d line(s) that are not JSON objects or not usable rows%s (line %s)",
                    path, len(bad), reason, shown)


def read_jsonl(path: str | os.PathLike, warn: bool = True, strict: bool = False) -> list[dict]:
    """Every JSON-object line of a JSONL file; torn and non-object lines are skipped with a
    warning (:func:`_jsonl_lines`; ``strict``: a file that is not a regular one raises)."""
    return [obj for _, obj in _jsonl_lines(path, warn, strict)]


def read_metrics(path: str | os.PathLike, warn: bool = True, strict: bool = False) -> list[dict]:
    """The rows of a metrics.jsonl: :func:`read_jsonl`, less the rows whose budget counters are
    not usable numbers (:func:`row_problem`, e.g. ``"step": "999"``), skipped with the warning."""
    return [obj for _, obj in _jsonl_lines(path, warn, strict, valid=row_problem)]


class MetricsWriter:
    """Append-only metrics.jsonl; each row flushed and fsynced so a kill loses nothing logged.
    A metrics.jsonl that is not a regular file (a FIFO would block the open) is refused with
    :class:`RunFileError`."""

    TODO = "delete it and re-run: the run resumes from its checkpoint, its rows up to then are lost"

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self._open()

    def _open(self) -> TextIO:
        check_regular(self.path, self.TODO)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags, 0o666)
        except OSError as e:
            if e.errno == errno.ENXIO:  # a FIFO that appeared since the check, no reader
                raise RunFileError(self.path, "is a FIFO, not a regular file", self.TODO) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RunFileError(self.path, f"is {_kind(st.st_mode)}, not a regular file", self.TODO)
            os.set_blocking(fd, True)
            return open(fd, "a")
        except BaseException:
            os.close(fd)
            raise

    def write(self, row: dict) -> dict:
        row = {k: _clean(v) for k, v in row.items()}
        row.setdefault("time", time.time())
        try:
            self._f.write(json.dumps(row) + "\n")
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as e:
            raise _named(e, self.path)
        return row

    def truncate_after(self, step: int) -> None:
        """On resume: drop rows logged after the checkpoint's step (they will be redone), and
        rows whose budget counters are not numbers or that have no ``step`` (:func:`row_problem`:
        a ``"step": "999"`` would otherwise survive every resume), with a warning."""
        self._f.close()
        keep = [line for line, r in _jsonl_lines(self.path, strict=True,
                                                  valid=lambda r: row_problem(r, need_step=True))
                if r[STEP] <= step]
        try:
            rewrite_atomic(self.path, lambda f: f.writelines(line + "\n" for line in keep))
        finally:
            self._f = self._open()

    def close(self) -> None:
        """Close the file; every row was flushed when written, so a flush that fails here is
        the row whose write already raised (disk full): not raised a second time."""
        if not self._f.closed:
            try:
                self._f.close()
            except OSError:
                pass
