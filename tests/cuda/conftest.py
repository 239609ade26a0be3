"""Fixtures of the CUDA tests (marker ``cuda``; run them with ``pytest -m cuda tests/cuda``, or through
``python bench/gpu.py --all``, which records the counts).

Every test here takes the ``device`` fixture: ``cuda`` where ``torch.cuda.is_available()``, else the
test is skipped with that reason (so a CPU-only CI collects and skips them cleanly). Float32 matmuls
run at full precision (``torch.set_float32_matmul_precision("highest")``: no TF32), so a float32
CUDA result can be held to a CPU result within float rounding.

``GRPO_HARNESS_CUDA_TESTS_DEVICE=cpu`` runs the device-agnostic tests on the CPU instead: CPU
against CPU, which proves nothing about CUDA but checks the tests' own code (shapes, API calls,
tolerances that hold at least where the two sides agree exactly) on a machine without a GPU. Tests
that read CUDA's allocator (``torch.cuda.max_memory_allocated``) take ``cuda_only`` and skip there.
"""
from __future__ import annotations

import os

import pytest
import torch

DEVICE_ENV = "GRPO_HARNESS_CUDA_TESTS_DEVICE"


@pytest.fixture
def device():
    name = os.environ.get(DEVICE_ENV, "cuda")
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA: torch.cuda.is_available() is False")
    dev = torch.device(name)
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    try:
        yield dev
    finally:
        torch.set_float32_matmul_precision(prev)


@pytest.fixture
def cuda_only(device):
    if device.type != "cuda":
        pytest.skip(f"reads CUDA's allocator statistics: needs a CUDA device ({DEVICE_ENV}={device.type})")
    return device
