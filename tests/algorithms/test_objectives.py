"""The 2025 objectives' losses against hand-computed numbers and an independent implementation of each paper's formula.

- DAPO's clip-higher (arXiv 2503.14476 eq. 10): -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A);
- GSPO (arXiv 2507.18071 eq. 5-7): the same clip on s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|), one ratio
  per sequence, the loss -1/G sum_i min(s_i A_i, clip(s_i) A_i);
- CISPO (arXiv 2506.13585 eq. 4-5): -1 / sum_i |o_i| sum_i sum_t sg(clip(r_it, 1 - eps_low, 1 + eps_high)) A_it log pi.

Each value and gradient is checked against numbers worked out by hand below, and against a
second implementation written here from the formula (nothing of algorithms.losses), on random
inputs. The hand cases are chosen so that the mutations the issue names fail them: eps_low and
eps_high swapped, GSPO's 1 / |y| dropped, CISPO's stop-gradient removed.
"""
import math

import pytest
import torch

from algorithms.losses import AggContext
from algorithms.objective import policy_objective

NO_KL = dict(kl_estimator="k3", kl_coef=0.0, kl_placement="none")


def run(logp, old, adv, mask, *, policy_loss="ppo_clip", aggregation="seq-mean-token-mean", eps_low=0.2,
        eps_high=0.28, ratio_level="token"):
    """(loss, d loss / d logp, stats) of policy_objective on one micro-batch that is the whole batch."""
    logp = logp.clone().requires_grad_(True)
    ctx = AggContext(num_seqs=logp.shape[0], num_tokens=int(mask.sum()), const_len=logp.shape[1])
    obj = policy_objective(logp, old, None, adv, mask, ctx, policy_loss=policy_loss, aggregation=aggregation,
                           eps_low=eps_low, eps_high=eps_high, ratio_level=ratio_level, **NO_KL)
    obj.loss.backward()
    return obj.loss.item(), logp.grad, obj.stats


# ---------------------------------------------------------------------------- DAPO: clip-higher
def test_clip_higher_by_hand():
    """One row, A = +1 on tokens 0-1 and -1 on tokens 2-3, ratios 1.25, 1.3, 0.75, 0.7; range [0.8, 1.28].
    Token 0 (1.25, A>0): inside, -1.25, gradient -r A = -1.25 (a symmetric 0.2 clip would cut it);
    token 1 (1.3, A>0): above 1.28, -1.28, gradient 0;
    token 2 (0.75, A<0): below 0.8, -min(-0.75, -0.8) = 0.8, gradient 0 (a 0.28 lower side would not cut);
    token 3 (0.7, A<0): below 0.8, 0.8, gradient 0. Mean over the row's 4 tokens."""
    ratios = torch.tensor([[1.25, 1.3, 0.75, 0.7]])
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.5]])
    logp = old + ratios.log()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, grad, st = run(logp, old, adv, torch.ones(1, 4))
    assert loss == pytest.approx((-1.25 - 1.28 + 0.8 + 0.8) / 4, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[-1.25 / 4, 0.0, 0.0, 0.0]]), atol=1e-6)
    assert (st.clipped_low, st.clipped_high) == (2.0, 1.0)  # 0.75 and 0.7 below 0.8; 1.3 above 1.28
    assert st.ratio_max == pytest.approx(1.3, abs=1e-6)
    # the symmetric clip at 0.2 cuts token 0 too: the decoupled range is what changed the number
    sym, _, _ = run(logp, old, adv, torch.ones(1, 4), eps_high=0.2)
    assert sym == pytest.approx((-1.2 - 1.2 + 0.8 + 0.8) / 4, abs=1e-6)


def independent_clip(logp, old, adv, mask, lo, hi):
    """DAPO eq. 10 with seq-mean-token-mean, one token at a time in Python floats."""
    total = 0.0
    for i in range(logp.shape[0]):
        toks = [j for j in range(logp.shape[1]) if mask[i, j] > 0]
        row = 0.0
        for j in toks:
            r = math.exp(logp[i, j].item() - old[i, j].item())
            a = adv[i, j].item()
            row += -min(r * a, min(max(r, 1 - lo), 1 + hi) * a)
        total += row / len(toks)
    return total / logp.shape[0]


def random_batch(seed, B=4, T=6, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    logp = old + spread * torch.randn(B, T, generator=g)
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    mask = torch.ones(B, T)
    for i in range(B):
        mask[i, 2 + i:] = 0.0  # lengths 2, 3, 4, 5
    return logp, old, adv, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clip_higher_matches_an_independent_implementation(seed):
    logp, old, adv, mask = random_batch(seed)
    loss, _, _ = run(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    assert loss == pytest.approx(independent_clip(logp, old, adv, mask, 0.2, 0.28), abs=1e-6)


# ---------------------------------------------------------------------------- GSPO: sequence ratio
def test_gspo_sequence_ratio_by_hand():
    """Row 0: three tokens, log-ratios 3e-4, -1e-4, 1e-4, A = +1; row 1: log-ratios
    -2e-3, 0 and padding, A = -1. s_0 = exp(1e-4) (mean of the three), inside [1 - 3e-4, 1 + 4e-4]:
    loss -s_0, gradient -s_0 / 3 on each of its tokens, over 2 rows. s_1 = exp(-1e-3) < 1 - 3e-4 with
    A < 0: clipped, -min(-s_1, -(1 - 3e-4)) = 1 - 3e-4, gradient 0. Without the 1 / |y| (s_0 = exp(3e-4))
    the gradient is 3 times larger and s_1 = exp(-2e-3)."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.2, 0.0]])
    logp = old + torch.tensor([[3e-4, -1e-4, 1e-4], [-2e-3, 0.0, 7.0]])  # 7.0 sits on padding
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, grad, st = run(logp, old, adv, mask, eps_low=3e-4, eps_high=4e-4, ratio_level="sequence")
    s0, s1 = math.exp(1e-4), math.exp(-1e-3)
    assert loss == pytest.approx((-s0 + (1 - 3e-4)) / 2, abs=1e-7)
    assert torch.allclose(grad, torch.tensor([[-s0 / 6] * 3, [0.0, 0.0, 0.0]]), atol=1e-7)
    # row 1 is clipped below: both of its tokens count; row 0 inside
    assert (st.clipped_low, st.clipped_high) == (2.0, 0.0)
    assert st.ratios.tolist() == pytest.approx([s0, s1], abs=1e-6)  # one ratio per sequence


def independent_gspo(logp, old, adv, mask, lo, hi):
    """GSPO eq. 5-7: s_i = (prod_t pi / pi_old) ** (1 / |y_i|); -1/G sum_i min(s_i A_i, clip(s_i) A_i)."""
    total = 0.0
    for i in range(logp.shape[0]):
        toks = [j for j in range(logp.shape[1]) if mask[i, j] > 0]
        prod = 1.0
        for j in toks:
            prod *= math.exp(logp[i, j].item() - old[i, j].item())
        s = prod ** (1.0 / len(toks))
        a = adv[i, toks[0]].item()
        total += -min(s * a, min(max(s, 1 - lo), 1 + hi) * a)
    return total / logp.shape[0]


def independent_gspo_grad(logp, old, adv, mask, lo, hi):
    """d/d logp of GSPO's loss: -A_i s_i / |y_i| on each token of an unclipped sequence (eq. 10), 0 where the
    clip holds (s_i A_i above the clipped term)."""
    grad = torch.zeros_like(logp)
    B = logp.shape[0]
    for i in range(B):
        toks = [j for j in range(logp.shape[1]) if mask[i, j] > 0]
        s = math.exp(sum(logp[i, j].item() - old[i, j].item() for j in toks) / len(toks))
        a = adv[i, toks[0]].item()
        clipped = (a > 0 and s > 1 + hi) or (a < 0 and s < 1 - lo)
        for j in toks:
            grad[i, j] = 0.0 if clipped else -a * s / len(toks) / B
    return grad


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_gspo_matches_an_independent_implementation(seed):
    logp, old, adv, mask = random_batch(seed, spread=4e-4)  # ratios near the narrow range: some clipped, some not
    loss, grad, st = run(logp, old, adv, mask, eps_low=3e-4, eps_high=4e-4, ratio_level="sequence")
    assert loss == pytest.approx(independent_gspo(logp, old, adv, mask, 3e-4, 4e-4), abs=1e-7)
    assert torch.allclose(grad, independent_gspo_grad(logp, old, adv, mask, 3e-4, 4e-4), atol=1e-6)


# ---------------------------------------------------------------------------- CISPO: clipped IS weight, stop-gradient
def test_cispo_by_hand():
    """Token-mean over 3 tokens; range [0, 1.28] (eps_low 1: no lower bound). Token 0: r = 2, A = +1,
    log pi = -0.5: weight 1.28 (clipped), loss -1.28 * 1 * -0.5 = 0.64, gradient -1.28 A = -1.28 (a
    clipped token keeps its gradient; PPO's clip would give 0). Token 1: r = 1.1 inside, A = +1,
    log pi = -2: loss 2.2, gradient -1.1 (with the weight's gradient, d(-r A log pi) = -A r (log pi + 1)
    = +1.1: the sign flips). Token 2: r = 0.25, A = -1, log pi = -1: no lower bound, weight 0.25,
    loss -0.25, gradient +0.25."""
    logp = torch.tensor([[-0.5, -2.0, -1.0]])
    old = logp - torch.tensor([[2.0, 1.1, 0.25]]).log()
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, grad, st = run(logp, old, adv, torch.ones(1, 3), policy_loss="cispo", aggregation="token-mean",
                         eps_low=1.0, eps_high=0.28)
    assert loss == pytest.approx((0.64 + 2.2 - 0.25) / 3, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[-1.28, -1.1, 0.25]]) / 3, atol=1e-6)
    assert (st.clipped_low, st.clipped_high) == (0.0, 1.0)


def test_cispo_on_policy_is_reinforce():
    """mu = 1 (old = current): every weight is 1, the gradient is -A / N per token, whatever log pi is."""
    logp = torch.tensor([[-0.3, -2.5], [-1.0, -0.1]])
    adv = torch.tensor([[0.5, 0.5], [-2.0, -2.0]])
    loss, grad, _ = run(logp, logp, adv, torch.ones(2, 2), policy_loss="cispo", aggregation="token-mean",
                        eps_low=1.0, eps_high=0.28)
    assert torch.allclose(grad, -adv / 4, atol=1e-7)
    assert loss == pytest.approx(float((-adv * logp).sum() / 4), abs=1e-6)


def independent_cispo(logp, old, adv, mask, lo, hi):
    """MiniMax-M1 eq. 4-5 by hand: value and gradient, token-mean over the batch, the weight a constant."""
    n = mask.sum().item()
    value, grad = 0.0, torch.zeros_like(logp)
    for i in range(logp.shape[0]):
        for j in range(logp.shape[1]):
            if mask[i, j] > 0:
                w = min(max(math.exp(logp[i, j].item() - old[i, j].item()), 1 - lo), 1 + hi)
                value += -w * adv[i, j].item() * logp[i, j].item() / n
                grad[i, j] = -w * adv[i, j].item() / n
    return value, grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cispo_matches_an_independent_implementation(seed):
    logp, old, adv, mask = random_batch(seed, spread=0.5)
    loss, grad, _ = run(logp, old, adv, mask, policy_loss="cispo", aggregation="token-mean", eps_low=1.0,
                        eps_high=0.28)
    want, want_grad = independent_cispo(logp, old, adv, mask, 1.0, 0.28)
    assert loss == pytest.approx(want, abs=1e-6)
    assert torch.allclose(grad, want_grad, atol=1e-6)


# ---------------------------------------------------------------------------- REINFORCE++ and Lite PPO advantages
def test_reinforce_pp_returns_by_hand():
    """REINFORCE++ eq. 8 before the batch normalisation: outcome 1 on the last token, per-token KL rewards
    -beta KL = -0.1, -0.2, -0.3 (row 0, three tokens): A = 1 - 0.6, 1 - 0.5, 1 - 0.3 = 0.4, 0.5, 0.7.
    Row 1 (outcome 0, two tokens, KL rewards -0.5, +0.25): A = -0.25, 0.25; its padding stays 0.
    The baseline variant subtracts the group mean (0.5) from each outcome first: 0.5 and -0.5."""
    from algorithms.advantages import ADVANTAGES, AdvantageInput
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    kl_rewards = torch.tensor([[-0.1, -0.2, -0.3], [-0.5, 0.25, 9.0]])  # 9.0 on padding
    inp = AdvantageInput(rewards=torch.tensor([1.0, 0.0]), mask=mask, n=2, token_rewards=kl_rewards)
    got = ADVANTAGES.get("reinforce_pp")(inp)
    assert torch.allclose(got, torch.tensor([[0.4, 0.5, 0.7], [-0.25, 0.25, 0.0]]), atol=1e-6)
    base = ADVANTAGES.get("reinforce_pp_baseline")(inp)
    assert torch.allclose(base, torch.tensor([[-0.1, 0.0, 0.2], [-0.75, -0.25, 0.0]]), atol=1e-6)


def test_lite_ppo_group_mean_batch_std_by_hand():
    """Groups (1, 0) and (1, 1): group means 0.5 and 1; the batch's rewards 1, 0, 1, 1 have population std
    sqrt(3) / 4. A = +-0.5 / (sqrt(3) / 4 + 1e-4) in group 0, 0 in group 1 (GRPO's group std would give
    +-1 / (0.5 + 1e-4) instead)."""
    from algorithms.advantages import ADVANTAGES, AdvantageInput
    inp = AdvantageInput(rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]), mask=torch.ones(4, 2), n=2)
    a = 0.5 / (math.sqrt(3) / 4 + 1e-4)
    got = ADVANTAGES.get("lite_ppo")(inp)
    assert torch.allclose(got, torch.tensor([[a, a], [-a, -a], [0.0, 0.0], [0.0, 0.0]]), atol=1e-6)
