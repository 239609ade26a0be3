"""harness.engine.heap.release_freed_heap (issue 29.2d): glibc's malloc_trim(0) where glibc is the C library, a
no-op elsewhere and when switched off; fastlm calls it once after each recomputed layer's forward and once after
its backward, and the values and gradients are the same bits with it on or off."""
import platform

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from harness.engine import fastlm, heap


@pytest.fixture
def fresh_lookup():
    heap._malloc_trim.cache_clear()
    yield
    heap._malloc_trim.cache_clear()


def test_runs_and_returns_a_bool(monkeypatch, fresh_lookup):
    monkeypatch.setattr(heap, "RELEASE_FREED_HEAP", True)
    assert isinstance(heap.release_freed_heap(), bool)
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert heap._malloc_trim() is not None


def test_no_op_without_glibc(monkeypatch, fresh_lookup):
    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("", ""))
    assert heap._malloc_trim() is None
    assert heap.release_freed_heap() is False


def test_no_op_when_switched_off(monkeypatch):
    monkeypatch.setattr(heap, "RELEASE_FREED_HEAP", False)
    monkeypatch.setattr(heap, "_malloc_trim", lambda: pytest.fail("looked up while switched off"))
    assert heap.release_freed_heap() is False


def _forward_backward(model, batch):
    model.zero_grad()
    h = fastlm.completion_hidden(model, *batch)
    h.pow(2).sum().backward()
    return h.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_fastlm_releases_per_recomputed_layer_same_bits(monkeypatch, mode):
    conf = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(conf)
    g = torch.Generator().manual_seed(1)
    p_ids, c_ids = torch.randint(3, 50, (4, 5), generator=g), torch.randint(3, 50, (4, 7), generator=g)
    batch = (p_ids, torch.ones_like(p_ids), c_ids, torch.ones_like(c_ids))
    calls = []
    monkeypatch.setattr(fastlm, "release_freed_heap", lambda: calls.append(1) or False)
    monkeypatch.setattr(fastlm, "RECOMPUTE", mode)
    monkeypatch.setattr(fastlm, "RECOMPUTE_BUDGET_BYTES", float("inf"))

    monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", float("inf"))  # nothing recomputed: no call
    ref = _forward_backward(model, batch)
    assert calls == []

    monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", 0)  # every layer recomputed: one call each way
    got = _forward_backward(model, batch)
    assert len(calls) == 2 * conf.num_hidden_layers
    monkeypatch.setattr(fastlm, "release_freed_heap", heap.release_freed_heap)  # the real trim
    monkeypatch.setattr(heap, "RELEASE_FREED_HEAP", True)
    real = _forward_backward(model, batch)
    with torch.no_grad():
        fastlm.completion_hidden(model, *batch)  # no autograd: nothing recomputed, no call
    assert len(calls) == 2 * conf.num_hidden_layers
    for out in (got, real):
        assert torch.equal(out[0], ref[0])
        assert len(out[1]) == len(ref[1]) and all(torch.equal(a, b) for a, b in zip(out[1], ref[1]))


_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# A child process: one 256 KiB block malloc'd and freed (glibc then raises its mmap threshold above 256 KiB),
# then 400 more written to, and all but the last freed; prints the resident KiB this left behind.
_RETAINED = r"""
import ctypes, ctypes.util, os, sys
sys.path.insert(0, {root!r})
from harness.engine import heap
print("set", heap.limit_heap_retention({kib}))
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
n = 256 * 1024
libc.free(libc.malloc(n))
before = rss()
blocks = [libc.malloc(n) for _ in range(400)]
for b in blocks:
    ctypes.memset(b, 1, n)
for b in blocks[:-1]:
    libc.free(b)
print("kept", rss() - before)
"""


def _retained_kib(kib: int) -> tuple[str, int]:
    import pathlib
    import subprocess
    import sys

    root = str(pathlib.Path(heap.__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", _RETAINED.format(root=root, kib=kib)], capture_output=True,
                         text=True, check=True).stdout.split("\n")
    return out[0], int(out[1].split()[1])


@pytest.mark.skipif(not _GLIBC, reason="glibc's mallopt")
def test_limit_heap_retention_returns_freed_blocks():
    """With glibc's defaults the 399 freed blocks (about 100 MiB) stay resident below the last one; with a 64 KiB
    threshold each was its own mapping and left with its free."""
    said, kept = _retained_kib(0)
    assert said == "set False" and kept > 90 * 1024
    said, kept = _retained_kib(64)
    assert said == "set True" and kept < 2 * 1024


def test_limit_heap_retention_no_op_without_glibc(monkeypatch):
    monkeypatch.setattr(heap, "_mallopt", lambda: None)
    assert heap.limit_heap_retention(64) is False
    monkeypatch.setattr(heap, "_mallopt", lambda: pytest.fail("looked up for 0"))
    assert heap.limit_heap_retention(0) is False
