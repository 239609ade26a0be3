"""Per-token policy losses, KL estimators, aggregations and the value loss.

All per-token functions return ``[B, T]`` tensors; aggregation (how the tokens become one
number) is separate, as in verl, and takes the *whole batch's* counts so gradient
accumulation over micro-batches gives exactly the full-batch loss.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")
KL_ESTIMATORS: Registry = Registry("KL estimator")
AGGREGATIONS: Registry = Registry("loss aggregation")


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_eps: float) -> torch.Tensor:
    """-min(r A, clip(r, 1-eps, 1+eps) A), r = exp(logp - old_logp)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    return -torch.minimum(unclipped, clipped)


@POLICY_LOSSES.register("sft_nll")
def sft_nll(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_eps: float) -> torch.Tensor:
    """Supervised NLL weighted by the advantage (online RFT: weight 1 on kept tokens)."""
    return -logp * adv


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
