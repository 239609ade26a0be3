"""The shared learner: micro-batching is exact, mu=1 costs no extra forward, reference reset."""
import contextlib
import copy

import pytest
import torch

from algorithms.presets import resolve
from harness.engine import fastlm
from harness.config.schema import ModelConfig, load_config
from harness.engine.learner import Learner, ValueModel, make_batch, token_logprobs
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.perf import PerfTracker
from harness.engine.sampling import sample

SMALL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def setup(overrides):
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    policy = build_tiny_model(SMALL, tok, seed=1)
    cfg = load_config(None, overrides)
    algo = resolve(cfg.algorithm)
    ref = copy.deepcopy(policy).requires_grad_(False) if algo.uses_reference else None
    ro = sample(policy, tok, ["Q:1+2\nA:", "Q:3*4-1\nA:"], n=4, max_new_tokens=10, seed=3)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    return tok, policy, ref, cfg, algo, ro, rewards


def count_forwards(model):
    """Forward passes of ``model``, through transformers' forward or harness.engine.fastlm's."""
    calls = {"n": 0}
    model.register_forward_pre_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    fast = fastlm.completion_hidden

    def counted(m, *a, **kw):
        if m is model:
            calls["n"] += 1
        return fast(m, *a, **kw)
    fastlm.completion_hidden = counted
    calls["restore"] = lambda: setattr(fastlm, "completion_hidden", fast)
    return calls


def test_micro_batches_give_the_full_batch_gradient():
    # (compare accumulated gradients: Adam's first step is ~lr*sign(g), which would amplify rounding)
    grads = []
    for mb in (8, 3):
        _, policy, ref, cfg, algo, ro, rewards = setup([f"train.micro_batch_size={mb}", "train.max_grad_norm=0"])
        learner = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref)
        step = learner.opt.step  # the gradients as the optimizer sees them (freed right after)
        learner.opt.step = lambda: (grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()])), step())
        learner.step(ro, rewards, [], 0)
        assert all(p.grad is None for p in policy.parameters())  # not held until the next step
    assert grads[0].abs().max() > 1e-4
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("fast", [True, False], ids=["fastlm", "transformers"])
def test_mu_one_runs_no_extra_policy_forward(fast):
    with (contextlib.nullcontext() if fast else fastlm.disabled()):
        _, policy, ref, cfg, algo, ro, rewards = setup(["train.micro_batch_size=4"])
        assert fastlm.supported(policy) == fast
        pol, rf = count_forwards(policy), count_forwards(ref)
        try:
            Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref).step(ro, rewards, [], 0)
        finally:
            rf["restore"](), pol["restore"]()
        assert (pol["n"], rf["n"]) == (2, 2)  # 2 micro-batches: one policy pass (with grad), one reference pass
        for reuse in (True, False):
            _, policy, ref, cfg, algo, ro, rewards = setup(["train.micro_batch_size=4", "train.inner_epochs=2"])
            pol = count_forwards(policy)
            learner = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref)
            if not reuse:  # the test seam: no sampler log-probs, so the old ones are recomputed
                learner._sampler_logprobs = lambda rollouts, b: None
            try:
                learner.step(ro, rewards, [], 0)
            finally:
                pol["restore"]()
            # two epochs; the old log-probs are the sampler's, or one more pass recomputes them
            assert pol["n"] == 2 * 2 + (0 if reuse else 2)


def test_sampler_logprobs_stand_in_for_the_old_policy_forward():
    for overrides in ([], ["sampling.temperature=0.7"], ["model.dtype=bfloat16"]):
        _, policy, ref, cfg, algo, _, _ = setup(["train.inner_epochs=2", *overrides])
        policy = policy.to(getattr(torch, cfg.model.dtype))
        ro = sample(policy, build_char_tokenizer(), ["Q:1+2\nA:", "Q:3*4-1\nA:"], n=4, max_new_tokens=10, seed=3,
                    temperature=cfg.sampling.temperature)
        learner = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref)
        b = make_batch(ro, "cpu")
        got = learner._sampler_logprobs(ro, b)
        if cfg.model.dtype != "float32":
            assert got is None  # recomputed: not rounding-sized differences
            continue
        with torch.no_grad():
            want = token_logprobs(policy, b, cfg.sampling.temperature) * b.mask
        assert want.abs().max() > 0.1
        assert torch.allclose(got, want, atol=2e-5)


def test_ppo_mu_one_trains_the_critic_in_the_pass_that_computes_its_values():
    """With mu = 1 the critic's values for GAE come from its one training pass (weights not yet
    moved), not from a separate forward: same update, same metrics, half the critic passes."""
    runs = []
    for fused in (True, False):
        _, policy, ref, cfg, algo, ro, rewards = setup(["algorithm=ppo", "train.micro_batch_size=4",
                                                        "algorithm.critic_lr=1e-2", "train.lr=1e-2"])
        critic = ValueModel(policy)
        torch.nn.init.normal_(critic.head.weight, std=0.5)  # nonzero values, so GAE depends on them
        learner = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref, critic=critic)
        if not fused:  # the test seam: the separate value forward, then the training pass
            learner._fuses_critic = lambda keep: False
        calls = {"n": 0}
        critic.register_forward_pre_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
        m = learner.step(ro, rewards, [], 0)
        runs.append((calls["n"], m, [p.detach().clone() for p in critic.parameters()],
                     [p.detach().clone() for p in policy.parameters()]))
    (n1, m1, c1, p1), (n0, m0, c0, p0) = runs
    assert (n1, n0) == (2, 4)  # 2 micro-batches: one pass, against a value forward plus a training pass
    assert m1["train/value_loss"] > 0 and m1["train/value_loss"] == pytest.approx(m0["train/value_loss"], rel=1e-6)
    assert m1["train/value_mean"] == pytest.approx(m0["train/value_mean"], rel=1e-6, abs=1e-7)
    assert max((a - b).abs().max().item() for a, b in zip(c1, c0)) < 1e-6
    assert max((a - b).abs().max().item() for a, b in zip(p1, p0)) < 1e-6
    before = build_tiny_model(SMALL, build_char_tokenizer(), seed=1)
    assert max((a - b).abs().max().item() for a, b in zip(p1, before.parameters())) > 1e-3  # the policy moved


def test_rft_holds_no_reference_and_skips_all_wrong_batches():
    _, policy, ref, cfg, algo, ro, _ = setup(["algorithm=rft"])
    assert ref is None and not algo.uses_reference
    before = [p.detach().clone() for p in policy.parameters()]
    m = Learner(policy, algo, cfg, "cpu", PerfTracker()).step(ro, torch.zeros(8), [], 0)
    assert m["train/skipped"] == 1.0 and m["train/kept_fraction"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_reference_reset_for_iterative_rl():
    _, policy, ref, cfg, algo, ro, rewards = setup(["train.lr=1e-2"])
    learner = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref)
    learner.step(ro, rewards, [], 0)
    diff = lambda: max((a - b).abs().max().item() for a, b in zip(policy.parameters(), ref.parameters()))
    assert diff() > 0
    learner.reset_reference()
    assert diff() == 0


def test_two_mini_batches_take_two_steps_against_the_old_log_probs():
    """train.mini_batches = 2: two optimizer steps on rows 0-3 then 4-7; the second step's ratio
    (current / before the first step) is no longer 1, so the clip can bite. With one step per
    batch the ratio is exactly 1 and nothing is clipped."""
    _, policy, ref, cfg, algo, ro, rewards = setup(["train.lr=5e-2", "train.max_grad_norm=0"])
    m1 = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref).step(ro, rewards, [], 0)
    assert m1["train/ratio_max"] == 1.0 and m1["train/clip_frac"] == 0.0
    _, policy, ref, cfg, algo, ro, rewards = setup(["train.lr=5e-2", "train.max_grad_norm=0",
                                                    "train.mini_batches=2", "train.micro_batch_size=3"])
    learner = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref)
    b = make_batch(ro, "cpu")
    with torch.no_grad():
        before = token_logprobs(policy, b, 1.0)
    learner._sampler_logprobs = lambda rollouts, bb: None  # old log-probs recomputed before any step
    assert torch.allclose(learner._old_logprobs(ro, b), before, atol=1e-6)
    seen, step = [], learner.opt.step

    def recording():  # ratio of rows 4-7 (the second slice) at each step, against before the first
        with torch.no_grad():
            lp = token_logprobs(policy, b.rows(slice(4, 8)), 1.0)
        seen.append(((lp - before[4:]).exp() * b.mask[4:]).max().item())
        step()
    learner.opt.step = recording
    m2 = learner.step(ro, rewards, [], 0)
    assert len(seen) == 2
    assert seen[0] == pytest.approx(1.0, abs=1e-6)  # the first step: nothing has moved yet
    assert seen[1] > 1.2  # after the first step, outside 1 + clip_eps
    assert m2["train/ratio_max"] > 1.2 and m2["train/clip_frac"] > 0.0


def test_rft_loss_is_normalised_by_the_sampled_outputs():
    """DeepSeekMath §5.2.1: -1/B sum_i I(o_i) mean_t log pi(o_i,t), with B = 8 sampled outputs
    (not the 2 kept), so a prompt weighs by how many of its samples were correct."""
    _, policy, _, cfg, algo, ro, _ = setup(["algorithm=rft"])
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    b = make_batch(ro, "cpu")
    with torch.no_grad():
        lp = token_logprobs(policy, b, 1.0)
    per_row = (lp * b.mask).sum(1) / b.mask.sum(1)
    want = -(per_row[0] + per_row[6]).item() / 8
    m = Learner(policy, algo, cfg, "cpu", PerfTracker()).step(ro, rewards, [], 0)
    assert m["train/kept_fraction"] == 0.25
    assert m["train/loss"] == pytest.approx(want, rel=1e-5)


def test_ppo_advantages_are_whitened_by_default():
    means = {}
    for whiten in ("null", "false"):
        _, policy, ref, cfg, algo, ro, rewards = setup(["algorithm=ppo", f"algorithm.whiten_advantages={whiten}"])
        critic = ValueModel(policy)
        m = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref, critic=critic).step(ro, rewards, [], 0)
        means[whiten] = m["train/adv_mean"]
    assert resolve(load_config(None, ["algorithm=ppo"]).algorithm).whiten_advantages
    assert not resolve(load_config(None, ["algorithm=grpo"]).algorithm).whiten_advantages
    assert means["null"] == pytest.approx(0.0, abs=1e-6)  # whitened: zero mean over the batch's tokens
    assert abs(means["false"]) > 1e-2
