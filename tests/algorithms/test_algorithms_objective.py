"""algorithms.objective (the loss the learner back-propagates) against hand-computed numbers."""
import math

import pytest
import torch

from algorithms.losses import AggContext
from algorithms.objective import kl_reward_token_rewards, policy_objective, value_objective
from algorithms.registry import UnknownComponentError

E = math.e
LN2 = math.log(2.0)
GRPO = dict(policy_loss="ppo_clip", aggregation="seq-mean-token-mean", kl_estimator="k3", kl_coef=0.0,
            kl_placement="none", clip_eps=0.2)


def two_rows():
    """Row 0: log-ratios 1, 0, ln 0.5 (ratios e, 1, 0.5), A = +1, 3 tokens.
    Row 1: log-ratios 1, 0, 5 (ratios e, 1, e^5), A = -1, the third token is padding."""
    old = torch.tensor([[-1.0, -2.0, -1.0], [-3.0, -1.0, -6.0]])
    logp = (old + torch.tensor([[1.0, 0.0, math.log(0.5)], [1.0, 0.0, 5.0]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return logp, old, adv, mask, AggContext(num_seqs=2, num_tokens=5, const_len=4)


def test_clipped_surrogate_seq_mean_token_mean_by_hand():
    logp, old, adv, mask, ctx = two_rows()
    obj = policy_objective(logp, old, None, adv, mask, ctx, **GRPO)
    # row 0 (A=+1): -min(rA, clip(r)A) = -min(e, 1.2), -1, -min(0.5, 0.8) = -1.2, -1, -0.5 -> mean -0.9
    # row 1 (A=-1): -min(-e, -1.2) = e, -min(-1, -1) = 1 (third masked) -> mean (e + 1) / 2
    want = (-0.9 + (E + 1) / 2) / 2
    assert obj.pg_loss.item() == pytest.approx(want, abs=1e-6)
    assert obj.loss.item() == pytest.approx(want, abs=1e-6)
    assert obj.kl is None
    obj.loss.backward()
    # d/dlogp of -rA / (tokens of the row * 2 rows): 0 where the clip bites (row 0, ratio e > 1.2),
    # -0.5/6 at ratio 0.5 (min takes the unclipped side), e/4 for row 1's ratio e (unclipped side)
    want_grad = torch.tensor([[0.0, -1 / 6, -0.5 / 6], [E / 4, 1 / 4, 0.0]])
    assert torch.allclose(logp.grad, want_grad, atol=1e-6)


@pytest.mark.parametrize("aggregation, want", [
    ("token-mean", (-2.7 + E + 1) / 5),               # every unmasked token of the batch
    ("seq-mean-token-sum-norm", (-2.7 + E + 1) / (2 * 4)),  # token sums / (rows * const_len)
])
def test_other_aggregations_by_hand(aggregation, want):
    logp, old, adv, mask, ctx = two_rows()
    obj = policy_objective(logp, old, None, adv, mask, ctx, **dict(GRPO, aggregation=aggregation))
    assert obj.loss.item() == pytest.approx(want, abs=1e-6)


def test_on_policy_ratio_is_one_with_the_gradient_of_logp():
    # old_logp None (mu = 1): ratio exp(logp - logp.detach()) = 1, loss -mean(A), d/dlogp = -A / (T * B)
    logp = torch.tensor([[-0.3, -2.0], [-1.0, -0.1]], requires_grad=True)
    adv = torch.tensor([[0.5, 0.5], [-2.0, -2.0]])
    mask = torch.ones(2, 2)
    obj = policy_objective(logp, None, None, adv, mask, AggContext(2, 4, 2), **GRPO)
    assert obj.loss.item() == pytest.approx(-(0.5 - 2.0) / 2, abs=1e-6)
    obj.loss.backward()
    assert torch.allclose(logp.grad, -adv / 4, atol=1e-7)
    st = obj.stats  # the loss's own clip statistics: every ratio 1, nothing clipped
    assert (st.clipped_low, st.clipped_high, st.ratio_max) == (0.0, 0.0, 1.0)


def test_k3_kl_in_the_loss_by_hand():
    # k3 = exp(ref - logp) - (ref - logp) - 1: logp 0, ref ln 2 -> 1 - ln 2; logp ln 2, ref 0 -> ln 2 - 1/2
    logp = torch.tensor([[0.0, LN2]], requires_grad=True)
    ref = torch.tensor([[LN2, 0.0]])
    adv = torch.zeros(1, 2)  # no policy-gradient term: the loss is the KL term alone
    mask = torch.ones(1, 2)
    kl_by_hand = ((1 - LN2) + (LN2 - 0.5)) / 2  # = 0.25, seq-mean-token-mean of one row
    obj = policy_objective(logp, None, ref, adv, mask, AggContext(1, 2, 2),
                           **dict(GRPO, kl_coef=0.04, kl_placement="loss"))
    assert obj.kl.item() == pytest.approx(kl_by_hand, abs=1e-6) and kl_by_hand == pytest.approx(0.25)
    assert obj.pg_loss.item() == 0.0
    assert obj.loss.item() == pytest.approx(0.04 * 0.25, abs=1e-7)
    obj.loss.backward()
    # d k3 / d logp = 1 - exp(ref - logp): 1 - 2 = -1 and 1 - 1/2 = 1/2; times 0.04 / 2 tokens
    assert torch.allclose(logp.grad, torch.tensor([[-0.02, 0.01]]), atol=1e-7)


def test_kl_placed_in_the_reward_or_nowhere_leaves_the_loss_alone():
    logp, old, adv, mask, ctx = two_rows()
    ref = old - 0.5
    base = policy_objective(logp, old, None, adv, mask, ctx, **GRPO).loss.item()
    for placement in ("reward", "none"):
        obj = policy_objective(logp, old, ref, adv, mask, ctx, **dict(GRPO, kl_coef=0.5, kl_placement=placement))
        assert obj.kl is None and obj.loss.item() == base
    # no reference model (ref_logp None): no KL term, whatever the placement
    obj = policy_objective(logp, old, None, adv, mask, ctx, **dict(GRPO, kl_coef=0.5, kl_placement="loss"))
    assert obj.kl is None and obj.loss.item() == base


def test_kl_reward_token_rewards_k1_by_hand():
    # PPO's default: k1 = old - ref, reward -kl_coef * k1 on unmasked tokens
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    r, kl = kl_reward_token_rewards(old, ref, mask, kl_estimator="k1", kl_coef=0.04)
    assert kl[0].tolist() == pytest.approx([0.5, -1.0, 0.0])
    assert r[0].tolist() == pytest.approx([-0.02, 0.04, 0.0], abs=1e-8)
    r3, kl3 = kl_reward_token_rewards(torch.zeros(1, 1), torch.full((1, 1), LN2), torch.ones(1, 1),
                                      kl_estimator="k3", kl_coef=0.1)
    assert kl3.item() == pytest.approx(1 - LN2, abs=1e-6) and r3.item() == pytest.approx(-0.1 * (1 - LN2), abs=1e-7)


def test_micro_batch_losses_add_up_to_the_full_batch_loss():
    logp, old, adv, mask, ctx = two_rows()
    ref = old + 0.3
    kw = dict(GRPO, kl_coef=0.1, kl_placement="loss")
    full = policy_objective(logp, old, ref, adv, mask, ctx, **kw).loss
    parts = sum(policy_objective(logp[s], old[s], ref[s], adv[s], mask[s], ctx, **kw).loss
                for s in (slice(0, 1), slice(1, 2)))
    assert parts.item() == pytest.approx(full.item(), abs=1e-6)


def test_clipped_value_objective_by_hand():
    # token 1: V 1, V_old 0.5, R 0 -> clip(V) 0.7: max(1, 0.49) = 1 -> 0.5
    # token 2: V 2, V_old 1, R 2 -> clip(V) 1.2: max(0, 0.64) = 0.64 -> 0.32 (the clip makes it larger)
    # token 3 masked
    v = torch.tensor([[1.0, 2.0, 9.0]])
    old = torch.tensor([[0.5, 1.0, 0.0]])
    ret = torch.tensor([[0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    got = value_objective(v, old, ret, mask, AggContext(1, 2, 3), aggregation="token-mean", value_coef=0.5,
                          value_clip=0.2)
    assert got.item() == pytest.approx(0.5 * (0.5 + 0.32) / 2, abs=1e-6)


def test_clip_stats_count_masked_tokens_outside_the_range():
    logp, old, adv, mask, ctx = two_rows()
    st = policy_objective(logp, old, None, adv, mask, ctx, **GRPO).stats
    assert (st.clipped_low, st.clipped_high) == (1.0, 2.0)  # 0.5 below; e and e above (row 1's e^5 is padding)
    assert st.ratio_max == pytest.approx(E, abs=1e-5)


def test_unknown_component_names_list_the_valid_ones():
    logp, old, adv, mask, ctx = two_rows()
    with pytest.raises(UnknownComponentError, match="ppo_clip"):
        policy_objective(logp, old, None, adv, mask, ctx, **dict(GRPO, policy_loss="ppo_clipp"))
    with pytest.raises(UnknownComponentError, match="k3"):
        kl_reward_token_rewards(old, old, mask, kl_estimator="k4", kl_coef=0.1)
