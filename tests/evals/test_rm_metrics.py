"""Reward-model accuracy and AUC: AUC against brute-force counting over every positive/negative pair."""
import itertools
import random

import pytest

from evals.rm_metrics import accuracy, quality, roc_auc


def brute_auc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y >= 0.5]
    neg = [s for s, y in zip(scores, labels) if y < 0.5]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_by_hand():
    assert roc_auc([0.9, 0.8, 0.1], [1, 1, 0]) == 1.0
    assert roc_auc([0.1, 0.2, 0.9], [1, 1, 0]) == 0.0
    # positives 0.5, 0.7; negatives 0.5, 0.2: pairs (0.5, 0.5) tie = 1/2, the other three wins -> 3.5 / 4
    assert roc_auc([0.5, 0.7, 0.5, 0.2], [1, 1, 0, 0]) == 0.875
    assert roc_auc([0.3, 0.4], [1, 1]) is None and roc_auc([], []) is None


@pytest.mark.parametrize("seed", range(20))
def test_auc_equals_pair_counting_with_ties(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 40)
    scores = [rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) if rng.random() < 0.5 else rng.random() for _ in range(n)]
    labels = [rng.choice([0, 1, 0.3, 0.8]) for _ in range(n)]  # soft labels read as positive when >= 0.5
    if len({y >= 0.5 for y in labels}) < 2:
        labels[0], labels[1] = 1, 0
    assert roc_auc(scores, labels) == pytest.approx(brute_auc(scores, labels), abs=1e-12)


def test_accuracy_and_quality():
    assert accuracy([0.5, 0.49, 0.9, 0.1], [1, 1, 0, 0]) == 0.5  # 0.5 counts as good
    assert accuracy([], []) is None
    assert quality([0.9, 0.2, 0.6], [1, 0, 0]) == {"n": 3, "positives": 1, "acc": pytest.approx(2 / 3), "auc": 1.0}
    with pytest.raises(ValueError):
        roc_auc([0.1], [1, 0])
