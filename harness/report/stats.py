"""Statistics over seeds: mean and two-sided Student-t confidence interval, per value and per curve.

`mean_ci` is what every table cell and error bar shows: the mean over the finite values and
the half-width ``t_{(1+level)/2, n-1} * s / sqrt(n)`` (``s`` with ddof=1). The t quantile is
scipy's (``scipy.stats.t``). `mean_curve` applies it pointwise to several (x, y) curves.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.stats import t as student_t


def t_cdf(t: float, df: float) -> float:
    """CDF of Student's t distribution (scipy.stats.t)."""
    return float(student_t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """Inverse CDF of Student's t (scipy.stats.t.ppf)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    return float(student_t.ppf(p, df))


def mean_ci(values, level: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width of the two-sided t-interval, n) over the finite values; the
    half-width is NaN for n < 2, everything is NaN for n = 0."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    n = int(v.size)
    if n == 0:
        return float("nan"), float("nan"), 0
    mean = float(v.mean())
    if n < 2:
        return mean, float("nan"), n
    half = t_quantile(0.5 + level / 2.0, n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
    return mean, half, n


def mean_curve(curves: list[tuple[np.ndarray, np.ndarray]]):
    """Pointwise mean and t-interval half-width of several (x, y) curves. Identical x grids
    are averaged point by point; otherwise curves are interpolated onto the union of their
    x values inside the common x range."""
    cleaned = []
    for x, y in curves:
        x, y = np.asarray(x, float), np.asarray(y, float)
        ok = np.isfinite(x) & np.isfinite(y)
        x, y = x[ok], y[ok]
        if x.size == 0:
            continue
        order = np.argsort(x, kind="stable")
        x, y = x[order], y[order]
        ux, idx = np.unique(x[::-1], return_index=True)  # last value at a repeated x
        cleaned.append((ux, y[::-1][idx]))
    if not cleaned:
        return None
    same = all(c[0].shape == cleaned[0][0].shape and np.allclose(c[0], cleaned[0][0]) for c in cleaned)
    if same:
        grid = cleaned[0][0]
        ys = np.stack([c[1] for c in cleaned])
    else:
        lo = max(c[0][0] for c in cleaned)
        hi = min(c[0][-1] for c in cleaned)
        allx = np.unique(np.concatenate([c[0] for c in cleaned]))
        grid = allx[(allx >= lo) & (allx <= hi)] if hi > lo else allx
        ys = np.stack([np.interp(grid, c[0], c[1]) for c in cleaned])
    stats = [mean_ci(ys[:, j]) for j in range(ys.shape[1])]
    return grid, np.array([s[0] for s in stats]), np.array([s[1] for s in stats]), len(cleaned)


def paired_diff_ci(a: dict, b: dict, level: float = 0.95) -> dict:
    """Paired difference ``a - b`` over the keys (seeds) both have with finite values: the
    mean of the per-seed differences and its two-sided t-interval (`mean_ci` of the
    differences, n-1 dof). Pairing removes what the two share per seed (same warm-up, same
    prompts), which two marginal intervals cannot. Returns mean, half, lo, hi, n and the
    seeds used; half/lo/hi are NaN for n < 2."""
    seeds = sorted(k for k in a.keys() & b.keys()
                   if a[k] is not None and b[k] is not None and np.isfinite(a[k]) and np.isfinite(b[k]))
    diffs = [float(a[k]) - float(b[k]) for k in seeds]
    mean, half, n = mean_ci(diffs, level)
    return {"mean": mean, "half": half, "lo": mean - half, "hi": mean + half, "n": n, "seeds": seeds,
            "level": level}


VERDICTS = ("reproduced", "contradicted", "inconclusive")


def verdict(diff: dict, expected_sign: int = 1) -> str:
    """The verdict on a claim that ``a - b`` has ``expected_sign`` (+1: a > b, -1: a < b),
    from a `paired_diff_ci` result: 'reproduced' when the whole interval lies on the expected
    side of 0, 'contradicted' when it lies wholly on the other side, otherwise (including
    fewer than 2 pairs) 'inconclusive'."""
    if expected_sign not in (1, -1):
        raise ValueError(f"expected_sign must be +1 or -1, got {expected_sign}")
    lo, hi = diff["lo"] * expected_sign, diff["hi"] * expected_sign
    lo, hi = min(lo, hi), max(lo, hi)
    if diff["n"] < 2 or not (np.isfinite(lo) and np.isfinite(hi)):
        return "inconclusive"
    if lo > 0:
        return "reproduced"
    if hi < 0:
        return "contradicted"
    return "inconclusive"
