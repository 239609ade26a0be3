"""Shared fixtures. Tests read real data from ../shared/data (never from a hub)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

from harness.foundation import numerics

# Portable numerics in the test process and every process it starts, before torch runs a kernel:
# a test never depends on a value that the CPU kind can change (harness/foundation/numerics.py).
numerics.pin_process("portable")

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GRPO_HARNESS_DATA", ROOT.parent / "shared" / "data"))

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
numerics.enter("portable", 1)  # one thread; matrix products in portable_blas for every test, whatever ran before

# A shell starts background jobs with SIGINT ignored, and children inherit that: the Ctrl-C tests
# (sweep, `harness ui`) would then send a signal their subprocess never sees. Give this process a
# handler, so that subprocesses start with the default disposition however pytest was launched.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA.exists():
        pytest.skip(f"shared data not found at {DATA} (set GRPO_HARNESS_DATA)")
    return DATA


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory) -> Path:
    """One warm-up cache for the whole session (tests share the starting checkpoint), shared by the
    test processes of a parallel run (pytest-xdist): the cache's lock makes the second builder of an
    entry wait for the first and read it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    path = base / "warmup_cache"
    path.mkdir(exist_ok=True)
    return path
