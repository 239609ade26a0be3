"""Exclusive lock on a file (``flock``), blocking or fail-fast, recording who holds it.

The holder writes ``pid <pid> on <host>`` into the lock file once it has the lock, so a
process that fails to get it can say who has it (`LockBusy.holder`, `read_holder`). The
lock is advisory and per open file: a second `FileLock` on the same path conflicts even in
the same process. Releasing (or the holder dying) frees it; the file stays, with the last
holder's line in it. Where ``fcntl`` is missing (not POSIX) locking is a no-op.

    with file_lock(path):                      # wait for the lock
        ...
    lock = FileLock(path).acquire(blocking=False)   # LockBusy if someone has it
    ...
    lock.release()
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import IO, Optional

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]


class LockBusy(OSError):
    """A non-blocking acquire found the lock held; ``holder`` is what the holder wrote ('' if nothing)."""

    def __init__(self, path: Path, holder: str):
        self.path, self.holder = Path(path), holder
        super().__init__(f"{path} is locked by {holder or 'pid unknown'}")


def holder_line() -> str:
    """What a holder writes into the lock file: ``pid <pid> on <host>``."""
    host = os.uname().nodename if hasattr(os, "uname") else socket.gethostname()
    return f"pid {os.getpid()} on {host}"


def read_holder(path: str | os.PathLike) -> str:
    """The holder line recorded in a lock file ('' if none or unreadable)."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


class FileLock:
    """An exclusive lock on ``path`` (parent directories are created). Use `acquire` /
    `release` (alias `close`), or ``with`` (blocking unless ``blocking=False``)."""

    def __init__(self, path: str | os.PathLike, *, blocking: bool = True):
        self.path = Path(path)
        self.blocking = blocking
        self._f: Optional[IO[str]] = None

    @property
    def held(self) -> bool:
        return self._f is not None

    def acquire(self, blocking: Optional[bool] = None) -> "FileLock":
        """Take the lock (waiting for it unless ``blocking`` is false: then raise `LockBusy`)
        and record this process as the holder."""
        if self._f is not None:
            raise RuntimeError(f"{self.path} is already held by this FileLock")
        blocking = self.blocking if blocking is None else blocking
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")
        if fcntl is not None:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except OSError:
                f.seek(0)
                holder = f.read().strip()
                f.close()
                if blocking:
                    raise
                raise LockBusy(self.path, holder) from None
        f.seek(0)
        f.truncate()
        f.write(holder_line() + "\n")
        f.flush()
        self._f = f
        return self

    def holder(self) -> str:
        """The holder line currently in the lock file."""
        return read_holder(self.path)

    def release(self) -> None:
        """Free the lock (idempotent)."""
        f, self._f = self._f, None
        if f is None:
            return
        try:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_UN)
        finally:
            f.close()

    close = release

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def file_lock(path: str | os.PathLike, *, blocking: bool = True) -> FileLock:
    """A `FileLock` to use as a context manager: ``with file_lock(p): ...``."""
    return FileLock(path, blocking=blocking)


# --------------------------------------------------------------------------- one writer per run directory

RUN_LOCK = ".run.lock"  # inside the run directory; held by the trainer for the whole run


class RunBusy(RuntimeError):
    """Another trainer holds a run directory's lock (the message names its pid and host)."""


def lock_run_dir(run_dir: str | os.PathLike) -> FileLock:
    """Take the run directory's exclusive lock without waiting, for the whole training: two
    trainers on one run would both "finish" and interleave their metrics rows. Raises
    `RunBusy` naming the holder (``pid <pid> on <host>``). Release with ``.release()``."""
    path = Path(run_dir) / RUN_LOCK
    try:
        return FileLock(path).acquire(blocking=False)
    except LockBusy as e:
        raise RunBusy(f"another trainer is writing {Path(run_dir)} ({e.holder or 'pid unknown'}); "
                      f"wait for it to end or stop it first") from None
