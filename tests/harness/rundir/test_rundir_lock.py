"""harness.rundir.lock: exclusive, blocking or fail-fast, holder recorded and read back."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.rundir.lock import FileLock, LockBusy, file_lock, holder_line, read_holder


def test_fail_fast_names_the_holder_and_frees_on_release(tmp_path):
    path = tmp_path / "sub" / "x.lock"
    first = FileLock(path).acquire()
    assert read_holder(path) == holder_line() == f"pid {os.getpid()} on {os.uname().nodename}"
    with pytest.raises(LockBusy) as e:
        FileLock(path).acquire(blocking=False)
    assert e.value.holder == holder_line() and str(os.getpid()) in str(e.value)
    first.close()
    with file_lock(path, blocking=False) as again:
        assert again.held
    assert not again.held


def test_blocking_waits_for_another_process(tmp_path):
    path = tmp_path / "x.lock"
    code = ("import sys, time; from harness.rundir.lock import file_lock\n"
            "with file_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(1.0)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(LockBusy, match=f"pid {p.pid} "):
        FileLock(path).acquire(blocking=False)
    t0 = time.monotonic()
    with file_lock(path):
        waited = time.monotonic() - t0
    p.wait(timeout=30)
    assert waited > 0.3


def test_timeout_gives_up_with_the_holder_and_the_file_keeps_the_last_holder(tmp_path):
    import time
    path = tmp_path / "x.lock"
    held = FileLock(path).acquire()
    t = time.monotonic()
    with pytest.raises(LockBusy) as e:
        FileLock(path, timeout=0.3).acquire()
    waited = time.monotonic() - t
    assert 0.25 <= waited < 5, waited
    assert e.value.holder == holder_line()
    held.release()
    assert read_holder(path) == holder_line()  # released, the line stays
    with file_lock(path, timeout=0.3):  # free again: no wait
        assert read_holder(path) == holder_line()

