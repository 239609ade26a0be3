"""The benchmarks' FLOP counter counts CPU SDPA (torch 2.13 has no formula for it and counts 0)."""
import torch

from _common import FlopCount  # bench/ is on pytest's pythonpath (pyproject.toml)


def test_one_cpu_sdpa_forward_and_backward_equal_the_hand_count():
    B, H, S, D = 2, 3, 5, 8
    q, k, v = (torch.randn(B, H, S, D, requires_grad=True) for _ in range(3))
    fc = FlopCount()
    fc.start()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()
    total = fc.stop()
    forward = 2 * (2 * B * H * S * S * D)  # Q·Kᵀ and P·V: two [S, D] x [D, S] matmuls per head
    backward = 2.5 * forward             # dV, dP, dQ, dK (4 matmuls) + the recomputed Q·Kᵀ
    assert total == forward + backward == 4800 + 12000
