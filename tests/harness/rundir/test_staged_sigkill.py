"""A result folder written through `harness.rundir.outputs.staged` survives a real SIGKILL (issue 48, item 7):
killed while the new result is being written, the old one is untouched and the next write replaces it whole;
killed between the two renames that publish it, the old result is hidden beside the folder and the next write
puts it back before anything else. The writer is a separate Python process killed with SIGKILL at a point it
announces, so no ``finally`` or signal handler runs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.rundir.outputs import recover, staged
from support_paths import REPO

WRITER = r"""
import os, sys, time
from pathlib import Path
from harness.rundir import outputs
dest, where, ready = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
def park():
    ready.write_text("parked")
    time.sleep(600)
if where == "between-renames":
    real = os.replace
    calls = []
    def replace(a, b):
        real(a, b)
        calls.append(b)
        if len(calls) == 1:  # the old result moved aside, the new one not yet in place
            park()
    outputs.os.replace = replace
with outputs.staged(dest) as stage:
    (stage / "a.txt").write_text("new, half")
    if where == "writing":
        park()
    (stage / "b.txt").write_text("new")
"""


def _killed_writer(dest: Path, where: str, tmp_path: Path) -> None:
    ready = tmp_path / f"ready-{where}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(dest), where, str(ready)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, f"the writer exited ({proc.returncode}) before it parked"
            assert time.monotonic() < deadline, "the writer never parked"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def old(tmp_path):
    dest = tmp_path / "results" / "out"
    dest.mkdir(parents=True)
    (dest / "a.txt").write_text("old")
    return dest


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_killed_while_writing_leaves_the_old_result_and_the_next_write_replaces_it_whole(old, tmp_path):
    _killed_writer(old, "writing", tmp_path)
    assert _names(old) == ["a.txt"] and (old / "a.txt").read_text() == "old"
    left = [n for n in _names(old.parent) if n != "out"]
    assert len(left) == 1 and left[0].startswith(".out.tmp-")  # the hidden stage, never the result's name
    with staged(old) as stage:
        (stage / "a.txt").write_text("new")
        (stage / "b.txt").write_text("new")
    assert _names(old) == ["a.txt", "b.txt"] and (old / "a.txt").read_text() == "new"


def test_killed_between_the_renames_the_next_write_puts_the_old_result_back_first(old, tmp_path):
    _killed_writer(old, "between-renames", tmp_path)
    assert not old.exists()  # the old result was moved aside, the new one never arrived
    hidden = [n for n in _names(old.parent) if n.startswith(".out.old-")]
    assert len(hidden) == 1 and (old.parent / hidden[0] / "out" / "a.txt").read_text() == "old"
    with pytest.raises(OSError):
        with staged(old) as stage:  # the next write fails (a full disk): the old result is back all the same
            raise OSError(28, "No space left on device")
    assert _names(old) == ["a.txt"] and (old / "a.txt").read_text() == "old"
    assert not [n for n in _names(old.parent) if n.startswith(".out.old-")]
    with staged(old) as stage:
        (stage / "b.txt").write_text("new")
    assert _names(old) == ["b.txt"]


def test_recover_leaves_a_folder_that_exists_alone(old):
    aside = old.parent / ".out.old-x" / "out"
    aside.mkdir(parents=True)
    (aside / "a.txt").write_text("older")
    assert recover(old) is None and (old / "a.txt").read_text() == "old"
