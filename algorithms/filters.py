"""Sample filters: which rollouts take part in the update. Each returns a bool keep-mask [B].

:func:`informative_groups` is DAPO's group selection (Yu et al., arXiv 2503.14476 eq. 11's constraint
``0 < |{o_i correct}| < G``): the groups whose rewards are not all equal. A group whose rewards are all
equal has advantage 0 under every group-normalised estimator; dynamic sampling
(``harness.train.stage``) drops such groups from the batch and draws others.

A filter only decides which rows are *run*: a dropped row is a row whose gradient coefficient
is 0, and the losses are still normalised by the counts of the whole sampled batch (every
output drawn, kept or not; see ``harness.engine.learner``). So a filter saves the forward and
backward passes of rows that contribute nothing, and never changes the weight of the others.
"""
from __future__ import annotations

import torch

from algorithms.registry import Registry

FILTERS: Registry = Registry("sample filter")


@FILTERS.register("none")
def keep_all(rewards: torch.Tensor, completions: list[str], n: int) -> torch.Tensor:
    return torch.ones(len(completions), dtype=torch.bool)


@FILTERS.register("correct", "correct_only")
def correct(rewards: torch.Tensor, completions: list[str], n: int) -> torch.Tensor:
    """Online RFT as DeepSeekMath §5.2.1 defines it: gradient coefficient I(o) = 1 on every
    correct sampled output (reward > 0), duplicates included, 0 on the others. With the loss
    normalised by the number of sampled outputs, a prompt weighs by how many of its samples
    were correct."""
    return torch.as_tensor(rewards).reshape(-1)[: len(completions)] > 0


@FILTERS.register("correct_dedup")
def correct_dedup(rewards: torch.Tensor, completions: list[str], n: int) -> torch.Tensor:
    """RFT with de-duplication (Yuan et al., 2023's distinct reasoning paths): the first copy of
    each distinct correct text of a group (groups of ``n`` consecutive rows) is kept; its
    duplicates and the incorrect outputs get coefficient 0. A variant: not DeepSeekMath's rule."""
    keep = torch.zeros(len(completions), dtype=torch.bool)
    for g in range(0, len(completions), n):
        seen: set[str] = set()
        for i in range(g, min(g + n, len(completions))):
            if rewards[i] > 0 and completions[i] not in seen:
                seen.add(completions[i])
                keep[i] = True
    return keep


def informative_groups(rewards: torch.Tensor, n: int) -> torch.Tensor:
    """bool [B // n]: the groups (``n`` consecutive rows) whose rewards are not all equal."""
    r = torch.as_tensor(rewards, dtype=torch.float32).reshape(-1, n)
    return r.max(1).values > r.min(1).values


def zero_variance_share(rewards: torch.Tensor, n: int) -> float:
    """Share of the groups whose rewards are all equal (0 for an empty batch)."""
    keep = informative_groups(rewards, n)
    return float((~keep).float().mean().item()) if keep.numel() else 0.0
