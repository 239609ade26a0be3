"""Checks the command line makes before any work starts (each raises a one-line ConfigError,
exit 2 in :mod:`harness.cli.main`): a device is spelled as the config's ``device`` is and the
machine has it, thread counts stay within what the thread pools can start, output directories
(and the files to be written there) are writable, folders to read hold runs."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from harness.config.rules import DEVICE, MAX_THREADS, THREADS_OR_DEFAULT  # the config's rules, one for all commands
from harness.foundation import numerics  # no torch: numerics imports it where it needs it
from harness.foundation.base import ConfigError
from harness.foundation.files import existing_ancestor
from harness.rundir.read import find_run_dirs


def device_problem(device, field: str = "device") -> Optional[str]:
    """Why ``device`` is not a device the harness takes (the config's ``device`` rule,
    :data:`harness.config.rules.DEVICE`: auto, cpu, cuda, cuda:N), as a one-line message; None when it is one."""
    return DEVICE.problem(field, device)


def check_device(device: str, field: str = "device") -> None:
    """``device`` spelled as :func:`device_problem` says; ``cuda`` / ``cuda:N`` only where CUDA is
    available (and device N exists)."""
    bad = device_problem(device, field)
    if bad:
        raise ConfigError(bad)
    if not device.startswith("cuda"):
        return
    import torch  # only for a CUDA device: `--help` and argument errors stay free of torch

    if not torch.cuda.is_available():
        raise ConfigError(f"{field}={device!r} is invalid: CUDA is not available on this machine; "
                          f"use cpu or auto")
    if ":" in device:
        idx, n = int(device.split(":", 1)[1]), torch.cuda.device_count()
        if idx >= n:
            raise ConfigError(f"{field}={device!r} is invalid: this machine has {n} CUDA device(s) "
                              f"(cuda:0..cuda:{n - 1})")


def threads_problem(threads: int, mode: str, field: str) -> Optional[str]:
    """Why the torch thread count a command would run with breaks the config's ``train.threads`` rule
    (:data:`harness.config.rules.THREADS_OR_DEFAULT`: 0 to `MAX_THREADS`), as a one-line message
    naming where it came from (``field``, or OMP_NUM_THREADS when ``field`` is 0 and portable
    numerics take the environment's: :func:`harness.foundation.numerics.resolve_threads`); None when it
    is fine."""
    bad = THREADS_OR_DEFAULT.problem(field, threads)
    if bad:
        return bad
    n = numerics.resolve_threads(threads, mode)
    if not THREADS_OR_DEFAULT.ok(n):
        return (f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} is invalid: with {field}=0, {mode} numerics "
                f"run that many torch threads; at most {MAX_THREADS:,}: set it lower or give {field}")
    return None


def check_threads(threads: int, mode: str, field: str) -> None:
    """Raise a one-line ConfigError when :func:`threads_problem` finds one."""
    bad = threads_problem(threads, mode, field)
    if bad:
        raise ConfigError(bad)


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


def check_runs_folder(path: str | os.PathLike, field: str) -> list[Path]:
    """``path`` is a directory holding at least one run directory; returns them."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{field}={str(path)!r} is invalid: no such directory")
    if not p.is_dir():
        raise ConfigError(f"{field}={str(path)!r} is invalid: not a directory")
    runs = find_run_dirs(p, skip_unreadable=False)  # presence only: a broken run still counts
    if not runs:
        raise ConfigError(f"{field}={str(path)!r} is invalid: no run directories under it "
                          f"(a run directory holds metrics.jsonl or summary.json)")
    return runs
