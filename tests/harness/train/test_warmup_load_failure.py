"""A warm-up cache entry that fails to load for a reason of the machine (memory, threads, a library that does not
import) is not called broken: one line without the advice to delete it, and the entry is kept; a broken entry
still gets that advice."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.config.schema import load_config
from harness.foundation.errors import ModelLoadError
from harness.rundir.layout import RunFileError
from harness.train import warmup as wu

ROOT = Path(__file__).resolve().parents[3]


def _start(monkeypatch, tmp_path, error: BaseException):
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "model.safetensors").write_bytes(b"kept")
    monkeypatch.setattr(wu, "ensure_warmup", lambda cfg, task, device, progress: (entry, {}))

    def load_policy(path, *a, **k):
        raise error

    monkeypatch.setattr(wu, "load_policy", load_policy)
    cfg = load_config(str(ROOT / "harness" / "configs" / "quickstart.yaml"), [f"warmup.cache_dir={tmp_path}"])
    return entry, lambda: wu.starting_checkpoint(cfg, None, "cpu", progress=False)


@pytest.mark.parametrize("error", [
    MemoryError(),
    ImportError("numpy: OpenBLAS blas_thread_init: pthread_create failed for thread 5 of 100000"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you tried to "
                 "allocate 1099511627776 bytes"),
    OSError(11, "Resource temporarily unavailable"),
], ids=["memory", "import", "allocator", "eagain"])
def test_a_machine_failure_keeps_the_entry_and_gives_no_delete_advice(monkeypatch, tmp_path, error):
    entry, start = _start(monkeypatch, tmp_path, error)
    with pytest.raises(ModelLoadError) as e:
        start()
    msg = str(e.value)
    assert "\n" not in msg and "delete" not in msg and "it is kept" in msg and str(entry) in msg
    assert type(error).__name__ in msg
    assert (entry / "model.safetensors").read_bytes() == b"kept"


def test_a_broken_entry_still_says_to_delete_it(monkeypatch, tmp_path):
    entry, start = _start(monkeypatch, tmp_path, ValueError("Error while deserializing header: HeaderTooLarge"))
    with pytest.raises(RunFileError) as e:
        start()
    assert "delete this folder" in str(e.value) and "HeaderTooLarge" in str(e.value)
