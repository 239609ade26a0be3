"""Sample filters: which rollouts take part in the update. Each returns a bool keep-mask [B]."""
from __future__ import annotations

import torch

from algorithms.registry import Registry

FILTERS: Registry = Registry("sample filter")


@FILTERS.register("none")
def keep_all(rewards: torch.Tensor, completions: list[str], n: int) -> torch.Tensor:
    return torch.ones(len(completions), dtype=torch.bool)


@FILTERS.register("correct_only")
def correct_only(rewards: torch.Tensor, completions: list[str], n: int) -> torch.Tensor:
    """Online RFT (DeepSeekMath §5.2.1 / Yuan et al., 2023): keep correct completions, each
    distinct text once per group; a group with no correct completion contributes nothing."""
    keep = torch.zeros(len(completions), dtype=torch.bool)
    for g in range(0, len(completions), n):
        seen: set[str] = set()
        for i in range(g, min(g + n, len(completions))):
            if rewards[i] > 0 and completions[i] not in seen:
                seen.add(completions[i])
                keep[i] = True
    return keep
