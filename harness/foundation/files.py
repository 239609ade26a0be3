"""Files and folders as every package writes them: whether a path can be a writable folder, a full disk however it surfaces, and atomic rewrites.

:func:`dir_problem` is the check a command makes of an output folder before it writes anything, and
:func:`check_output_dir` / :func:`check_output_files` the admission gate's (a one-line ConfigError, the folder
created and probed);
:func:`disk_error` finds the full disk (ENOSPC / EDQUOT) behind torch's and safetensors' errors, and
:func:`writing` raises it as an ``OSError`` naming the file; :func:`rewrite_atomic` (and
:func:`write_text_atomic`, :func:`write_json_atomic`) replaces a file through a temporary one, so a
failure never leaves half of it. The run directory's own layout and readers are
:mod:`harness.rundir.layout`. Imports nothing of the project outside the foundation.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Optional

from harness.foundation.base import ConfigError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
"""errnos of a full disk or quota."""
NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)
"""errnos of a file or disk that may not be written (permissions, a read-only mount)."""


def existing_ancestor(p: Path) -> Path:
    """The nearest of ``p`` and its parents that exists (or is a link, dangling or not)."""
    a = p
    while not os.path.lexists(a) and a != a.parent:
        a = a.parent
    return a


def dir_problem(path: str | os.PathLike) -> str:
    """Why ``path`` cannot be (made) a writable folder, found without creating it ('' when it can): it
    is a file or under one (or a dangling link), or its nearest existing folder takes no new entry
    (probed with a temporary folder, removed at once: nothing is left behind). The check a command
    makes of an output folder before it writes anything (``--dry-run`` included)."""
    p = Path(path).expanduser()
    a = existing_ancestor(p)
    if os.path.lexists(a) and not a.is_dir():
        where = "is" if a == p else f"is under {a}, which is"
        if a.is_symlink() and not a.exists():
            return f"{where} a symbolic link to {os.readlink(a)}, which does not exist"
        return f"{where} a file, not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(dir=a, prefix=".write-probe-"))
    except OSError as e:
        return f"not a writable directory ({e.strerror or e})"
    return ""


def _inside(real: Path, root_real: Path) -> bool:
    return real == root_real or root_real in real.parents


def outside_problem(p: Path, root_real: Path) -> Optional[str]:
    """Why ``p`` is not inside ``root_real`` once every symlink on its way is resolved (None when it is)."""
    try:
        real = p.resolve()  # every symlink on the way, the file's own included
    except (OSError, RuntimeError) as e:  # a symlink loop
        return f"it cannot be resolved ({e})"
    if not _inside(real, root_real):
        return f"it resolves to {real}, outside {root_real}; links out of the folder are never followed"
    return None


def regular_inside_problem(path: str | os.PathLike, root: str | os.PathLike) -> Optional[str]:
    """Why the file ``path`` may not be read as part of the folder ``root`` to be copied or uploaded
    elsewhere (None when it may): it resolves outside ``root`` (a symlink, or a symlinked folder on
    its way), or it is not a regular file. The one rule of `harness sync`, live tracking, the report
    upload and `harness export`: a link to a secret is never copied out."""
    p, root_real = Path(path), Path(root).resolve()
    why = outside_problem(p, root_real)
    if why:
        return why
    try:
        mode = os.stat(p).st_mode
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    if not stat.S_ISREG(mode):
        return "it is not a regular file"
    return None


def link_on_the_way(path: str | os.PathLike, root: str | os.PathLike) -> Optional[Path]:
    """The first symbolic link among the existing components of ``path`` below ``root`` (``path``
    itself included), or None: a write there would go through it, somewhere else."""
    p, r = Path(path), Path(root)
    cur = r
    for part in p.relative_to(r).parts:
        cur = cur / part
        if cur.is_symlink():
            return cur
        if not os.path.lexists(cur):
            return None
    return None


_NO_SPACE_TEXT = re.compile(r"no space left on device|disk quota exceeded|os error (28|122)\b|errno (28|122)\b",
                            re.IGNORECASE)


def disk_error(exc: BaseException) -> Optional[OSError]:
    """The full-disk OSError (ENOSPC / EDQUOT) behind ``exc``, or None. ``torch.save`` and
    safetensors report a full disk as a RuntimeError / SafetensorError whose text (or whose
    ``__cause__`` / ``__context__``) carries it; those are turned into an ``OSError(ENOSPC)``."""
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return e
        if not isinstance(e, OSError) and _NO_SPACE_TEXT.search(str(e)):
            quota = re.search(r"quota|122", str(e), re.IGNORECASE)
            code = errno.EDQUOT if quota else errno.ENOSPC
            return OSError(code, os.strerror(code))
        e = e.__cause__ or e.__context__
    return None


def _named(e: OSError, path: str | os.PathLike) -> OSError:
    """``e`` naming ``path`` when it names no file (a write through a file object)."""
    if not e.filename:
        e.filename = str(path)
    return e


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Around a write of ``path``: a full disk however it surfaces (an OSError, or torch's /
    safetensors' RuntimeError) is raised as ``OSError(ENOSPC or EDQUOT)`` naming ``path`` (chained
    to the original), and an OSError that names no file gets ``path`` (the CLI's one line names it)."""
    try:
        yield
    except OSError as e:
        raise _named(e, path)
    except Exception as e:
        full = disk_error(e)
        if full is None:
            raise
        raise OSError(full.errno, full.strerror, str(path)) from e


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


def rewrite_atomic(path: str | os.PathLike, write: Callable[[IO], None], binary: bool = False) -> None:
    """Replace ``path`` with what ``write(f)`` writes, atomically: into a temporary file in
    the same directory, flushed and fsynced, then ``os.replace``d over ``path`` (and the
    directory fsynced). If ``write`` (or the disk) fails, ``path`` is untouched and the
    temporary file is removed. Every rewrite of a run file goes through here. ``binary``:
    ``f`` takes bytes."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:  # a read-only or full folder: name the file being written
        e.filename = str(path)
        raise
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and (not e.filename or e.filename == tmp):
            e.filename = str(path)  # the file being rewritten, not its random temporary name
        raise
    _fsync_dir(path.parent)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """``Path(path).write_text(text)``, atomically (:func:`rewrite_atomic`)."""
    rewrite_atomic(path, lambda f: f.write(text))


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    text = json.dumps(obj, indent=2, default=str)
    write_text_atomic(path, text)


def check_output_dir(path: str | os.PathLike, field: str) -> Path:
    """``path`` is (or can become) a writable directory: not a file, nor under one; created if
    missing and probed with a temporary file (removed). Returns it."""
    p = Path(path).expanduser()
    a = existing_ancestor(p)
    if a.exists() and not a.is_dir():
        where = "is a file" if a == p else f"is under {a}, which is a file"
        raise ConfigError(f"{field}={str(path)!r} is invalid: {where}, not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{field}={str(path)!r} is invalid: not a writable directory "
                          f"({e.strerror or e})") from None
    return p


def new_folders(path: str | os.PathLike) -> list[Path]:
    """The folders `check_output_dir` would create for ``path`` (the missing ones, deepest first):
    what :func:`remove_new_folders` takes away again when the command is refused after the check."""
    p = Path(path).expanduser()
    a = existing_ancestor(p)
    out = []
    while p != a and p != p.parent:
        out.append(p)
        p = p.parent
    return out


def remove_new_folders(folders: list[Path]) -> None:
    """Remove the folders :func:`new_folders` listed, where they are still empty (deepest first)."""
    for f in folders:
        try:
            f.rmdir()
        except OSError:
            return


def check_output_files(folder: str | os.PathLike, names: Iterable[str], field: str) -> None:
    """The files a command will write into ``folder`` (already checked with `check_output_dir`)
    can be written there at the end: none of them is a directory or another non-file, and one
    that exists may be written. Checked before the work, so the work is not lost to a path."""
    for name in names:
        f = Path(folder).expanduser() / name
        if f.is_dir():
            raise ConfigError(f"{field}={str(folder)!r} is invalid: {f} is a directory where the result file "
                              f"{name} goes: move it away or choose another folder")
        if f.exists() and not f.is_file():
            raise ConfigError(f"{field}={str(folder)!r} is invalid: {f} is not a regular file (the result file "
                              f"{name} goes there): move it away or choose another folder")
        if f.is_file() and not os.access(f, os.W_OK):
            raise ConfigError(f"{field}={str(folder)!r} is invalid: {f} exists and may not be written (the result "
                              f"file {name} replaces it): make it writable or choose another folder")


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 (hex) of one file's bytes, read in 1 MiB chunks (a cache entry's files, recorded beside it)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
