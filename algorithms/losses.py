"""Per-token policy losses, KL estimators, aggregations and the value loss.

A policy loss (``POLICY_LOSSES``) takes the micro-batch's log-probs, old log-probs, advantages and
completion mask, the whole batch's counts (:class:`AggContext`), the aggregation to apply and its
:class:`LossSettings` (the clip range ``[1 - eps_low, 1 + eps_high]``, the ratio per token or per
sequence), and returns the aggregated loss with its own clip statistics (:class:`PolicyLossOut`).
KL estimators return ``[B, T]`` tensors. Aggregation (how the tokens become one number) is
separate, as in verl, and takes the *whole batch's* counts so gradient accumulation over
micro-batches gives exactly the full-batch loss.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from algorithms.presets import RATIO_LEVELS
from algorithms.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")
KL_ESTIMATORS: Registry = Registry("KL estimator")
AGGREGATIONS: Registry = Registry("loss aggregation")


@dataclass(frozen=True)
class LossSettings:
    """What a policy loss is told besides the tensors: the clip range ``[1 - eps_low, 1 + eps_high]``
    (DAPO's decoupled clip, arXiv 2503.14476 eq. 10; PPO's symmetric clip when equal) and the level
    of the importance ratio, ``token`` (PPO, GRPO) or ``sequence`` (GSPO, arXiv 2507.18071 eq. 7)."""
    eps_low: float = 0.2
    eps_high: float = 0.2
    ratio_level: str = "token"


@dataclass
class RatioStats:
    """A policy loss's own clip statistics (no gradient), at the level its ratio lives on, counted
    in masked tokens (a clipped sequence counts all its tokens), so they sum over micro-batches."""
    clipped_low: float
    """Masked tokens whose ratio is below ``1 - eps_low``."""
    clipped_high: float
    """Masked tokens whose ratio is above ``1 + eps_high``."""
    ratio_max: float
    """Largest ratio on a masked token (0 when none: the max of ``ratio * mask``)."""
    ratios: torch.Tensor
    """The ratios themselves, detached, 1-D: one per masked token, or one per sequence with a token
    (sequence level), for quantiles."""


class PolicyLossOut(NamedTuple):
    loss: torch.Tensor
    """The aggregated loss of the micro-batch (what is back-propagated, before any KL term)."""
    stats: RatioStats


Aggregate = Callable[[torch.Tensor, torch.Tensor, "AggContext"], torch.Tensor]


def token_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """r_t = exp(log pi - log pi_old) per token, [B, T] (PPO)."""
    return torch.exp(logp - old_logp)


def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|) = exp(1/|y_i| sum_t log r_t) (arXiv 2507.18071
    eq. 7: the geometric mean of the token ratios, length-normalised), broadcast to [B, T]."""
    mask = mask.to(logp.dtype)
    log_s = ((logp - old_logp) * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp_min(1)
    return torch.exp(log_s).expand_as(logp)


def ratio_of(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, s: LossSettings) -> torch.Tensor:
    """The importance ratio at ``s.ratio_level``, [B, T] (a sequence's ratio on each of its tokens)."""
    if s.ratio_level == "token":
        return token_ratio(logp, old_logp)
    if s.ratio_level == "sequence":
        return sequence_ratio(logp, old_logp, mask)
    raise ValueError(f"unknown ratio level '{s.ratio_level}'; valid: {', '.join(RATIO_LEVELS)}")


def ratio_stats(ratio: torch.Tensor, mask: torch.Tensor, s: LossSettings) -> RatioStats:
    """Clip statistics of ``ratio`` [B, T] (as :func:`ratio_of` returns it) against ``s``'s range.
    Below/above are tested as ``1 - r > eps_low`` / ``r - 1 > eps_high``, so with eps_low = eps_high
    their sum is the ``|r - 1| > eps`` count of the earlier ``train/clip_frac``, bit for bit."""
    with torch.no_grad():
        ratio, mask = ratio.detach(), mask.to(ratio.dtype)
        d = ratio - 1
        low = ((-d) > s.eps_low).to(ratio.dtype) * mask
        high = (d > s.eps_high).to(ratio.dtype) * mask
        if s.ratio_level == "sequence":
            ratios = ratio[:, 0][mask.sum(1) > 0]
        else:
            ratios = ratio[mask.bool()]
        return RatioStats(low.sum().item(), high.sum().item(), (ratio * mask).max().item() if mask.numel() else 0.0,
                          ratios.float())


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, ctx: "AggContext",
             agg: Aggregate, s: LossSettings) -> PolicyLossOut:
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), aggregated by ``agg``. r: the token ratio
    (PPO; DAPO's clip-higher with eps_low < eps_high, arXiv 2503.14476 eq. 10) or GSPO's sequence ratio
    s_i on every token of sequence i (arXiv 2507.18071 eq. 5: -1/G sum_i min(s_i A_i, clip(s_i) A_i)
    with seq-mean-token-mean aggregation)."""
    ratio = ratio_of(logp, old_logp, mask, s)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - s.eps_low, 1.0 + s.eps_high) * adv
    return PolicyLossOut(agg(-torch.minimum(unclipped, clipped), mask, ctx), ratio_stats(ratio, mask, s))


@POLICY_LOSSES.register("sft_nll")
def sft_nll(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, ctx: "AggContext",
            agg: Aggregate, s: LossSettings) -> PolicyLossOut:
    """Supervised NLL weighted by the advantage (online RFT: weight 1 on kept tokens); its ratio
    statistics are the token ratio's, as a diagnostic only."""
    return PolicyLossOut(agg(-logp * adv, mask, ctx), ratio_stats(ratio_of(logp.detach(), old_logp, mask, s), mask, s))


@POLICY_LOSSES.register("cispo")
def cispo(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, ctx: "AggContext",
          agg: Aggregate, s: LossSettings) -> PolicyLossOut:
    """CISPO (MiniMax-M1, arXiv 2506.13585 eq. 4-5): -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi, a
    REINFORCE term weighted by the clipped importance weight under a stop-gradient, so a clipped
    token keeps its gradient A * w (PPO's clip zeroes it). The paper's normaliser is the batch's
    tokens (token-mean); eps_low >= 1 puts no lower bound on the weight, as the paper does."""
    ratio = ratio_of(logp, old_logp, mask, s)
    weight = torch.clamp(ratio, 1.0 - s.eps_low, 1.0 + s.eps_high).detach()
    return PolicyLossOut(agg(-weight * adv * logp, mask, ctx), ratio_stats(ratio, mask, s))


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_ref (Schulman's k1; unbiased, high variance, can be negative)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """0.5 (log pi - log pi_ref)^2."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """pi_ref/pi - log(pi_ref/pi) - 1 (DeepSeekMath eq. 4; unbiased and >= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


@dataclass(frozen=True)
class AggContext:
    """Whole-batch counts, so micro-batch partial sums add up to the full-batch loss."""
    num_seqs: int
    num_tokens: int
    const_len: int


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor, ctx: AggContext) -> torch.Tensor:
    """Mean over each output's tokens, then mean over outputs (DeepSeekMath's GRPO objective)."""
    mask = mask.to(x.dtype)
    per_seq = (x * mask).sum(1) / mask.sum(1).clamp_min(1)
    return per_seq.sum() / max(ctx.num_seqs, 1)


@AGGREGATIONS.register("token-mean")
def token_mean(x: torch.Tensor, mask: torch.Tensor, ctx: AggContext) -> torch.Tensor:
    """Mean over every token of the batch (long outputs weigh more)."""
    return (x * mask.to(x.dtype)).sum() / max(ctx.num_tokens, 1)


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(x: torch.Tensor, mask: torch.Tensor, ctx: AggContext) -> torch.Tensor:
    """Dr. GRPO: token sums divided by a constant (max completion length), mean over outputs."""
    return (x * mask.to(x.dtype)).sum() / (max(ctx.num_seqs, 1) * max(ctx.const_len, 1))


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       clip: float) -> torch.Tensor:
    """0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2), per token."""
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * torch.maximum((values - returns) ** 2, (v_clipped - returns) ** 2)
