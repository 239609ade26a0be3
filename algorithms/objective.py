"""GRPO's objective (and PPO's and online RFT's) as pure functions of per-token log-probs.

The learner (``harness.engine.learner``) runs the models and feeds micro-batches; every formula
of the update lives here:

- :func:`policy_objective`: the loss one micro-batch back-propagates, per-token policy loss
  (``POLICY_LOSSES``) aggregated over the batch (``AGGREGATIONS``), plus ``kl_coef`` times the
  aggregated KL to the reference (``KL_ESTIMATORS``) when the KL is placed in the loss
  (GRPO, DeepSeekMath eq. 3);
- :func:`kl_reward_token_rewards`: the per-token reward ``-kl_coef * KL(old || ref)`` when the KL
  is placed in the reward instead (PPO, DeepSeekMath eq. 1-2), for the advantage estimator;
- :func:`value_objective`: PPO's clipped critic loss, aggregated like the policy loss;
- the ratio's clip statistics come from the policy loss itself (``PolicyObjective.stats``,
  :class:`algorithms.losses.RatioStats`), at the level its ratio lives on (token or sequence);
- :func:`reference_kl`: the per-token KL to the reference that every algorithm holding one logs
  as ``train/kl`` (one estimator whatever the objective uses, so the curves overlay);
- off-policy rollouts (``behav_logp``: the sampler's log-probs, the behaviour policy): the
  correction ``algorithms.corrections.CORRECTIONS`` names weighs every token's advantage by the
  proximal/behaviour ratio, truncated or masked, before the policy loss sees it, so every policy
  loss is corrected alike; the mismatch is measured on the way (``PolicyObjective.offpolicy``).

Components are given by their registered names (the fields of a resolved ``algorithm`` section,
:func:`algorithms.presets.resolve`); aggregations take the *whole batch's* counts
(:class:`AggContext`), so micro-batch losses add up to the full-batch loss.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from algorithms.corrections import CORRECTIONS, Mismatch, Weights, mismatch_stats
from algorithms.losses import (AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, AggContext, LossSettings, RatioStats,
                               clipped_value_loss)


class PolicyObjective(NamedTuple):
    loss: torch.Tensor
    """What is back-propagated: ``pg_loss`` (+ ``kl_coef * kl`` with the KL in the loss)."""
    pg_loss: torch.Tensor
    """The aggregated policy (surrogate or SFT) loss."""
    kl: Optional[torch.Tensor]
    """The aggregated KL to the reference; None when the loss holds no KL term."""
    stats: Optional[RatioStats] = None
    """The policy loss's own clip statistics (below / above the range, largest ratio, the ratios)."""
    offpolicy: Optional["OffPolicy"] = None
    """With behaviour log-probs: the correction's weights and the measured mismatch; None otherwise."""


class OffPolicy(NamedTuple):
    weights: Weights
    """The correction's token weights and the tokens it truncated or masked."""
    mismatch: Mismatch
    """The proximal policy against the behaviour one on the micro-batch's tokens."""


class KLReward(NamedTuple):
    token_rewards: torch.Tensor
    """[B, T] ``-kl_coef * kl`` (zero on padding), added to the outcome reward."""
    kl: torch.Tensor
    """[B, T] the per-token KL estimate times the mask."""


def policy_objective(logp: torch.Tensor, old_logp: Optional[torch.Tensor], ref_logp: Optional[torch.Tensor],
                     advantages: torch.Tensor, mask: torch.Tensor, ctx: AggContext, *, policy_loss: str,
                     aggregation: str, kl_estimator: str, kl_coef: float, kl_placement: str,
                     clip_eps: float = 0.2, eps_low: Optional[float] = None, eps_high: Optional[float] = None,
                     ratio_level: str = "token", behav_logp: Optional[torch.Tensor] = None,
                     correction: str = "none", correction_cap: float = 2.0) -> PolicyObjective:
    """The loss of one micro-batch: ``policy_loss(logp, old, A, mask, ctx, agg, settings)`` [+ ``kl_coef *
    agg(kl(logp, ref))``].

    ``logp``, ``old_logp``, ``ref_logp``, ``advantages``, ``mask``: [B, T] for the micro-batch's
    rows; ``ctx``: the whole batch's counts. ``old_logp`` None: the policy that sampled is the
    current one (mu = 1, no KL in the reward), so ``old = logp.detach()``: ratio 1, gradient of
    ``logp``. ``ref_logp`` None: no reference model, no KL term. The KL term is in the loss only
    for ``kl_placement == "loss"`` (``"reward"``: see :func:`kl_reward_token_rewards`). The clip
    range is ``[1 - eps_low, 1 + eps_high]``, each ``clip_eps`` where not given; ``ratio_level``:
    token or sequence (:class:`algorithms.losses.LossSettings`).

    ``behav_logp`` (the behaviour policy's, as the sampler recorded them; None: on-policy, nothing to
    correct): the proximal log-probs are ``old`` (the policy the update started from), the
    ``correction`` (:data:`algorithms.corrections.CORRECTIONS`, cap ``correction_cap``) weighs the
    advantages, and ``offpolicy`` holds the weights and the mismatch."""
    agg = AGGREGATIONS.get(aggregation)
    old = old_logp if old_logp is not None else logp.detach()
    settings = LossSettings(clip_eps if eps_low is None else eps_low, clip_eps if eps_high is None else eps_high,
                            ratio_level)
    off = None
    if behav_logp is not None:
        weights = CORRECTIONS.get(correction)(old, behav_logp, mask, correction_cap)
        off = OffPolicy(weights, mismatch_stats(old, behav_logp, mask))
        if correction != "none":
            advantages = advantages * weights.weight.to(advantages.dtype)
    pg, stats = POLICY_LOSSES.get(policy_loss)(logp, old, advantages, mask, ctx, agg, settings)
    if kl_placement != "loss" or ref_logp is None:
        return PolicyObjective(pg, pg, None, stats, off)
    kl = agg(KL_ESTIMATORS.get(kl_estimator)(logp, ref_logp), mask, ctx)
    return PolicyObjective(pg + kl_coef * kl, pg, kl, stats, off)


def kl_reward_token_rewards(old_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, *,
                            kl_estimator: str, kl_coef: float) -> KLReward:
    """KL placed in the reward: per-token reward ``-kl_coef * kl(old_logp, ref_logp) * mask``, with
    the KL of the policy that sampled (``old_logp``) to the reference, [B, T]."""
    kl = KL_ESTIMATORS.get(kl_estimator)(old_logp, ref_logp) * mask
    return KLReward(-kl_coef * kl, kl)


def value_objective(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                    ctx: AggContext, *, aggregation: str, value_coef: float, value_clip: float) -> torch.Tensor:
    """PPO's critic loss of one micro-batch: ``value_coef * agg(clipped_value_loss(V, V_old, R))``."""
    return value_coef * AGGREGATIONS.get(aggregation)(clipped_value_loss(values, old_values, returns, value_clip),
                                                      mask, ctx)


REFERENCE_KL_ESTIMATOR = "k3"
"""Estimator of the logged ``train/kl`` for every algorithm (k3: unbiased for KL(pi || pi_ref) on
samples of pi, and >= 0 per token), independent of the one an objective optimises."""


def reference_kl(sample_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(sum over the masked tokens of the KL(pi_sample || pi_ref) estimate, number of masked tokens):
    the sampling policy's log-probs ``sample_logp`` against the reference's, [B, T], no gradient.
    Their ratio is ``train/kl``, the mean per-token KL to the reference, the same quantity for
    GRPO (KL in the loss) and PPO (KL in the reward)."""
    with torch.no_grad():
        kl = KL_ESTIMATORS.get(REFERENCE_KL_ESTIMATOR)(sample_logp.detach(), ref_logp.detach()) * mask
        return kl.sum().item(), mask.sum().item()
