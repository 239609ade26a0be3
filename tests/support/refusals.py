"""The check every bad-input test makes: the `harness` command exits with one stderr line naming the problem,
no traceback, and leaves the folder it ran in as it was (nothing written, nothing removed)."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

from harness.cli.main import main


def listing(root: Path) -> set[str]:
    """Every path under ``root``, relative to it."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def refused(capsys, argv: list[str], must: str, root: Path, *, allowed: Iterable[str] = frozenset(), rc: int = 2,
            max_len: Optional[int] = None, max_seconds: Optional[float] = None,
            stdout: Optional[Callable[[str], object]] = None) -> str:
    """Run ``harness *argv``: it returns ``rc`` and prints one stderr line holding ``must`` and no traceback; nothing
    under ``root`` is added (but under the ``allowed`` paths) or removed. Optionally the line is at most ``max_len``
    characters, the command takes under ``max_seconds``, and ``stdout(out)`` makes the caller's checks of stdout.
    Returns the line."""
    before = listing(root)
    t0 = time.monotonic()
    got = main(argv)
    took = time.monotonic() - t0
    out, err = capsys.readouterr()
    assert got == rc, (argv, out, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert must in lines[0], (must, err)
    if max_len is not None:
        assert len(err) <= max_len, len(err)
    if max_seconds is not None:
        assert took < max_seconds, took
    if stdout is not None:
        stdout(out)
    after = listing(root)
    new = {p for p in after - before if not any(p == a or p.startswith(a + os.sep) for a in allowed)}
    assert not new, f"{argv} wrote {sorted(new)}"
    assert before <= after, f"{argv} removed {sorted(before - after)}"
    return lines[0]
