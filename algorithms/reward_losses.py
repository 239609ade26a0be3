"""Reward-model losses as pure functions: the step-tag cross-entropy (Math-Shepherd) and PRIME's implicit PRM.

- **Step tags** (Math-Shepherd, Wang et al. 2023): a causal LM reads the solution with a tag after
  each step (one tag after the whole completion for an outcome RM); its score there is
  P(good) = softmax(l_good, l_bad)[good] = sigmoid(l_good - l_bad). Training is the binary
  cross-entropy of that probability against the step's label (0 or 1, or a soft label).
- **Implicit PRM** (PRIME, Cui et al. 2025, arXiv 2502.01456): an LM pi_phi and a frozen
  reference pi_ref. The outcome logit of a response is beta * sum_t log(pi_phi(y_t) / pi_ref(y_t));
  the loss is the cross-entropy of sigmoid(that) against the outcome label, so no step label is
  needed; the process reward of token t is beta * log(pi_phi(y_t) / pi_ref(y_t)).

Every function takes tensors and returns tensors; nothing here knows a model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def tag_probability(margin: torch.Tensor) -> torch.Tensor:
    """P(good) at a tag from ``margin`` = l_good - l_bad (the two-way softmax)."""
    return torch.sigmoid(margin)


def tag_bce(margin: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of P(good) = sigmoid(margin) against ``labels`` in [0, 1], over
    the tags given (``margin`` and ``labels`` of the same shape; an empty batch is 0)."""
    if margin.numel() == 0:
        return margin.sum() * 0.0
    return F.binary_cross_entropy_with_logits(margin.float(), labels.float().to(margin.device))


def implicit_token_rewards(logp_rm: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor,
                           beta: float) -> torch.Tensor:
    """[B, T] process reward of every token: beta * (log pi_rm - log pi_ref), zero on padding."""
    return beta * (logp_rm - logp_ref) * mask.to(logp_rm.dtype)


def implicit_outcome_logit(logp_rm: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor,
                           beta: float) -> torch.Tensor:
    """[B] the implicit reward of each response: beta * sum_t log(pi_rm / pi_ref) over its tokens."""
    return implicit_token_rewards(logp_rm, logp_ref, mask, beta).sum(1)


def implicit_prm_loss(logp_rm: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
                      beta: float, num_seqs: int | None = None) -> torch.Tensor:
    """PRIME's cross-entropy: -[y log s + (1 - y) log(1 - s)], s = sigmoid(beta * sum_t log ratio),
    summed over the responses given and divided by ``num_seqs`` (default: their number), so
    micro-batches with the whole batch's count accumulate to the batch mean."""
    z = implicit_outcome_logit(logp_rm, logp_ref, mask, beta)
    total = F.binary_cross_entropy_with_logits(z.float(), labels.float().to(z.device), reduction="sum")
    return total / float(num_seqs if num_seqs is not None else max(z.shape[0], 1))
