"""Sampling metrics: pass@k, maj@k, accuracy, and their aggregation over problems.

pass@k (Chen et al., 2021): with ``n`` samples of which ``c`` are correct, the probability
that at least one of ``k`` samples drawn without replacement is correct,
``1 - C(n-c, k) / C(n, k)``, computed as the product ``prod_{i=n-c+1}^{n} (1 - k/i)`` (no
huge binomials).

maj@k: the accuracy of the majority answer among ``k`` samples, averaged over *all*
``C(n, k)`` subsets of the ``n`` samples. The average is computed exactly by counting
(multivariate hypergeometric over the answer groups) rather than by enumerating subsets, so
it is exact (to float64 rounding) for any ``n`` up to :data:`MAJ_EXACT_MAX_N`; above that it is
estimated from ``num_subsets`` random orders of the samples drawn with a seeded generator
(deterministic): the first ``k`` samples of a uniformly random order are a uniformly random
``k``-subset, so one order gives a draw for every ``k`` at once.

Voting rules (deterministic):
  * samples are grouped by their answer *key* (:func:`evals.grading.answer_key`: equal
    normalised answers, plain numbers by exact value); a sample without an answer (key
    ``None``: nothing extracted, or truncated) does not vote;
  * the majority is the key with the most votes in the subset; a tie is broken in favour of
    the key that appears first in the full list of ``n`` samples (sample order), so the rule
    does not depend on correctness and is the same for every subset;
  * a subset with no votes at all scores 0;
  * the majority is correct when any sample carrying that key was graded correct (samples
    with the same key grade alike, except for grader time-outs).
"""
from __future__ import annotations

import math
import random
from typing import Hashable, Optional, Sequence

import numpy as np

__all__ = [
    "MAJ_EXACT_MAX_N", "accuracy", "aggregate_curves", "maj_at_k", "maj_at_k_bruteforce", "maj_at_k_curve",
    "maj_curve_from_groups", "majority_key", "pass_at_k", "pass_at_k_curve", "problem_curves",
]

MAJ_EXACT_MAX_N = 1000
"""Largest ``n`` for which maj@k is computed exactly; larger ``n`` uses random orders. The exact
count of ``k``-subsets reaches ``C(n, n/2)``: about 2.7e299 at 1,000, within float64's range (1.8e308),
which ``C(1030, 515)`` leaves."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate for ``c`` correct out of ``n`` samples (1 <= k <= n)."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_curve(n: int, c: int) -> list[float]:
    """[pass@1, ..., pass@n]."""
    return [pass_at_k(n, c, k) for k in range(1, n + 1)]


def accuracy(correct: Sequence[bool]) -> float:
    """Fraction correct (0.0 for an empty list)."""
    return float(sum(bool(x) for x in correct)) / len(correct) if len(correct) else 0.0


def majority_key(keys: Sequence[Optional[Hashable]], order: Optional[dict] = None) -> Optional[Hashable]:
    """Most frequent non-None key; ties go to the key ranked first in ``order`` (default:
    first appearance in ``keys``). None when no sample has a key."""
    counts: dict = {}
    first: dict = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, i)
    if not counts:
        return None
    rank = order if order is not None else first
    return min(counts, key=lambda q: (-counts[q], rank[q]))


def _groups(keys, correct):
    if len(keys) != len(correct):
        raise ValueError(f"keys and correct differ in length: {len(keys)} vs {len(correct)}")
    order: dict = {}
    sizes: list[int] = []
    good: list[bool] = []
    for key, ok in zip(keys, correct):
        if key is None:
            continue
        if key not in order:
            order[key] = len(order)
            sizes.append(0)
            good.append(False)
        g = order[key]
        sizes[g] += 1
        good[g] = good[g] or bool(ok)
    return order, sizes, good


def maj_at_k_bruteforce(keys: Sequence[Optional[Hashable]], correct: Sequence[bool], k: int) -> float:
    """maj@k by enumerating all C(n, k) subsets (reference implementation for small n)."""
    import itertools
    order, sizes, good = _groups(keys, correct)
    n = len(keys)
    total = hits = 0
    for sub in itertools.combinations(range(n), k):
        total += 1
        maj = majority_key([keys[i] for i in sub], order)
        hits += maj is not None and good[order[maj]]
    return hits / total


def _binom_poly(m: int, upto: int) -> np.ndarray:
    """Coefficients of sum_{x=0}^{min(m, upto)} C(m, x) z^x."""
    return np.array([math.comb(m, x) for x in range(min(m, upto) + 1)], dtype=np.float64)


def _maj_curve_exact(n: int, sizes: list[int], good: list[bool], m_none: int) -> list[float]:
    hits = np.zeros(n + 1, dtype=np.float64)  # hits[k] = number of k-subsets whose majority is correct
    none_poly = _binom_poly(m_none, m_none)
    for c, (m_c, ok) in enumerate(zip(sizes, good)):
        if not ok:
            continue
        for t in range(1, m_c + 1):  # t votes for the correct group c
            poly = none_poly
            for g, m_g in enumerate(sizes):
                if g == c:
                    continue
                # groups ranked before c must have fewer than t votes, those after at most t
                poly = np.convolve(poly, _binom_poly(m_g, t - 1 if g < c else t))[: n - t + 1]
            w = math.comb(m_c, t)
            hits[t: t + len(poly)] += w * poly
    return [float(hits[k] / math.comb(n, k)) for k in range(1, n + 1)]


def maj_curve_from_groups(n: int, sizes: Sequence[int], good: Sequence[bool], m_none: int) -> list[float]:
    """[maj@1, ..., maj@n], exact, from the answer groups alone: their sizes and whether each is
    right, in order of first appearance (it breaks ties), and the samples without an answer."""
    return _maj_curve_exact(n, list(sizes), list(good), m_none)


def _maj_curve_sampled(keys, correct, num_subsets: int, seed: int) -> list[float]:
    """maj@k for every k from ``num_subsets`` random orders of the samples: the majority of each order's first k
    samples, kept up to date as k grows (one vote changes one count, so the majority either stays or becomes the
    key just voted for): O(n) per order for all k together."""
    order, sizes, good = _groups(keys, correct)
    n = len(keys)
    group = [None if q is None else order[q] for q in keys]  # group index = rank of first appearance
    rng = random.Random(seed)
    hits = [0] * n
    idx = list(range(n))
    for _ in range(num_subsets):
        rng.shuffle(idx)
        counts = [0] * len(sizes)
        best = None
        for k, i in enumerate(idx):
            g = group[i]
            if g is not None:
                counts[g] += 1
                if best is None or counts[g] > counts[best] or (counts[g] == counts[best] and g < best):
                    best = g
            if best is not None and good[best]:
                hits[k] += 1
    return [h / num_subsets for h in hits]


def maj_at_k_curve(keys: Sequence[Optional[Hashable]], correct: Sequence[bool], *, method: str = "auto",
                   num_subsets: int = 1000, seed: int = 0) -> list[float]:
    """[maj@1, ..., maj@n] for one problem. ``method``: exact | sampled | auto (exact up to
    :data:`MAJ_EXACT_MAX_N` samples; sampled uses ``num_subsets`` random orders of the samples
    from ``random.Random(seed)``, whose first k samples are the subsets of every k)."""
    n = len(keys)
    if n == 0:
        return []
    if method == "auto":
        method = "exact" if n <= MAJ_EXACT_MAX_N else "sampled"
    if method == "sampled":
        return _maj_curve_sampled(keys, correct, num_subsets, seed)
    if method != "exact":
        raise ValueError(f"method must be exact, sampled or auto, got {method!r}")
    if n > MAJ_EXACT_MAX_N:
        raise ValueError(f"exact maj@k needs n <= {MAJ_EXACT_MAX_N} (its subset counts leave float64's range "
                         f"above), got n={n}: use method='sampled' or 'auto'")
    order, sizes, good = _groups(keys, correct)
    return _maj_curve_exact(n, sizes, good, sum(1 for q in keys if q is None))


def maj_at_k(keys: Sequence[Optional[Hashable]], correct: Sequence[bool], k: int, **kw) -> float:
    """maj@k for one problem (see :func:`maj_at_k_curve`)."""
    if not 1 <= k <= len(keys):
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={len(keys)}")
    return maj_at_k_curve(keys, correct, **kw)[k - 1]


def problem_curves(keys: Sequence[Optional[Hashable]], correct: Sequence[bool], **kw) -> dict:
    """Per-problem summary: ``{"n", "num_correct", "mean_acc", "pass@k": [...], "maj@k": [...]}``."""
    n = len(correct)
    c = sum(bool(x) for x in correct)
    return {"n": n, "num_correct": c, "mean_acc": accuracy(correct),
            "pass@k": pass_at_k_curve(n, c) if n else [], "maj@k": maj_at_k_curve(keys, correct, **kw)}


def aggregate_curves(curves: Sequence[Sequence[float]]) -> list[float]:
    """Element-wise mean over problems of equal-length curves (k = 1..n)."""
    if not curves:
        return []
    lens = {len(c) for c in curves}
    if len(lens) != 1:
        raise ValueError(f"curves of different lengths cannot be averaged: {sorted(lens)}")
    return [float(x) for x in np.mean(np.asarray(curves, dtype=np.float64), axis=0)]
