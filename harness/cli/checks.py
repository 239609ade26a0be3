"""Checks of the command line's own that the admission gate (:mod:`harness.admission.gate`) does not make: a folder to
read holds runs. Each raises a one-line ConfigError, exit 2 in :mod:`harness.cli.main`."""
from __future__ import annotations

import os
from pathlib import Path

from harness.foundation.base import ConfigError
from harness.rundir.read import find_run_dirs


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
