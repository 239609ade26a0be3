"""Off-policy corrections: importance weights of the proximal policy over the behaviour policy, truncated or masked per token or per sequence, and the mismatch they correct.

The sampler's log-probs are the *behaviour* policy's (what drew the tokens: an older copy of the
weights under a staleness k, another precision or kernel); the learner's log-probs at the weights
it starts the update from are the *proximal* policy's (AReaL's decoupled objective, arXiv
2505.24298 eq. 5). A correction (``CORRECTIONS``, named by ``algorithm.correction``) turns the two
into a weight per token, with no gradient, that :func:`algorithms.objective.policy_objective`
multiplies into the advantages, so every registered policy loss gets it (each is linear in the
advantage of a token, and a weight is >= 0, so ``w * min(r A, clip(r) A) = min(r wA, clip(r) wA)``).
A masked token keeps its place in the normaliser (the aggregation's counts are the sampled
tokens'), as a dropped row does. With the token ratio ``rho_t = pi_prox(y_t) / pi_behav(y_t)``, the
sequence ratio ``rho_i = exp(1/|y_i| sum_t log rho_t)`` (the geometric mean, length-normalised)
and the cap ``C``:

- ``none``: weight 1;
- ``token_tis``: truncated importance sampling per token, ``w_t = min(rho_t, C)``;
- ``token_mask``: ``w_t = 1`` where ``1/C <= rho_t <= C``, else 0 (IcePop-style masking);
- ``seq_tis``: ``w_t = min(rho_i, C)`` on every token of sequence i;
- ``seq_mask``: ``w_t = 1`` where ``1/C <= rho_i <= C``, else 0, for every token of sequence i.

:func:`mismatch_stats` measures what there is to correct: the per-token KL of the behaviour policy
to the proximal one (k3 on the sampled tokens), the mean ``|log pi_prox - log pi_behav|`` and the
raw token ratios (before any truncation), for the off-policy diagnostics of a step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from algorithms.presets import CORRECTIONS as CORRECTION_NAMES
from algorithms.registry import Registry

CORRECTIONS: Registry = Registry("off-policy correction")


@dataclass
class Weights:
    """A correction's token weights [B, T] (no gradient; 0 on padding) and how many masked tokens it
    truncated (``truncated``: the weight was cut to C) or masked (``masked``: the weight was set to 0)."""
    weight: torch.Tensor
    truncated: float
    masked: float


Correction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], Weights]


def log_token_ratio(prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log rho_t = log pi_prox - log pi_behav per token, 0 on padding, [B, T], no gradient."""
    return (prox_logp.detach() - behav_logp.detach()) * mask.to(prox_logp.dtype)


def log_sequence_ratio(prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log rho_i = 1/|y_i| sum_t log rho_t per sequence (the log of the geometric mean), broadcast to [B, T]."""
    m = mask.to(prox_logp.dtype)
    log_r = log_token_ratio(prox_logp, behav_logp, mask)
    return (log_r.sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp_min(1)).expand_as(log_r)


def _truncate(log_rho: torch.Tensor, mask: torch.Tensor, cap: float) -> Weights:
    m = mask.to(log_rho.dtype)
    rho = torch.exp(log_rho)
    over = (rho > cap).to(m.dtype) * m
    return Weights(torch.clamp(rho, max=cap) * m, over.sum().item(), 0.0)


def _mask(log_rho: torch.Tensor, mask: torch.Tensor, cap: float) -> Weights:
    m = mask.to(log_rho.dtype)
    rho = torch.exp(log_rho)
    inside = ((rho >= 1.0 / cap) & (rho <= cap)).to(m.dtype) * m
    return Weights(inside, 0.0, (m - inside).sum().item())


@CORRECTIONS.register("none")
def no_correction(prox_logp, behav_logp, mask, cap) -> Weights:
    """Weight 1 on every token."""
    return Weights(torch.ones_like(prox_logp) * mask.to(prox_logp.dtype), 0.0, 0.0)


@CORRECTIONS.register("token_tis")
def token_tis(prox_logp, behav_logp, mask, cap) -> Weights:
    """min(rho_t, C) per token."""
    with torch.no_grad():
        return _truncate(log_token_ratio(prox_logp, behav_logp, mask), mask, cap)


@CORRECTIONS.register("token_mask")
def token_mask(prox_logp, behav_logp, mask, cap) -> Weights:
    """1 where 1/C <= rho_t <= C, else 0."""
    with torch.no_grad():
        return _mask(log_token_ratio(prox_logp, behav_logp, mask), mask, cap)


@CORRECTIONS.register("seq_tis")
def seq_tis(prox_logp, behav_logp, mask, cap) -> Weights:
    """min(rho_i, C) on every token of sequence i (rho_i the geometric mean of its token ratios)."""
    with torch.no_grad():
        return _truncate(log_sequence_ratio(prox_logp, behav_logp, mask), mask, cap)


@CORRECTIONS.register("seq_mask")
def seq_mask(prox_logp, behav_logp, mask, cap) -> Weights:
    """1 on every token of sequence i where 1/C <= rho_i <= C, else 0."""
    with torch.no_grad():
        return _mask(log_sequence_ratio(prox_logp, behav_logp, mask), mask, cap)


assert set(CORRECTIONS.names()) == set(CORRECTION_NAMES), "algorithms.presets.CORRECTIONS lists the registered ones"


@dataclass
class Mismatch:
    """What separates the behaviour policy from the proximal one on a micro-batch's masked tokens (sums,
    so they add over micro-batches): the k3 KL(behav || prox) summed, |log-ratio| summed, the token count,
    the raw token ratios (1-D) and the largest."""
    kl_sum: float
    abs_diff_sum: float
    tokens: float
    ratios: torch.Tensor
    ratio_max: float


def mismatch_stats(prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor) -> Mismatch:
    """:class:`Mismatch` of ``prox_logp`` against ``behav_logp`` ([B, T]) on ``mask``'s tokens, no gradient.
    The KL is k3 with the ratio rho_t: rho_t - 1 - log rho_t (>= 0, unbiased for KL(behav || prox) on tokens
    the behaviour policy drew), computed in float64 as expm1(log rho_t) - log rho_t."""
    with torch.no_grad():
        m = mask.to(torch.float64)
        d = (prox_logp.detach().double() - behav_logp.detach().double()) * m  # log rho_t; float64: the KL of a
        kl = (torch.expm1(d) - d) * m  # bf16-sized mismatch is ~1e-7, below float32's cancellation in e^d - 1 - d
        diff = d.abs()
        ratios = torch.exp(d)[m.bool()].float()
        return Mismatch(kl.sum().item(), diff.sum().item(), m.sum().item(), ratios,
                        ratios.max().item() if ratios.numel() else 0.0)
