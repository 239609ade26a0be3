"""The benchmarks' FLOP counter counts CPU SDPA (torch 2.13 has no formula for it and counts 0)."""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from _common import FlopCount  # bench/ is on pytest's pythonpath (pyproject.toml)


def _sdpa_flops(backend):
    B, H, S, D = 2, 3, 5, 8
    q, k, v = (torch.randn(B, H, S, D, requires_grad=True) for _ in range(3))
    fc = FlopCount()
    fc.start()
    with sdpa_kernel([backend]):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()
    return fc.stop(), 2 * (2 * B * H * S * S * D)  # forward: Q·Kᵀ and P·V, two [S, D] x [D, S] matmuls per head


def test_one_cpu_sdpa_forward_and_backward_equal_the_hand_count():
    """SDPA's fused CPU kernel (native numerics): its backward does dV, dP, dQ, dK (4 matmuls) + the recomputed
    Q·Kᵀ; torch's math path (portable numerics: harness.foundation.portable_blas) keeps P and does the 4 only."""
    total, forward = _sdpa_flops(SDPBackend.FLASH_ATTENTION)
    assert total == forward + 2.5 * forward == 4800 + 12000
    total, forward = _sdpa_flops(SDPBackend.MATH)
    assert total == forward + 2 * forward == 4800 + 9600
