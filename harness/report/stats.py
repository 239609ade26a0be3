"""Statistics over seeds: mean and two-sided Student-t confidence interval, per value and per curve.

`mean_ci` is what every table cell and error bar shows: the mean over the finite values and
the half-width ``t_{(1+level)/2, n-1} * s / sqrt(n)`` (``s`` with ddof=1). The t quantile is
scipy's (``scipy.stats.t``). `mean_curve` applies it pointwise to several (x, y) curves.

For decisions (docs/study.md): `t_pvalues` (the two-sided test of no difference and the TOST
equivalence test within a margin, Student t with n - 1 degrees of freedom), `holm` (Holm's
step-down adjusted p-values), `hierarchical_bootstrap` (resample seeds, then problems: the
paired per-problem differences of each seed; draws from a seeded ``numpy.random.Generator``,
so the same data give the same draws) and `bootstrap_variance` (the same bootstrap's variance
in closed form, i.e. with infinitely many resamples), `percentile_interval`; `problem_variance`
(the test set's own term of a mean's variance, from the seed x problem two-way layout: what the
decisions add to s^2/n) and `holm_parts` (Holm's step-down over parts whose two hypotheses exclude
each other).
"""
from __future__ import annotations

import math
from typing import Optional

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


# --------------------------------------------------------------------------- tests and multiplicity


def t_pvalues(mean: float, se: float, df: float, margin: float = 0.0) -> dict:
    """p-values of a mean difference with standard error ``se`` against Student t with ``df``
    degrees of freedom: ``diff``, two-sided, H0: difference = 0 (``2 (1 - F(|mean| / se))``);
    ``tost``, H0: |difference| >= margin, the larger of the two one-sided p-values
    ``1 - F((mean + margin) / se)`` and ``F((mean - margin) / se)`` (Schuirmann's two one-sided
    tests; NaN without a margin > 0). Without a usable test (``df < 1`` or a non-finite ``se``)
    both are NaN. ``se == 0`` (every seed gave the same difference) is an infinitely large t."""
    nan = float("nan")
    if not (df >= 1 and np.isfinite(se) and np.isfinite(mean) and se >= 0):
        return {"diff": nan, "tost": nan}
    with np.errstate(divide="ignore", invalid="ignore"):
        def z(v):
            return v / se if se > 0 else (math.copysign(math.inf, v) if v != 0 else 0.0)
        diff = 2.0 * float(student_t.sf(abs(z(mean)), df)) if (se > 0 or mean != 0) else 1.0
        tost = nan
        if margin > 0:
            tost = max(float(student_t.sf(z(mean + margin), df)), float(student_t.cdf(z(mean - margin), df)))
    return {"diff": min(1.0, diff), "tost": tost}


def holm(pvalues) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: with the p-values sorted
    ascending, ``adj_(j) = max_{i <= j} min(1, (m - i + 1) p_(i))``; a hypothesis is rejected at
    family-wise level alpha when its adjusted p-value is <= alpha. NaN counts as 1 (a test that
    could not be made rejects nothing but still belongs to the family). Ties keep input order."""
    p = [1.0 if (v is None or not np.isfinite(v)) else float(v) for v in pvalues]
    m = len(p)
    order = sorted(range(m), key=lambda i: (p[i], i))
    out, run = [0.0] * m, 0.0
    for j, i in enumerate(order):
        run = max(run, min(1.0, (m - j) * p[i]))
        out[i] = run
    return out


def holm_parts(pairs) -> tuple:
    """Holm's step-down over *parts* of two hypotheses each that cannot both be true (a
    difference null delta = 0 and an equivalence null |delta| >= margin). ``pairs``: one
    ``(p_a, p_b)`` per part. All 2K p-values are ordered ascending (ties: input order); the one at
    position j is tested at ``alpha / t_j``, ``t_j`` the number of parts with a hypothesis at
    position j or later (a part leaves the count only when both its hypotheses are rejected):
    the most true nulls there can still be, one per part. This is Shaffer's (1986) S1 with the
    logical constraint "at most one true null per part", the closed test of the Bonferroni
    intersection tests that the constraint leaves (partitioning principle). Returns
    ``(adjusted, t)``: per part the adjusted ``(p_a, p_b)`` (``max_{i <= j} min(1, t_i p_(i))``;
    reject at family-wise level alpha when <= alpha) and per part the ``(t_a, t_b)`` of each
    hypothesis's step. NaN counts as 1."""
    flat = [(1.0 if (v is None or not np.isfinite(v)) else float(v), k, h)
            for k, pr in enumerate(pairs) for h, v in enumerate(pr)]
    order = sorted(range(len(flat)), key=lambda i: (flat[i][0], i))
    last = {}
    for j, i in enumerate(order):
        last[flat[i][1]] = j                                  # the part's later hypothesis's position
    adj = [[1.0, 1.0] for _ in pairs]
    steps = [[0, 0] for _ in pairs]
    run = 0.0
    for j, i in enumerate(order):
        p, k, h = flat[i]
        t = sum(1 for v in last.values() if v >= j)
        run = max(run, min(1.0, t * p))
        adj[k][h], steps[k][h] = run, t
    return [tuple(a) for a in adj], [tuple(t) for t in steps]


# --------------------------------------------------------------------------- bootstrap over seeds x problems


def problem_variance(per_seed, crossed: Optional[bool] = None) -> dict:
    """The test set's own term of the variance of a mean over S seeds and P problems, for the
    model ``d_sp = mu + a_s + b_p + e_sp`` (seed effect, problem effect, residual):
    ``Var(mean) = sigma_a^2 / S + sigma_b^2 / P + sigma_e^2 / (S P)``. The sample variance s^2 of
    the per-seed means estimates ``sigma_a^2 + sigma_e^2 / P``, so ``s^2 / S`` already holds the
    residual's term; what it lacks is the problem main effect's ``sigma_b^2 / P``.

    - crossed (every seed scored the same P problems, aligned): two-way analysis of variance
      without replication, ``sigma_b^2`` estimated by ``var_p(Dbar_p) - MS_e / S`` (ddof 1;
      ``Dbar_p`` problem p's mean over seeds, ``MS_e`` the residual mean square over
      ``(S - 1)(P - 1)`` degrees of freedom), floored at 0. With one seed the residual cannot be
      told from the problem effect and all of ``var_p(D_p) / P`` is counted;
    - nested (seeds scored different problems: each seed's mean is over its own sample of the
      problem population): 0, since s^2 / S then already holds the problems' sampling (exact for
      independent problem samples; problem sets that overlap without being equal are not
      covered, and the study's are crossed).

    Returns ``{"var": sigma_b^2 / P, "sigma_b2", "ms_e", "scheme"}``."""
    arrs = _as_seed_arrays(per_seed)
    if all(a.size == 1 for a in arrs):
        return {"var": 0.0, "sigma_b2": 0.0, "ms_e": float("nan"), "scheme": "seeds"}
    if not _crossed_ok(arrs, crossed):
        return {"var": 0.0, "sigma_b2": float("nan"), "ms_e": float("nan"), "scheme": "nested"}
    d = np.stack(arrs)
    s, p = d.shape
    if p < 2:
        return {"var": 0.0, "sigma_b2": 0.0, "ms_e": float("nan"), "scheme": "crossed"}
    col = d.mean(axis=0)
    if s == 1:
        sb2 = float(col.var(ddof=1))
        return {"var": sb2 / p, "sigma_b2": sb2, "ms_e": float("nan"), "scheme": "crossed"}
    resid = d - d.mean(axis=1, keepdims=True) - col[None, :] + d.mean()
    ms_e = float((resid * resid).sum()) / ((s - 1) * (p - 1))
    sb2 = max(0.0, float(col.var(ddof=1)) - ms_e / s)
    return {"var": sb2 / p, "sigma_b2": sb2, "ms_e": ms_e, "scheme": "crossed"}


def _as_seed_arrays(per_seed) -> list[np.ndarray]:
    arrs = [np.atleast_1d(np.asarray(a, dtype=float)) for a in per_seed]
    if not arrs or any(a.size == 0 for a in arrs):
        raise ValueError("need at least one seed, and at least one value per seed")
    return arrs


def _crossed_ok(arrs: list[np.ndarray], crossed: Optional[bool]) -> bool:
    same = len({a.size for a in arrs}) == 1
    if crossed and not same:
        raise ValueError("crossed resampling needs the same problems (in the same order) for every seed")
    return same if crossed is None else bool(crossed)


def bootstrap_variance(per_seed, crossed: Optional[bool] = None) -> dict:
    """The variance of `hierarchical_bootstrap`'s distribution in closed form (the limit of
    infinitely many resamples), split in its seed and problem parts. With ``m_s`` seed s's mean
    over its P_s problems, S seeds, ``pvar`` a population variance (ddof 0):

    - seed part: ``pvar_s(m_s) / S``;
    - nested (problems drawn within each seed independently): problem part
      ``mean_s(pvar_p(D_sp) / P_s) / S``;
    - crossed (one problem draw shared by the seeds of a replicate): problem part
      ``pvar_p(Dbar_p) / P + mean_s(pvar_p(D_sp - Dbar_p)) / (P S)``, ``Dbar_p`` the mean over
      seeds of problem p: the test set's sampling error does not average out over seeds.

    Returns ``{"seed", "problems", "total", "scheme"}``."""
    arrs = _as_seed_arrays(per_seed)
    s = len(arrs)
    means = np.array([a.mean() for a in arrs])
    seed_part = float(means.var()) / s
    if all(a.size == 1 for a in arrs):
        return {"seed": seed_part, "problems": 0.0, "total": seed_part, "scheme": "seeds"}
    if _crossed_ok(arrs, crossed):
        d = np.stack(arrs)
        p = d.shape[1]
        col = d.mean(axis=0)
        prob = float(col.var()) / p + float((d - col).var(axis=1).mean()) / (p * s)
        scheme = "crossed"
    else:
        prob = float(np.mean([a.var() / a.size for a in arrs])) / s
        scheme = "nested"
    return {"seed": seed_part, "problems": prob, "total": seed_part + prob, "scheme": scheme}


def hierarchical_bootstrap(per_seed, n_boot: int, rng: np.random.Generator, crossed: Optional[bool] = None,
                           chunk: int = 1000) -> np.ndarray:
    """``n_boot`` bootstrap draws of the mean over seeds of each seed's mean over problems.
    ``per_seed``: one array per seed of that seed's per-problem values (paired differences);
    a seed given as one number has no problem level.

    Each replicate first draws S seeds with replacement (all replicates' seed draws are taken
    from ``rng`` first, as ``rng.integers(0, S, (n_boot, S))``: with no problem-level spread
    the draws are exactly those of a bootstrap over seeds alone), then problems:

    - ``crossed`` (default when every seed has the same number of problems: the caller passes
      them aligned, the same problem at the same index): one draw of P problems with replacement
      per replicate, shared by its seeds (a test set is one sample of problems, scored by every
      seed);
    - nested (``crossed=False``, or ragged seeds): each drawn seed's problems are redrawn
      independently (its resampled mean from the multinomial counts of its distinct values,
      which is the same distribution as drawing P_s indices).

    Integer-valued data (0/1 correctness, their differences) are summed in integers: the
    draws are exact and the same on every machine."""
    arrs = _as_seed_arrays(per_seed)
    s = len(arrs)
    n_boot = int(n_boot)
    seed_idx = rng.integers(0, s, size=(n_boot, s))
    if all(a.size == 1 for a in arrs):
        vals = np.array([a[0] for a in arrs])
        return vals[seed_idx].mean(axis=1)
    integral = all(np.all(a == np.round(a)) and np.all(np.abs(a) < 2**31) for a in arrs)
    out = np.empty(n_boot)
    if _crossed_ok(arrs, crossed):
        d = np.stack(arrs)
        p = d.shape[1]
        dt = (d.astype(np.int64) if integral else d).T            # (P, S)
        for lo in range(0, n_boot, chunk):
            hi = min(n_boot, lo + chunk)
            idx = rng.integers(0, p, size=(hi - lo, p))
            w = np.bincount((idx + p * np.arange(hi - lo)[:, None]).ravel(), minlength=(hi - lo) * p)
            sums = w.reshape(hi - lo, p) @ dt                          # (chunk, S): per-seed problem sums
            picked = np.take_along_axis(sums, seed_idx[lo:hi], axis=1).sum(axis=1)
            out[lo:hi] = picked / (p * s)
        return out
    sums = np.zeros((n_boot, s))
    for k, a in enumerate(arrs):
        where = seed_idx == k
        n = int(where.sum())
        if not n:
            continue
        u, c = np.unique(a, return_counts=True)
        counts = rng.multinomial(a.size, c / a.size, size=n)
        tot = counts @ (u.astype(np.int64) if integral else u)
        sums[where] = tot / a.size
    return sums.mean(axis=1)


def percentile_interval(draws, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap draws (numpy's linear interpolation between order
    statistics); NaN for no draws."""
    d = np.asarray(draws, float)
    if d.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.percentile(d, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)
