"""Advantages, losses, KL estimators and aggregations against hand-computed numbers."""
import math

import pytest
import torch

from algorithms.advantages import ADVANTAGES, AdvantageInput, gae, group_token_sums, masked_whiten
from algorithms.filters import FILTERS
from algorithms.losses import (AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, AggContext, LossSettings,
                               clipped_value_loss, kl_k1, kl_k2, kl_k3)
from algorithms.losses import ppo_clip as _ppo_clip


def ppo_clip(lp, old, adv, eps):
    """The registered loss per token: aggregation the identity, a symmetric clip at ``eps``."""
    return _ppo_clip(lp, old, adv, torch.ones_like(lp), None, lambda x, mask, ctx: x, LossSettings(eps, eps)).loss
from algorithms.registry import UnknownComponentError


def adv(name, rewards, n, T=3, **kw):
    r = torch.tensor(rewards, dtype=torch.float32)
    mask = torch.ones(len(rewards), T)
    return ADVANTAGES.get(name)(AdvantageInput(rewards=r, mask=mask, n=n, **kw))


def test_grpo_half_correct_group_population_std():
    a = adv("grpo", [1, 1, 1, 1, 0, 0, 0, 0], n=8)
    # mean 0.5, population std 0.5 -> +-0.5 / (0.5 + 1e-4)
    expect = 0.5 / 0.5001
    assert torch.allclose(a[:4], torch.full((4, 3), expect), atol=1e-6)
    assert torch.allclose(a[4:], torch.full((4, 3), -expect), atol=1e-6)


def test_grpo_three_reward_group():
    a = adv("grpo", [1, 0, 0], n=3)[:, 0]
    # mean 1/3; population std sqrt(2)/3 = 0.47140452
    std = 0.47140452 + 1e-4
    assert a.tolist() == pytest.approx([(2 / 3) / std, -(1 / 3) / std, -(1 / 3) / std], abs=1e-5)
    assert a[0].item() == pytest.approx(1.4139143, abs=1e-5)


def test_grpo_all_equal_group_is_zero_not_nan():
    for rewards in ([1, 1, 1, 1], [0, 0, 0, 0]):
        a = adv("grpo", rewards, n=4)
        assert not torch.isnan(a).any()
        assert torch.equal(a, torch.zeros(4, 3))


def test_grpo_groups_are_independent_and_padding_is_zero():
    r = torch.tensor([1.0, 0.0, 5.0, 5.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.float32)
    a = ADVANTAGES.get("grpo")(AdvantageInput(rewards=r, mask=mask, n=2, std_eps=0.0))
    assert a.tolist() == [[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


def test_rloo_and_dr_grpo_on_four_samples():
    assert adv("rloo", [1, 0, 0, 1], n=4)[:, 0].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert adv("dr_grpo", [1, 0, 0, 1], n=4)[:, 0].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    # Dr. GRPO does not divide by the std: scaling rewards scales advantages
    assert adv("dr_grpo", [2, 0, 0, 2], n=4)[:, 0].tolist() == pytest.approx([1, -1, -1, 1])


def test_process_supervision_two_outputs():
    # output 0: 2 steps, rewards [1, 0], ending at tokens 2 and 5 (6 tokens)
    # output 1: 3 steps, rewards [1, 1, 1], ending at tokens 1, 3, 6 (7 tokens)
    mask = torch.tensor([[1] * 6 + [0], [1] * 7], dtype=torch.float32)
    steps = [[(1.0, 2), (0.0, 5)], [(1.0, 1), (1.0, 3), (1.0, 6)]]
    a = ADVANTAGES.get("grpo_ps")(AdvantageInput(rewards=torch.zeros(2), mask=mask, n=2, step_rewards=steps,
                                                 std_eps=0.0))
    # all step rewards [1,0,1,1,1]: mean 0.8, population std 0.4 -> 1 -> 0.5, 0 -> -2
    assert a[0].tolist() == pytest.approx([-1.5, -1.5, -1.5, -2, -2, -2, 0])
    assert a[1].tolist() == pytest.approx([1.5, 1.5, 1.0, 1.0, 0.5, 0.5, 0.5])


def test_process_supervision_group_sums_and_the_zero_sum_ablation():
    # the two outputs above (group 0), and a group 1 whose steps all score 1 (no signal: zero advantage)
    mask = torch.tensor([[1] * 6 + [0], [1] * 7, [1] * 3 + [0] * 4, [1] * 2 + [0] * 5], dtype=torch.float32)
    steps = [[(1.0, 2), (0.0, 5)], [(1.0, 1), (1.0, 3), (1.0, 6)], [(1.0, 2)], [(1.0, 0), (1.0, 1)]]
    inp = AdvantageInput(rewards=torch.zeros(4), mask=mask, n=2, step_rewards=steps, std_eps=0.0)
    ps = ADVANTAGES.get("grpo_ps")(inp)
    # §4.1.3 (the default) does not sum to zero: 3*(-1.5) + 3*(-2) = -10.5, 2*1.5 + 2*1 + 3*0.5 = 6.5
    assert group_token_sums(ps, mask, 2).tolist() == pytest.approx([-4.0, 0.0])
    zs = ADVANTAGES.get("grpo_ps_zerosum")(inp)
    # the ablation subtracts the group's mean token advantage, -4 / 13, on every real token
    c = 4 / 13
    assert zs[0].tolist() == pytest.approx([-1.5 + c] * 3 + [-2 + c] * 3 + [0])
    assert zs[1].tolist() == pytest.approx([1.5 + c, 1.5 + c, 1 + c, 1 + c, 0.5 + c, 0.5 + c, 0.5 + c])
    assert torch.equal(zs[2:], torch.zeros(2, 7))
    assert group_token_sums(zs, mask, 2).tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    # only the padding-free tokens count: padding stays 0
    assert torch.equal(zs * (1 - mask), torch.zeros(4, 7))


def test_gae_four_tokens():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 0.8]])
    mask = torch.ones(1, 4)
    a, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    # deltas 0.1, 0.1, 0.1, 0.2; A3 = .2, A2 = .1+.95*.2 = .29, A1 = .1+.95*.29 = .3755, A0 = .456725
    assert a[0].tolist() == pytest.approx([0.456725, 0.3755, 0.29, 0.2], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.956725, 0.9755, 0.99, 1.0], abs=1e-6)


def test_gae_advantage_puts_outcome_on_last_real_token():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    values = torch.tensor([[0.25, 0.5, 9.0]])  # the value on padding must be ignored
    a = ADVANTAGES.get("gae")(AdvantageInput(rewards=torch.tensor([1.0]), mask=mask, n=1, values=values,
                                             gamma=1.0, lam=1.0))
    # lambda=1, gamma=1: A_t = R - V_t
    assert a[0].tolist() == pytest.approx([0.75, 0.5, 0.0])


def test_ppo_clip_cases():
    lp = torch.tensor([1.0, 1.0, -1.0, -1.0, math.log(1.1)])
    old = torch.zeros(5)
    A = torch.tensor([1.0, -1.0, -1.0, 1.0, 2.0])
    loss = ppo_clip(lp, old, A, 0.2)
    e, ie = math.e, math.exp(-1)
    # ratio e, A>0: clipped to 1.2 | ratio e, A<0: unclipped -e | ratio 1/e, A<0: clipped to 0.8
    # ratio 1/e, A>0: unclipped | ratio 1.1 in range: -1.1*2
    assert loss.tolist() == pytest.approx([-1.2, e, 0.8, -ie, -2.2], abs=1e-6)


def test_ppo_clip_gradient_vanishes_when_clipped():
    lp = torch.tensor([1.0, math.log(1.1)], requires_grad=True)
    ppo_clip(lp, torch.zeros(2), torch.tensor([1.0, 1.0]), 0.2).sum().backward()
    assert lp.grad[0].item() == 0.0
    assert lp.grad[1].item() == pytest.approx(-1.1)  # d(-r A)/dlogp = -r A


def test_ratio_trick_for_mu_equal_one():
    lp = torch.tensor([-0.7, -1.3], requires_grad=True)
    loss = ppo_clip(lp, lp.detach(), torch.tensor([2.0, -1.0]), 0.2)
    assert loss.tolist() == pytest.approx([-2.0, 1.0])  # ratio is exactly 1
    loss.sum().backward()
    assert lp.grad.tolist() == pytest.approx([-2.0, 1.0])  # gradient of -A * logp


def test_kl_estimators_by_hand():
    lp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    # k3: d = log(0.25/0.5) = -ln 2; e^d - d - 1 = 0.5 + ln2 - 1
    assert kl_k3(lp, ref).item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-7)
    assert kl_k1(lp, ref).item() == pytest.approx(math.log(2))
    assert kl_k2(lp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_k3(lp, lp).item() == 0.0
    assert KL_ESTIMATORS.get("k3") is kl_k3


def test_aggregations_and_micro_batch_additivity():
    x = torch.tensor([[1.0, 2.0, 3.0, 7.0], [4.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.float32)
    ctx = AggContext(num_seqs=2, num_tokens=4, const_len=4)
    assert AGGREGATIONS.get("seq-mean-token-mean")(x, mask, ctx).item() == pytest.approx((2 + 4) / 2)
    assert AGGREGATIONS.get("token-mean")(x, mask, ctx).item() == pytest.approx(10 / 4)
    assert AGGREGATIONS.get("seq-mean-token-sum-norm")(x, mask, ctx).item() == pytest.approx(10 / 8)
    for name in AGGREGATIONS.names():
        f = AGGREGATIONS.get(name)
        assert (f(x[:1], mask[:1], ctx) + f(x[1:], mask[1:], ctx)).item() == pytest.approx(f(x, mask, ctx).item())


def test_clipped_value_loss_cases():
    old, R = torch.tensor([0.5, 0.5, 0.2]), torch.tensor([1.0, 1.0, 0.0])
    v = torch.tensor([0.9, 0.6, 0.1])
    # 0.9 clipped to 0.7: max(.01, .09)/2 | 0.6 in range: .16/2 | 0.1 within [0, .4]: .01/2
    assert clipped_value_loss(v, old, R, 0.2).tolist() == pytest.approx([0.045, 0.08, 0.005])
    v2 = torch.tensor([-0.5])  # far below: clipped to 0.0 -> (0-0)^2 = 0, unclipped .25 -> max .25
    assert clipped_value_loss(v2, torch.tensor([0.2]), torch.tensor([0.0]), 0.2).item() == pytest.approx(0.125)


def test_rft_filters_all_correct_or_deduplicated():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    texts = ["a", "a", "b", "c", "x", "y", "x", "z"]
    # DeepSeekMath §5.2.1: every correct output, duplicates included (I(o) = 1)
    assert FILTERS.get("correct")(rewards, texts, 4).tolist() == [True, True, False, True, False, False, False, False]
    assert FILTERS.get("correct_only") is FILTERS.get("correct")
    # the variant: each distinct correct text of a group once ("a" twice in group 0 -> once)
    assert FILTERS.get("correct_dedup")(rewards, texts, 4).tolist() == [True, False, False, True, False, False, False,
                                                                         False]
    # the same text in two groups is kept in both
    assert FILTERS.get("correct_dedup")(torch.ones(4), ["a", "a", "a", "b"], 2).tolist() == [True, False, True, True]
    assert FILTERS.get("none")(torch.zeros(3), ["a", "b", "c"], 3).all()


def test_group_std_sample_is_population_times_sqrt_g_over_g_minus_1():
    # G = 8, rewards 1,1,1,0,0,0,0,0: mean 3/8, sum of squared deviations 3*(5/8)^2 + 5*(3/8)^2 = 15/8
    # population std sqrt(15/64) = 0.48412292, sample std sqrt(15/56) = 0.51754917 (ratio sqrt(8/7))
    rewards = [1, 1, 1, 0, 0, 0, 0, 0]
    pop = adv("grpo", rewards, n=8, std_eps=0.0)[:, 0]
    smp = adv("grpo", rewards, n=8, std_eps=0.0, group_std="sample")[:, 0]
    assert pop[0].item() == pytest.approx((5 / 8) / math.sqrt(15 / 64), abs=1e-6)
    assert smp[0].item() == pytest.approx((5 / 8) / math.sqrt(15 / 56), abs=1e-6)
    assert smp[0].item() == pytest.approx(1.2076147, abs=1e-6) and pop[0].item() == pytest.approx(1.2909944, abs=1e-6)
    assert torch.allclose(pop / smp, torch.full((8,), math.sqrt(8 / 7)), atol=1e-6)
    # the default is the population std
    assert torch.equal(adv("grpo", rewards, n=8, std_eps=0.0), adv("grpo", rewards, n=8, std_eps=0.0,
                                                                  group_std="population"))
    # process supervision: steps [1, 0, 1, 1, 1] -> sample std sqrt(0.8 / 4) = sqrt(0.2)
    mask = torch.ones(2, 3)
    steps = [[(1.0, 0), (0.0, 2)], [(1.0, 0), (1.0, 1), (1.0, 2)]]
    a = ADVANTAGES.get("grpo_ps")(AdvantageInput(rewards=torch.zeros(2), mask=mask, n=2, step_rewards=steps,
                                                 std_eps=0.0, group_std="sample"))
    s = math.sqrt(0.2)
    assert a[0].tolist() == pytest.approx([(0.2 - 0.8) / s, -0.8 / s, -0.8 / s], abs=1e-5)
    with pytest.raises(ValueError, match="population"):
        adv("grpo", rewards, n=8, group_std="unbiased")


def test_masked_whiten_by_hand():
    # valid entries 1, 2, 3, 6 (the 100 is padding): mean 3, unbiased var (4 + 1 + 0 + 9) / 3 = 14/3
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 6.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    w = masked_whiten(x, mask)
    sd = math.sqrt(14 / 3 + 1e-8)
    assert torch.allclose(w, torch.tensor([[-2 / sd, -1 / sd, 0.0], [0.0, 3 / sd, 0.0]]), atol=1e-6)
    assert (w * mask).sum().item() == pytest.approx(0.0, abs=1e-6)


def test_gae_whitened_for_ppo_by_hand():
    # one sequence of 3 tokens, outcome 1 on the last, values 0, gamma = lambda = 1: A = 1, 1, 1;
    # a second of 2 tokens (third is padding), outcome 0, values 0.5: deltas 0, -0.5 -> A = -0.5, -0.5
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    values = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    a = ADVANTAGES.get("gae")(AdvantageInput(rewards=torch.tensor([1.0, 0.0]), mask=mask, n=1, values=values,
                                             gamma=1.0, lam=1.0))
    assert torch.allclose(a, torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, 0.0]]), atol=1e-6)
    # mean (3 - 1) / 5 = 0.4; unbiased var (3 * 0.36 + 2 * 0.81) / 4 = 0.675
    w = masked_whiten(a, mask)
    sd = math.sqrt(0.675 + 1e-8)
    assert torch.allclose(w, torch.tensor([[0.6 / sd] * 3, [-0.9 / sd, -0.9 / sd, 0.0]]), atol=1e-6)


@pytest.mark.parametrize("reg,bad", [(ADVANTAGES, "gea"), (POLICY_LOSSES, "ppo-clip"), (KL_ESTIMATORS, "k4"),
                                     (AGGREGATIONS, "mean"), (FILTERS, "corect")])
def test_unknown_component_lists_valid_names(reg, bad):
    with pytest.raises(UnknownComponentError) as e:
        reg.get(bad)
    msg = str(e.value)
    assert bad in msg and all(n in msg for n in reg.names())
