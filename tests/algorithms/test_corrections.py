"""Off-policy corrections (algorithms/corrections.py) and their place in the loss seam (algorithms/objective.py),
against values worked out by hand.

Three rows, cap C = 2, padding holding garbage that must not count:
  row 0: token ratios 3, 0.25, 1   (geometric mean 0.75 ** (1/3) = 0.90856; the product, unnormalised, 0.75)
  row 1: token ratios 1.8, 1.8      (geometric mean 1.8; the product 3.24 would leave [1/2, 2])
  row 2: token ratios 8, 8          (geometric mean 8)
"""
import math

import pytest
import torch

from algorithms.corrections import CORRECTIONS, mismatch_stats
from algorithms.losses import POLICY_LOSSES, AggContext
from algorithms.objective import policy_objective
from algorithms.presets import CORRECTIONS as NAMES

CAP = 2.0
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
RATIOS = [[3.0, 0.25, 1.0], [1.8, 1.8, None], [8.0, 8.0, None]]
G0 = 0.75 ** (1 / 3)


def _logps():
    """(proximal, behaviour) log-probs with the ratios above; padding prox 5, behav -5 (ratio e^10)."""
    behav = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.1, -5.0], [-3.0, -2.5, -5.0]])
    log_r = torch.tensor([[math.log(r) if r else 10.0 for r in row] for row in RATIOS])
    prox = behav + log_r
    prox[1, 2] = prox[2, 2] = 5.0
    return prox, behav


EXPECTED = {  # (weights, truncated tokens, masked tokens)
    "none": ([[1, 1, 1], [1, 1, 0], [1, 1, 0]], 0, 0),
    "token_tis": ([[2, 0.25, 1], [1.8, 1.8, 0], [2, 2, 0]], 3, 0),
    "token_mask": ([[0, 0, 1], [1, 1, 0], [0, 0, 0]], 0, 4),
    "seq_tis": ([[G0, G0, G0], [1.8, 1.8, 0], [2, 2, 0]], 2, 0),
    "seq_mask": ([[1, 1, 1], [1, 1, 0], [0, 0, 0]], 0, 2),
}


def test_every_name_the_config_takes_is_registered():
    assert set(CORRECTIONS.names()) == set(NAMES) == set(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_weights_truncated_and_masked_counts_by_hand(name):
    prox, behav = _logps()
    prox.requires_grad_(True)  # a weight never carries a gradient, whatever it is given
    w = CORRECTIONS.get(name)(prox, behav, MASK, CAP)
    want, truncated, masked = EXPECTED[name]
    assert torch.allclose(w.weight, torch.tensor(want, dtype=torch.float32), atol=1e-5), w.weight
    assert (w.truncated, w.masked) == (truncated, masked)
    assert not w.weight.requires_grad


def test_mismatch_by_hand():
    prox, behav = _logps()
    m = mismatch_stats(prox, behav, MASK)
    toks = [r for row in RATIOS for r in row if r is not None]
    assert m.tokens == 7
    assert m.kl_sum == pytest.approx(sum(r - 1 - math.log(r) for r in toks), rel=1e-5)  # k3 per token
    assert m.abs_diff_sum == pytest.approx(sum(abs(math.log(r)) for r in toks), rel=1e-5)
    assert sorted(m.ratios.tolist()) == pytest.approx(sorted(toks), rel=1e-5)
    assert m.ratio_max == pytest.approx(8.0, rel=1e-5)  # the padding's e^10 is not counted


ADV = torch.tensor([[1.0, -2.0, 0.5], [-1.0, 3.0, 7.0], [2.0, 1.0, 7.0]])


@pytest.mark.parametrize("name", list(EXPECTED))
def test_seam_gradient_is_the_advantage_times_the_weight(name):
    """One optimizer step per batch (old = None: the proximal policy is the current one, ratio 1): PPO's clipped
    loss at token-mean is -1/N sum_t w_t A_t r_t, so d loss / d logp_t = -w_t A_t / N, N = 7 sampled tokens
    (masked tokens keep their place in the normaliser)."""
    prox, behav = _logps()
    logp = prox.clone().requires_grad_(True)
    obj = policy_objective(logp, None, None, ADV, MASK, AggContext(3, 7, 3), policy_loss="ppo_clip",
                           aggregation="token-mean", kl_estimator="k3", kl_coef=0.0, kl_placement="none",
                           behav_logp=behav, correction=name, correction_cap=CAP)
    obj.loss.backward()
    want = -torch.tensor(EXPECTED[name][0]) * ADV * MASK / 7
    assert torch.allclose(logp.grad, want, atol=1e-6), (logp.grad, want)
    assert obj.offpolicy.weights.truncated == EXPECTED[name][1]


@pytest.mark.parametrize("loss", ["ppo_clip", "cispo", "sft_nll"])
@pytest.mark.parametrize("name", ["token_tis", "seq_mask"])
def test_every_policy_loss_gets_the_weight(loss, name):
    """With stale old log-probs (ratios off 1, some clipped), each registered loss corrected equals the same loss
    given the advantages times the weights by hand: the seam applies it, not the loss."""
    assert loss in POLICY_LOSSES
    prox, behav = _logps()
    torch.manual_seed(0)
    logp = (prox + 0.3 * torch.randn_like(prox)).requires_grad_(True)
    common = dict(policy_loss=loss, aggregation="seq-mean-token-mean", kl_estimator="k3", kl_coef=0.0,
                  kl_placement="none", eps_low=0.2, eps_high=0.28)
    ctx = AggContext(3, 7, 3)
    got = policy_objective(logp, prox, None, ADV, MASK, ctx, behav_logp=behav, correction=name, correction_cap=CAP,
                           **common)
    by_hand = policy_objective(logp, prox, None, ADV * torch.tensor(EXPECTED[name][0]), MASK, ctx, **common)
    assert got.loss.item() == pytest.approx(by_hand.loss.item(), rel=1e-6)
    assert abs(got.loss.item() - policy_objective(logp, prox, None, ADV, MASK, ctx, **common).loss.item()) > 1e-3


def test_none_with_behaviour_log_probs_leaves_the_loss_bit_for_bit():
    prox, behav = _logps()
    logp = prox + 0.1
    ctx = AggContext(3, 7, 3)
    common = dict(policy_loss="ppo_clip", aggregation="seq-mean-token-mean", kl_estimator="k3", kl_coef=0.0,
                  kl_placement="none")
    a = policy_objective(logp, prox, None, ADV, MASK, ctx, **common)
    b = policy_objective(logp, prox, None, ADV, MASK, ctx, behav_logp=behav, correction="none", **common)
    assert torch.equal(a.loss, b.loss) and a.offpolicy is None and b.offpolicy is not None
