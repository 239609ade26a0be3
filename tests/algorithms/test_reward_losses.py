"""Reward-model losses and PRIME's advantage against hand-computed numbers."""
import math

import pytest
import torch

from algorithms.advantages import ADVANTAGES, AdvantageInput, process_token_rewards
from algorithms.reward_losses import (implicit_outcome_logit, implicit_prm_loss, implicit_token_rewards, tag_bce,
                                      tag_probability)


def test_tag_probability_is_the_two_way_softmax():
    # softmax([2, -1])[0] = e^2 / (e^2 + e^-1) = sigmoid(3)
    assert tag_probability(torch.tensor(3.0)).item() == pytest.approx(math.exp(2) / (math.exp(2) + math.exp(-1)))


def test_tag_bce_by_hand():
    # margins 0 (p = 1/2) with label 1: ln 2; margin ln 3 (p = 3/4) with label 0: -ln(1/4) = ln 4
    loss = tag_bce(torch.tensor([0.0, math.log(3.0)]), torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert tag_bce(torch.zeros(0), torch.zeros(0)).item() == 0.0


def test_implicit_rewards_and_loss_by_hand():
    lp_rm = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
    lp_ref = torch.tensor([[-2.0, -2.0, -1.5], [-0.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    beta = 0.5
    # row 0: log ratios 1, 0 (third token padding) -> rewards 0.5, 0; row 1: -0.5, 0 -> -0.25, 0
    assert implicit_token_rewards(lp_rm, lp_ref, mask, beta).tolist() == [[0.5, 0.0, 0.0], [-0.25, 0.0, 0.0]]
    z = implicit_outcome_logit(lp_rm, lp_ref, mask, beta)
    assert z.tolist() == [0.5, -0.25]
    sig = lambda x: 1 / (1 + math.exp(-x))
    want = (-math.log(sig(0.5)) - math.log(1 - sig(-0.25))) / 2  # labels 1 and 0
    labels = torch.tensor([1.0, 0.0])
    assert implicit_prm_loss(lp_rm, lp_ref, mask, labels, beta).item() == pytest.approx(want)
    # micro-batches with the whole batch's count add up to the batch loss
    parts = sum(implicit_prm_loss(lp_rm[i:i + 1], lp_ref[i:i + 1], mask[i:i + 1], labels[i:i + 1], beta, num_seqs=2)
                for i in range(2))
    assert parts.item() == pytest.approx(want)


def test_process_token_rewards_places_steps_on_their_last_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    steps = [[(1.0, 0), (2.0, 2), (3.0, 2)], [(5.0, 9)]]  # two steps end on token 2; one past the end clamps
    got = process_token_rewards(AdvantageInput(rewards=torch.zeros(2), mask=mask, n=2, step_rewards=steps))
    assert got.tolist() == [[1.0, 0.0, 5.0, 0.0], [0.0, 5.0, 0.0, 0.0]]


def test_prime_advantage_by_hand():
    """Group of 3: outcome rewards 1, 0, 0; process rewards per token (the implicit PRM's kind).
    pbar = mean process reward per token: row 0: (1 + 1) / 2 = 1, row 1: (0 + 3 + 0) / 3 = 1, row 2: -2 / 1 = -2.
    baselines b_i = mean of the others' pbar: b0 = (1 - 2) / 2 = -0.5, b1 = (1 - 2) / 2 = -0.5, b2 = (1 + 1) / 2 = 1.
    RLOO outcome: 1 - 0 = 1, 0 - 1/2 = -0.5, -0.5.
    row 0: shifted 1.5, 1.5 -> returns 3, 1.5 -> + 1 = 4, 2.5
    row 1: shifted 0.5, 3.5, 0.5 -> returns 4.5, 4, 0.5 -> - 0.5 = 4, 3.5, 0
    row 2: shifted -3 -> returns -3 -> - 0.5 = -3.5"""
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    steps = [[(1.0, 0), (1.0, 1)], [(0.0, 0), (3.0, 1), (0.0, 2)], [(-2.0, 0)]]
    inp = AdvantageInput(rewards=torch.tensor([1.0, 0.0, 0.0]), mask=mask, n=3, step_rewards=steps)
    adv = ADVANTAGES.get("prime")(inp)
    assert adv.flatten().tolist() == pytest.approx([4.0, 2.5, 0.0, 4.0, 3.5, 0.0, -3.5, 0.0, 0.0])


def test_prime_without_process_rewards_is_rloo():
    mask = torch.ones(4, 3)
    inp = AdvantageInput(rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]), mask=mask, n=2, step_rewards=[[]] * 4)
    assert torch.equal(ADVANTAGES.get("prime")(inp), ADVANTAGES.get("rloo")(inp))
    with pytest.raises(ValueError, match="samples_per_prompt >= 2"):
        ADVANTAGES.get("prime")(AdvantageInput(rewards=torch.zeros(1), mask=torch.ones(1, 1), n=1, step_rewards=[[]]))
