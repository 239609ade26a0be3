"""Reward-model quality against exact labels: accuracy at a threshold and ROC AUC (ties count one half).

A reward model's score is compared with the label an exact checker (arith's step checker, a
data set's grader) gives the same step or completion:

- accuracy: the share of items where ``score >= threshold`` (0.5: P(good) of a tag) agrees with
  ``label >= 0.5``;
- AUC: the probability that a randomly drawn positive (label 1) scores above a randomly drawn
  negative (label 0), ties counting one half: the Mann-Whitney U statistic over
  positives x negatives, computed from average ranks in O(n log n). None when one class is
  absent (no pair to compare).

Soft labels (Monte-Carlo completion estimates) are read as positive when >= 0.5.
"""
from __future__ import annotations

from typing import Optional, Sequence


def _binary(labels: Sequence[float]) -> list[bool]:
    return [float(y) >= 0.5 for y in labels]


def roc_auc(scores: Sequence[float], labels: Sequence[float]) -> Optional[float]:
    """P(score of a positive > score of a negative) + 0.5 P(equal), over every positive/negative
    pair; None without both classes."""
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores for {len(labels)} labels")
    pos = _binary(labels)
    n_pos = sum(pos)
    n_neg = len(pos) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    order = sorted(range(len(scores)), key=lambda i: float(scores[i]))
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):  # average ranks (1-based) over runs of equal scores
        j = i
        while j + 1 < len(order) and float(scores[order[j + 1]]) == float(scores[order[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    rank_sum = sum(r for r, p in zip(ranks, pos) if p)
    u = rank_sum - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def accuracy(scores: Sequence[float], labels: Sequence[float], threshold: float = 0.5) -> Optional[float]:
    """Share of items whose ``score >= threshold`` equals ``label >= 0.5``; None for no items."""
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores for {len(labels)} labels")
    if not scores:
        return None
    return sum((float(s) >= threshold) == y for s, y in zip(scores, _binary(labels))) / len(scores)


def quality(scores: Sequence[float], labels: Sequence[float], threshold: float = 0.5) -> dict:
    """``{"n", "positives", "acc", "auc"}`` of scores against exact labels (acc / auc None when undefined)."""
    return {"n": len(scores), "positives": sum(_binary(labels)), "acc": accuracy(scores, labels, threshold),
            "auc": roc_auc(scores, labels)}
