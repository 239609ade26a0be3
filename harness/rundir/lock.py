"""Exclusive lock on a file (the ``filelock`` package), blocking, with a timeout or fail-fast,
recording who holds it.

The holder writes ``pid <pid> on <host>`` into the lock file once it has the lock, so a
process that fails to get it can say who has it (`LockBusy.holder`, `read_holder`). The
lock is advisory and per open file: a second `FileLock` on the same path conflicts even in
the same process. Releasing (or the holder dying) frees it; the file stays, with the last
holder's line in it. ``filelock`` uses ``flock`` on POSIX, ``msvcrt`` locking on Windows, and
a lock file's existence where a file system has no ``flock``, so locking is never silently
off.

    with file_lock(path):                      # wait for the lock
        ...
    lock = FileLock(path).acquire(blocking=False)   # LockBusy if someone has it
    lock = FileLock(path).acquire(timeout=30)       # LockBusy after 30 s
    ...
    lock.release()
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Optional

import filelock


class LockBusy(OSError):
    """An acquire that would not wait (or waited ``timeout`` seconds) found the lock held;
    ``holder`` is what the holder wrote ('' if nothing)."""

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
    `release` (alias `close`), or ``with`` (blocking unless ``blocking=False``; ``timeout``
    seconds at most when given)."""

    def __init__(self, path: str | os.PathLike, *, blocking: bool = True, timeout: Optional[float] = None):
        self.path = Path(path)
        self.blocking = blocking
        self.timeout = timeout
        self._lock: Optional[filelock.BaseFileLock] = None

    @property
    def held(self) -> bool:
        return self._lock is not None

    def acquire(self, blocking: Optional[bool] = None, timeout: Optional[float] = None) -> "FileLock":
        """Take the lock (waiting for it, at most ``timeout`` seconds when given, unless
        ``blocking`` is false) and record this process as the holder; `LockBusy` when it is
        not had."""
        if self._lock is not None:
            raise RuntimeError(f"{self.path} is already held by this FileLock")
        blocking = self.blocking if blocking is None else blocking
        timeout = self.timeout if timeout is None else timeout
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # one instance per acquire, not shared by path or thread: a second FileLock conflicts
        lock = filelock.FileLock(str(self.path), is_singleton=False, thread_local=False)
        try:
            lock.acquire(timeout=-1 if blocking and timeout is None else (timeout if blocking else 0))
        except filelock.Timeout:
            raise LockBusy(self.path, read_holder(self.path)) from None
        try:
            with open(self.path, "r+") as f:  # the lock is ours: no one else writes the line
                f.truncate()
                f.write(holder_line() + "\n")
        except BaseException:
            lock.release()
            raise
        self._lock = lock
        return self

    def holder(self) -> str:
        """The holder line currently in the lock file."""
        return read_holder(self.path)

    def release(self) -> None:
        """Free the lock (idempotent)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release(force=True)

    close = release

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def file_lock(path: str | os.PathLike, *, blocking: bool = True, timeout: Optional[float] = None) -> FileLock:
    """A `FileLock` to use as a context manager: ``with file_lock(p): ...``."""
    return FileLock(path, blocking=blocking, timeout=timeout)


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
