"""Advantage estimators: every one takes the same :class:`AdvantageInput` and returns
per-token advantages ``[B, T]`` (zero on padding), so the trainer never branches on a name.

Conventions (stated, and tested):
- Groups are consecutive: sequence ``i`` belongs to group ``i // n``.
- GRPO's std is the *population* std (ddof = 0) of the group by default, or the *sample* std
  (ddof = 1, ``group_std="sample"``: larger by sqrt(G / (G - 1))), plus ``std_eps``; a group
  whose rewards are all equal gets advantage 0 (its numerator is 0), never NaN.
- :func:`masked_whiten` is the batch whitening of advantages (PPO's default,
  the resolved section's ``whiten_advantages``), applied by the learner after the estimator.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from algorithms.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")


@dataclass
class AdvantageInput:
    rewards: torch.Tensor
    """[B] outcome reward per sequence."""
    mask: torch.Tensor
    """[B, T] completion mask (1 on generated tokens, EOS included)."""
    n: int
    """Group size (samples per prompt); groups are consecutive."""
    step_rewards: list = field(default_factory=list)
    """Per sequence: list of (reward, token index where the step ends) — process supervision."""
    values: Optional[torch.Tensor] = None
    """[B, T] critic values V(s_t) (PPO)."""
    token_rewards: Optional[torch.Tensor] = None
    """[B, T] per-token reward added to the outcome (e.g. -beta * KL when placed in the reward)."""
    std_eps: float = 1e-4
    group_std: str = "population"
    """Std of the group normalisation (grpo, grpo_ps): population (ddof 0) or sample (ddof 1)."""
    gamma: float = 1.0
    lam: float = 0.95


def _broadcast(per_seq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return per_seq[:, None] * mask


GROUP_STDS = ("population", "sample")


def group_std_of(x: torch.Tensor, kind: str, dim=None, keepdim: bool = False) -> torch.Tensor:
    """Population (ddof 0) or sample (ddof 1) standard deviation; the sample std of a single
    value is 0 (no spread seen), not NaN."""
    if kind not in GROUP_STDS:
        raise ValueError(f"unknown group std '{kind}'; valid: {', '.join(GROUP_STDS)}")
    n = x.numel() if dim is None else x.shape[dim]
    if kind == "sample" and n < 2:
        return torch.zeros_like(x.mean() if dim is None else x.mean(dim, keepdim=keepdim))
    corr = 1 if kind == "sample" else 0
    return x.std(correction=corr) if dim is None else x.std(dim, correction=corr, keepdim=keepdim)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Batch whitening over the masked entries, as verl's ``masked_whiten`` and TRL's ``whiten``:
    ``(x - mean) / sqrt(var + eps)`` with the masked mean and the *unbiased* masked variance
    (sum of squares / (n - 1)); zero where ``mask`` is 0. Fewer than 2 masked entries: centred only."""
    mask = mask.to(x.dtype)
    n = mask.sum()
    if n < 1:
        return x * mask
    mean = (x * mask).sum() / n
    if n < 2:
        return (x - mean) * mask
    var = (((x - mean) ** 2) * mask).sum() / (n - 1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def group_view(x: torch.Tensor, n: int) -> torch.Tensor:
    if x.shape[0] % n:
        raise ValueError(f"batch of {x.shape[0]} sequences is not a whole number of groups of {n}")
    return x.view(-1, n)


@ADVANTAGES.register("grpo")
def grpo_outcome(inp: AdvantageInput) -> torch.Tensor:
    """DeepSeekMath eq. (outcome supervision): A_i = (r_i - mean(r)) / (std(r) + eps) on every token
    (std: ``inp.group_std``, population by default)."""
    r = group_view(inp.rewards.float(), inp.n)
    mean = r.mean(1, keepdim=True)
    std = group_std_of(r, inp.group_std, 1, keepdim=True)
    # all-equal group: zero advantage whatever std_eps is (0/0 would be NaN)
    adv = torch.where(std > 0, (r - mean) / (std + inp.std_eps), torch.zeros_like(r))
    return _broadcast(adv.reshape(-1), inp.mask.float())


@ADVANTAGES.register("dr_grpo")
def dr_grpo(inp: AdvantageInput) -> torch.Tensor:
    """Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training"): no std division,
    A_i = r_i - mean(r). (Its length bias fix is the constant-normaliser aggregation.)"""
    r = group_view(inp.rewards.float(), inp.n)
    adv = r - r.mean(1, keepdim=True)
    return _broadcast(adv.reshape(-1), inp.mask.float())


@ADVANTAGES.register("rloo")
def rloo(inp: AdvantageInput) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al., 2024): A_i = r_i - mean_{j != i} r_j
    = n/(n-1) * (r_i - mean(r))."""
    if inp.n < 2:
        raise ValueError("rloo needs samples_per_prompt >= 2")
    r = group_view(inp.rewards.float(), inp.n)
    baseline = (r.sum(1, keepdim=True) - r) / (inp.n - 1)
    return _broadcast((r - baseline).reshape(-1), inp.mask.float())


@ADVANTAGES.register("grpo_ps")
def grpo_process(inp: AdvantageInput) -> torch.Tensor:
    """DeepSeekMath §4.1.3 (process supervision): normalise every step reward with the mean
    and std (population, or sample with ``group_std="sample"``) over all steps of all outputs in
    the group; a token's advantage
    is the sum of the normalised rewards of the steps that end at or after it."""
    B, T = inp.mask.shape
    if len(inp.step_rewards) != B:
        raise ValueError("grpo_ps needs step rewards for every sequence (a task with process rewards)")
    adv = torch.zeros(B, T)
    for g in range(B // inp.n):
        seqs = range(g * inp.n, (g + 1) * inp.n)
        allr = torch.tensor([r for i in seqs for r, _ in inp.step_rewards[i]], dtype=torch.float32)
        if allr.numel() == 0:
            continue
        mean, std = allr.mean(), group_std_of(allr, inp.group_std)
        if std == 0:  # every step of every output scored the same: no signal, zero advantage
            continue
        for i in seqs:
            L = int(inp.mask[i].sum().item())
            row = torch.zeros(T)
            for r, end in inp.step_rewards[i]:
                end = min(int(end), max(L - 1, 0))
                row[: end + 1] += (r - mean) / (std + inp.std_eps)
            adv[i] = row
    return adv.to(inp.mask.device) * inp.mask.float()


def group_token_sums(adv: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """[B // n] the sum of the token advantages of each group (``adv * mask`` over its ``n``
    consecutive rows and their tokens). Zero for a zero-sum estimator; §4.1.3's need not be."""
    return group_view((adv * mask.to(adv.dtype)).sum(1), n).sum(1)


@ADVANTAGES.register("grpo_ps_zerosum")
def grpo_process_zerosum(inp: AdvantageInput) -> torch.Tensor:
    """ABLATION, not the paper's estimator: ``grpo_ps`` (§4.1.3) less, in each group, the mean
    token advantage over the group's tokens, so each group's token advantages sum to zero
    (as outcome GRPO's do for outputs of equal length). Use it with ``algorithm=grpo_ps
    algorithm.advantage=grpo_ps_zerosum``."""
    adv = grpo_process(inp)
    mask = inp.mask.float().to(adv.device)
    tokens = group_view(mask.sum(1), inp.n).sum(1).clamp_min(1.0)
    shift = (group_token_sums(adv, mask, inp.n) / tokens).repeat_interleave(inp.n)
    return (adv - shift[:, None]) * mask


def process_token_rewards(inp: AdvantageInput) -> torch.Tensor:
    """[B, T] the step rewards of ``inp.step_rewards`` placed on the token where each step ends
    (clamped to the sequence's last real token; steps ending on one token add up), zero elsewhere."""
    B, T = inp.mask.shape
    if len(inp.step_rewards) != B:
        raise ValueError("process rewards are needed for every sequence (reward: process)")
    lengths = inp.mask.sum(1).long().tolist()
    rows, cols, vals = [], [], []
    for i, steps in enumerate(inp.step_rewards):
        last = max(lengths[i] - 1, 0)
        for r, end in steps:
            rows.append(i)
            cols.append(min(int(end), last))
            vals.append(float(r))
    out = torch.zeros(B, T)
    if rows:
        out.index_put_((torch.tensor(rows), torch.tensor(cols)), torch.tensor(vals, dtype=torch.float32),
                       accumulate=True)
    return out.to(inp.mask.device) * inp.mask.float()


@ADVANTAGES.register("prime")
def prime(inp: AdvantageInput) -> torch.Tensor:
    """PRIME (Cui et al. 2025, arXiv 2502.01456, eq. 5, gamma = 1): RLOO on the outcome reward plus,
    on every token, the return of the leave-one-out-baselined process rewards::

        A_t^i = sum_{s >= t} (p_s^i - b^i) + r_i - mean_{j != i} r_j,   b^i = mean_{j != i} pbar_j

    where p^i are response i's process rewards on the tokens where they fall
    (:func:`process_token_rewards`; the implicit PRM gives one per token) and pbar_j is response
    j's mean process reward per token (their sum over its length). verl's recipe approximates the
    baseline per token and whitens the result; this is the paper's equation, unwhitened
    (``algorithm.whiten_advantages=true`` adds the whitening)."""
    if inp.n < 2:
        raise ValueError("prime needs samples_per_prompt >= 2 (a leave-one-out baseline)")
    mask = inp.mask.float()
    p = process_token_rewards(inp)
    pbar = group_view(p.sum(1) / mask.sum(1).clamp_min(1.0), inp.n)
    base = ((pbar.sum(1, keepdim=True) - pbar) / (inp.n - 1)).reshape(-1)
    shifted = (p - base[:, None].to(p.device)) * mask
    returns = shifted.flip(-1).cumsum(-1).flip(-1) * mask
    return returns + rloo(inp)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """Generalised advantage estimation over a masked token sequence.

    ``rewards``/``values``/``mask`` are [B, T]; V after the last real token is 0.
    Returns (advantages, returns) with returns = advantages + values."""
    B, T = rewards.shape
    adv = torch.zeros_like(rewards)
    last = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    mask = mask.to(rewards.dtype)
    for t in reversed(range(T)):
        next_v = values[:, t + 1] * mask[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = delta + gamma * lam * last * (mask[:, t + 1] if t + 1 < T else 0.0)
        adv[:, t] = last * mask[:, t]
    return adv, (adv + values) * mask


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al., arXiv 2503.14476 eq. 13), added to the outcome reward before
    the advantages,, per completion [B]: 0 while ``|y| <= L_max - L_cache``; ``((L_max - L_cache) - |y|) / L_cache``
    (from 0 down to -1, linear in the overshoot) for ``L_max - L_cache < |y| <= L_max``; -1 beyond (a
    sampler never goes beyond ``max_len``); times ``factor`` (verl's ``penalty_factor``). ``lengths``:
    completion tokens (EOS included); ``buffer``: L_cache in tokens (0: no penalty)."""
    lengths = lengths.to(torch.float32)
    if buffer <= 0:
        return torch.zeros_like(lengths)
    expected = max_len - buffer
    return factor * torch.clamp((expected - lengths) / buffer, min=-1.0, max=0.0)


def outcome_token_rewards(inp: AdvantageInput) -> torch.Tensor:
    """Outcome reward placed on the last completion token, plus any per-token rewards."""
    mask = inp.mask.float()
    last = (mask.sum(1).long() - 1).clamp_min(0)
    r = torch.zeros_like(mask)
    r[torch.arange(mask.shape[0]), last] = inp.rewards.float()
    if inp.token_rewards is not None:
        r = r + inp.token_rewards * mask
    return r * mask


@ADVANTAGES.register("gae")
def gae_advantage(inp: AdvantageInput) -> torch.Tensor:
    """PPO: GAE on outcome-at-last-token rewards (plus per-token KL penalty) with critic values."""
    if inp.values is None:
        raise ValueError("gae needs critic values (algorithm with a critic)")
    adv, _ = gae(outcome_token_rewards(inp), inp.values.float(), inp.mask, inp.gamma, inp.lam)
    return adv


def returns_to_go(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] sum over s >= t of the (masked) per-token rewards: the undiscounted return (gamma = 1)."""
    mask = mask.to(token_rewards.dtype)
    return (token_rewards * mask).flip(-1).cumsum(-1).flip(-1) * mask


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(inp: AdvantageInput) -> torch.Tensor:
    """REINFORCE++ (Hu, arXiv 2501.03262 eq. 8-9): A_t = r(o) - beta sum_{i >= t} KL(i), the outcome
    reward on the last token plus the per-token KL reward ``inp.token_rewards`` (-beta * k1 of the
    sampling policy to the reference, with the KL placed in the reward), summed from t to the end.
    Its global-batch normalisation (eq. 10) is the learner's whitening over the batch's tokens
    (``whiten_advantages``, :func:`masked_whiten`)."""
    return returns_to_go(outcome_token_rewards(inp), inp.mask.float())


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline(inp: AdvantageInput) -> torch.Tensor:
    """REINFORCE++-baseline (arXiv 2501.03262, the variant for groups of samples): the outcome reward
    less its group's mean, then as :func:`reinforce_pp` (KL returns, then the batch whitening)."""
    r = group_view(inp.rewards.float(), inp.n)
    return reinforce_pp(replace(inp, rewards=(r - r.mean(1, keepdim=True)).reshape(-1)))


@ADVANTAGES.register("lite_ppo")
def group_mean_batch_std(inp: AdvantageInput) -> torch.Tensor:
    """Lite PPO (Liu et al., arXiv 2508.08221, "group-level mean, batch-level std"):
    A_i = (r_i - mean(group of i)) / (std(r over the batch) + std_eps), std as ``inp.group_std``
    (population by default) over every reward of the batch (this rank's); a batch whose rewards
    are all equal gets advantage 0."""
    flat = inp.rewards.float()
    r = group_view(flat, inp.n)
    std = group_std_of(flat, inp.group_std)
    centred = (r - r.mean(1, keepdim=True)).reshape(-1)
    adv = centred / (std + inp.std_eps) if std > 0 else torch.zeros_like(centred)
    return _broadcast(adv, inp.mask.float())


@ADVANTAGES.register("none", "ones")
def ones(inp: AdvantageInput) -> torch.Tensor:
    """Coefficient 1 on every kept token (online RFT's SFT loss)."""
    return inp.mask.float().clone()
