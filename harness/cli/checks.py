"""Checks the command line makes before any work starts (each raises a one-line ConfigError,
exit 2 in :mod:`harness.cli.main`): the machine has the device asked for, output
directories are directories and writable, folders to read hold runs."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from harness.config.base import ConfigError
from harness.rundir.read import find_run_dirs


def check_device(device: str, field: str = "device") -> None:
    """``cuda`` / ``cuda:N`` only where CUDA is available (and device N exists)."""
    if not str(device).startswith("cuda"):
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


def _existing_ancestor(p: Path) -> Path:
    a = p
    while not a.exists() and not a.is_symlink() and a != a.parent:
        a = a.parent
    return a


def check_output_dir(path: str | os.PathLike, field: str) -> Path:
    """``path`` is (or can become) a writable directory: not a file, nor under one; created if
    missing and probed with a temporary file (removed). Returns it."""
    p = Path(path).expanduser()
    a = _existing_ancestor(p)
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
