"""``train/kl`` is the same per-token KL to the reference for every algorithm that holds one (GRPO: KL in
the loss, PPO: KL in the reward), so KL curves overlay; each algorithm's own KL figure is an extra."""
import copy

import pytest
import torch

from algorithms.losses import kl_k3
from algorithms.presets import resolve
from harness.config.schema import ModelConfig, load_config
from harness.engine.learner import Learner, ValueModel, make_batch, token_logprobs
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.perf import PerfTracker
from harness.engine.sampling import sample

SMALL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
EXTRA = {"grpo": "train/kl_loss", "ppo": "train/kl_reward_penalty"}


def one_step(algorithm: str, ref_noise: float):
    """One update of ``algorithm`` on a fixed batch, against a reference perturbed by ``ref_noise``.
    Returns (metrics, the hand-computed mean per-token k3 KL of the sampling policy to the reference)."""
    tok = build_char_tokenizer()
    policy = build_tiny_model(SMALL, tok, seed=1)
    ref = copy.deepcopy(policy).requires_grad_(False)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(ref_noise * torch.randn(p.shape, generator=g))
    cfg = load_config(None, [f"algorithm={algorithm}", "train.micro_batch_size=3"])
    ro = sample(policy, tok, ["Q:1+2\nA:", "Q:3*4-1\nA:"], n=4, max_new_tokens=10, seed=3)
    b = make_batch(ro, "cpu")
    with torch.no_grad():
        expected = ((kl_k3(token_logprobs(policy, b), token_logprobs(ref, b)) * b.mask).sum() / b.mask.sum()).item()
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    algo = resolve(cfg.algorithm)
    critic = ValueModel(copy.deepcopy(policy)) if algo.critic else None
    m = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref, critic=critic).step(ro, rewards, [], 0)
    return m, expected


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_train_kl_is_the_mean_per_token_kl_to_the_reference(algorithm):
    m, expected = one_step(algorithm, ref_noise=0.05)
    assert expected > 1e-4
    assert m["train/kl"] == pytest.approx(expected, rel=1e-4, abs=1e-7)
    assert EXTRA[algorithm] in m  # the algorithm-specific figure stays, under its own name
    assert all(k not in m for k in EXTRA.values() if k != EXTRA[algorithm])


def test_grpo_and_ppo_log_the_same_kl_on_the_same_batch():
    (g, _), (p, _) = one_step("grpo", 0.05), one_step("ppo", 0.05)
    assert g["train/kl"] == pytest.approx(p["train/kl"], rel=1e-4)
    (g0, _), (p0, _) = one_step("grpo", 0.0), one_step("ppo", 0.0)
    assert abs(g0["train/kl"]) < 1e-6 and abs(p0["train/kl"]) < 1e-6  # reference = policy: no KL


def test_rft_without_reference_logs_no_kl():
    tok = build_char_tokenizer()
    policy = build_tiny_model(SMALL, tok, seed=1)
    cfg = load_config(None, ["algorithm=rft"])
    ro = sample(policy, tok, ["Q:1+2\nA:"], n=4, max_new_tokens=10, seed=3)
    m = Learner(policy, resolve(cfg.algorithm), cfg, "cpu", PerfTracker()).step(ro, torch.tensor([1.0, 0, 0, 1]), [], 0)
    assert "train/kl" not in m
