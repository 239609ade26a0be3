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
  as ``train/kl`` (one estimator whatever the objective uses, so the curves overlay).

Components are given by their registered names (the fields of a resolved ``algorithm`` section,
:func:`algorithms.presets.resolve`); aggregations take the *whole batch's* counts
(:class:`AggContext`), so micro-batch losses add up to the full-batch loss.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

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


class KLReward(NamedTuple):
    token_rewards: torch.Tensor
    """[B, T] ``-kl_coef * kl`` (zero on padding), added to the outcome reward."""
    kl: torch.Tensor
    """[B, T] the per-token KL estimate times the mask."""


def policy_objective(logp: torch.Tensor, old_logp: Optional[torch.Tensor], ref_logp: Optional[torch.Tensor],
                     advantages: torch.Tensor, mask: torch.Tensor, ctx: AggContext, *, policy_loss: str,
                     aggregation: str, kl_estimator: str, kl_coef: float, kl_placement: str,
                     clip_eps: float = 0.2, eps_low: Optional[float] = None, eps_high: Optional[float] = None,
                     ratio_level: str = "token") -> PolicyObjective:
    """The loss of one micro-batch: ``policy_loss(logp, old, A, mask, ctx, agg, settings)`` [+ ``kl_coef *
    agg(kl(logp, ref))``].

    ``logp``, ``old_logp``, ``ref_logp``, ``advantages``, ``mask``: [B, T] for the micro-batch's
    rows; ``ctx``: the whole batch's counts. ``old_logp`` None: the policy that sampled is the
    current one (mu = 1, no KL in the reward), so ``old = logp.detach()``: ratio 1, gradient of
    ``logp``. ``ref_logp`` None: no reference model, no KL term. The KL term is in the loss only
    for ``kl_placement == "loss"`` (``"reward"``: see :func:`kl_reward_token_rewards`). The clip
    range is ``[1 - eps_low, 1 + eps_high]``, each ``clip_eps`` where not given; ``ratio_level``:
    token or sequence (:class:`algorithms.losses.LossSettings`)."""
    agg = AGGREGATIONS.get(aggregation)
    old = old_logp if old_logp is not None else logp.detach()
    settings = LossSettings(clip_eps if eps_low is None else eps_low, clip_eps if eps_high is None else eps_high,
                            ratio_level)
    pg, stats = POLICY_LOSSES.get(policy_loss)(logp, old, advantages, mask, ctx, agg, settings)
    if kl_placement != "loss" or ref_logp is None:
        return PolicyObjective(pg, pg, None, stats)
    kl = agg(KL_ESTIMATORS.get(kl_estimator)(logp, ref_logp), mask, ctx)
    return PolicyObjective(pg + kl_coef * kl, pg, kl, stats)


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
