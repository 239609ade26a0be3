"""Saturating compute curves (ScaleRL, arXiv 2510.13786): fit, seed bootstrap, parameters at their bounds, and a held-out extrapolation check.

The model is ``R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)``: ``R0`` the accuracy at
``C = 0`` (fixed, not fitted), ``A`` the asymptote (bounded to ``[R0, 1]``: accuracies are
fractions), ``B`` the efficiency exponent (bounded to `B_BOUNDS`) and ``C_mid`` the compute
at which half of the gain ``A - R0`` is reached (bounded to ``[min C / MID_SPAN, max C *
MID_SPAN]``). For fixed ``(B, C_mid)`` the model is linear in ``A - R0``, so ``A`` has a
closed-form least-squares value (clipped to its bounds, which is the constrained optimum of a
one-dimensional quadratic). The fit is a grid over ``log B`` x ``log C_mid`` with ``A``
profiled out, then `ZOOMS` finer grids centred on the best point so far (each a quarter of the
previous spacing, clipped to the bounds): deterministic, vectorised over many curves at once
(`fit_curves`), so the bootstrap's refits cost little.

**Bounds.** A parameter whose estimate lies on one of its bounds is not identified by the data
(the optimum wants to go further); one whose bootstrap interval reaches a bound is identified
on one side only. `CurveStudy.flags` names both ("unidentified").

**Extrapolation.** `extrapolation_check` fits the points with ``C <=`` a budget B (default half
the last C), predicts the accuracy at the last (held-out) point and passes when the prediction
is within a stated tolerance of the observed mean there (`TOLERANCE`: 2 accuracy points).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.report.stats import mean_curve

B_BOUNDS = (0.05, 20.0)
MID_SPAN = 100.0  # C_mid within [min C / MID_SPAN, max C * MID_SPAN]
GRID = (61, 81)   # the first grid: log B x log C_mid
ZOOMS = 12        # finer grids (17 x 17, each spacing a quarter of the last) after the first
AT_BOUND = 1e-6   # relative distance (log scale for B, C_mid; absolute for A) that counts as "at"
TOLERANCE = 0.02  # extrapolation check: |predicted - observed| at the held-out point (a fraction)
N_BOOT = 1000     # bootstrap resamples over seeds


@dataclass
class CurveFit:
    """One fitted curve: parameters, residual sum of squares and the points it saw."""
    r0: float
    a: float
    b: float
    c_mid: float
    sse: float
    n_points: int
    c_bounds: tuple = (float("nan"), float("nan"))

    def predict(self, c) -> np.ndarray:
        return predict(c, self.r0, self.a, self.b, self.c_mid)

    def at_bounds(self) -> dict:
        """``{parameter: "lower" | "upper"}`` for the parameters on a bound."""
        return at_bounds(self.r0, self.a, self.b, self.c_mid, self.c_bounds)


@dataclass
class CurveStudy:
    """A fit of the mean curve over seeds, its bootstrap intervals, bound flags and the extrapolation check."""
    fit: CurveFit
    n_seeds: int
    intervals: dict = field(default_factory=dict)   # "a" | "b" | "c_mid" -> (lo, hi)
    n_boot: int = 0
    extrapolation: dict = field(default_factory=dict)
    boot_at_bounds: dict = field(default_factory=dict)   # parameter -> share of refits on a bound
    flags: dict = field(default_factory=dict)            # parameter -> why it is unidentified


def predict(c, r0: float, a: float, b: float, c_mid: float) -> np.ndarray:
    """R(C); R(0) = R0."""
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        g = np.where(c > 0, 1.0 / (1.0 + (c_mid / np.where(c > 0, c, 1.0)) ** b), 0.0)
    return r0 + (a - r0) * g


def at_bounds(r0: float, a: float, b: float, c_mid: float, c_bounds: tuple) -> dict:
    out = {}
    if abs(a - r0) <= AT_BOUND:
        out["a"] = "lower"
    elif abs(a - 1.0) <= AT_BOUND:
        out["a"] = "upper"
    for name, v, (lo, hi) in (("b", b, B_BOUNDS), ("c_mid", c_mid, c_bounds)):
        if np.isfinite(lo) and abs(np.log(v) - np.log(lo)) <= AT_BOUND:
            out[name] = "lower"
        elif np.isfinite(hi) and abs(np.log(v) - np.log(hi)) <= AT_BOUND:
            out[name] = "upper"
    return out


def _profile(c: np.ndarray, y: np.ndarray, r0: np.ndarray, log_b, log_mid):
    """Best ``A - R0`` and the SSE; ``y`` (N, P), ``r0`` (N,), ``log_b`` and ``log_mid`` (N, G)."""
    with np.errstate(over="ignore"):
        g = 1.0 / (1.0 + np.exp(np.exp(log_b)[..., None] * (log_mid[..., None] - np.log(c))))   # (N, G, P)
    t = (y - r0[:, None])[:, None, :]                                         # (N, 1, P)
    gg = (g * g).sum(-1)
    d = np.where(gg > 0, (g * t).sum(-1) / np.where(gg > 0, gg, 1.0), 0.0)
    d = np.clip(d, 0.0, np.maximum(1.0 - r0, 0.0)[:, None])
    sse = ((t - d[..., None] * g) ** 2).sum(-1)
    return d, sse


def fit_curves(c, ys, r0s, chunk: int = 64) -> list[CurveFit]:
    """Fit R(C) to the points ``(c, ys[i])`` of several curves on one C grid (the points with
    C > 0; at least 3), R0 of curve i = ``r0s[i]``; ``chunk`` curves at a time."""
    c = np.asarray(c, float)
    ys = np.atleast_2d(np.asarray(ys, float))
    r0s = np.asarray(r0s, float).reshape(-1)
    pos = c > 0
    c, ys = c[pos], ys[:, pos]
    if c.size < 3:
        raise ValueError(f"need at least 3 points with C > 0 to fit A, B and C_mid, got {c.size}")
    lm = np.array([np.log(c.min() / MID_SPAN), np.log(c.max() * MID_SPAN)])
    out = []
    for lo in range(0, ys.shape[0], chunk):
        out += _fit_chunk(c, ys[lo:lo + chunk], r0s[lo:lo + chunk], lm)
    return out


def _fit_chunk(c: np.ndarray, ys: np.ndarray, r0s: np.ndarray, lm: np.ndarray) -> list[CurveFit]:
    lb = np.log(B_BOUNDS)
    n = ys.shape[0]
    gb, gm = np.meshgrid(np.linspace(*lb, GRID[0]), np.linspace(*lm, GRID[1]), indexing="ij")
    gb, gm = np.broadcast_to(gb.ravel(), (n, gb.size)), np.broadcast_to(gm.ravel(), (n, gm.size))
    step = np.array([(lb[1] - lb[0]) / (GRID[0] - 1), (lm[1] - lm[0]) / (GRID[1] - 1)])
    offs = np.linspace(-2.0, 2.0, 17)
    ob, om = (o.ravel()[None, :] for o in np.meshgrid(offs, offs, indexing="ij"))
    rows = np.arange(n)
    for zoom in range(ZOOMS + 1):
        _, sse = _profile(c, ys, r0s, gb, gm)
        i = np.argmin(sse, axis=1)
        best_b, best_m = gb[rows, i], gm[rows, i]
        if zoom == ZOOMS:
            break
        gb = np.clip(best_b[:, None] + ob * step[0], *lb)
        gm = np.clip(best_m[:, None] + om * step[1], *lm)
        step = step / 4.0
    b, c_mid = np.exp(best_b), np.exp(best_m)
    d, sse = _profile(c, ys, r0s, best_b[:, None], best_m[:, None])
    bounds = (float(np.exp(lm[0])), float(np.exp(lm[1])))
    return [CurveFit(r0=float(r0s[k]), a=float(r0s[k] + d[k, 0]), b=float(b[k]), c_mid=float(c_mid[k]),
                     sse=float(sse[k, 0]), n_points=int(c.size), c_bounds=bounds) for k in range(n)]


def _r0_of(c: np.ndarray, y: np.ndarray, r0):
    if r0 is not None:
        return float(r0)
    if not (c == 0).any():
        raise ValueError("no C = 0 point to take R0 from; pass r0")
    return float(y[c == 0].mean())


def fit_curve(c, y, r0: float | None = None) -> CurveFit:
    """Fit R(C) to points ``(c, y)``. ``R0`` is the mean ``y`` at ``c == 0`` unless given;
    the fit uses the points with ``c > 0`` (at least 3 are needed)."""
    c, y = np.asarray(c, float), np.asarray(y, float)
    ok = np.isfinite(c) & np.isfinite(y)
    c, y = c[ok], y[ok]
    return fit_curves(c, y[None, :], [_r0_of(c, y, r0)])[0]


def extrapolation_check(c, y, r0: float | None = None, budget: float | None = None, fit_upto: float | None = None,
                        tolerance: float = TOLERANCE) -> dict:
    """Fit on the points with ``C <= fit_upto`` (default ``budget / 2``, ``budget`` the largest
    C by default), predict the accuracy at the last point (held out) and compare with the
    observed value there. Returns ``{"fit_upto", "at", "predicted", "observed", "error",
    "tolerance", "passed"}`` (error = predicted - observed; passed: |error| <= tolerance), or
    ``{"error": nan, "passed": None, "reason": ...}`` when too few points are left to fit."""
    c, y = np.asarray(c, float), np.asarray(y, float)
    budget = float(c.max()) if budget is None else float(budget)
    upto = budget / 2.0 if fit_upto is None else float(fit_upto)
    last = int(np.argmax(c))
    keep = c <= upto
    base = {"fit_upto": upto, "at": float(c[last]), "observed": float(y[last]), "tolerance": float(tolerance)}
    if c[last] <= upto:
        return {**base, "predicted": float("nan"), "error": float("nan"), "passed": None,
                "reason": "no held-out point after the fitted budget"}
    try:
        f = fit_curve(c[keep], y[keep], _r0_of(c, y, r0) if r0 is not None or (c == 0).any() else None)
    except ValueError as e:
        return {**base, "predicted": float("nan"), "error": float("nan"), "passed": None, "reason": str(e)}
    pred = float(f.predict(c[last]))
    err = pred - float(y[last])
    return {**base, "predicted": pred, "error": err, "passed": bool(abs(err) <= tolerance), "fit": f}


def _on_grid(cx, cy, grid: np.ndarray) -> np.ndarray:
    """One seed's curve on the mean curve's grid (linear interpolation; the last value at a repeated C)."""
    cx, cy = np.asarray(cx, float), np.asarray(cy, float)
    ok = np.isfinite(cx) & np.isfinite(cy)
    cx, cy = cx[ok], cy[ok]
    order = np.argsort(cx, kind="stable")
    ux, idx = np.unique(cx[order][::-1], return_index=True)
    return np.interp(grid, ux, cy[order][::-1][idx])


def study_curves(curves: list[tuple], n_boot: int = N_BOOT, seed: int = 0, level: float = 0.95,
                 budget: float | None = None, fit_upto: float | None = None,
                 tolerance: float = TOLERANCE) -> CurveStudy:
    """Fit the mean over seeds of per-seed ``(c, y)`` curves (`stats.mean_curve`); bootstrap
    over seeds (``n_boot`` resamples of the curves with replacement, each on the mean curve's
    grid, their mean refitted; ``numpy.random.default_rng(seed)``) for percentile intervals of A,
    B and C_mid and the share of refits on a bound; the bound flags; and
    `extrapolation_check` on the mean curve."""
    mc = mean_curve(curves)
    if mc is None:
        raise ValueError("no points to fit")
    x, m, _, n = mc
    fit = fit_curve(x, m)
    ys = np.stack([_on_grid(cx, cy, x) for cx, cy in curves])
    rng = np.random.default_rng(seed)
    intervals, shares, n_done = {}, {}, 0
    if len(curves) > 1 and n_boot > 0:
        idx = np.sort(rng.integers(0, len(curves), size=(n_boot, len(curves))), axis=1)
        uniq, inverse = np.unique(idx, axis=0, return_inverse=True)   # a resample is a multiset of seeds
        boot = np.nanmean(ys[uniq], axis=1)                      # (distinct resamples, points)
        zero = x == 0
        r0s = boot[:, zero].mean(axis=1) if zero.any() else np.full(len(uniq), fit.r0)
        distinct = fit_curves(x, boot, r0s)
        fits = [distinct[i] for i in np.asarray(inverse).reshape(-1)]
        n_done = len(fits)
        q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
        arr = np.array([(f.a, f.b, f.c_mid) for f in fits])
        intervals = {k: tuple(float(v) for v in np.percentile(arr[:, j], q)) for j, k in enumerate(("a", "b", "c_mid"))}
        flags = [f.at_bounds() for f in fits]
        shares = {k: sum(k in fl for fl in flags) / n_done for k in ("a", "b", "c_mid")}
    study = CurveStudy(fit=fit, n_seeds=n, intervals=intervals, n_boot=n_done, boot_at_bounds=shares,
                       extrapolation=extrapolation_check(x, m, fit.r0, budget, fit_upto, tolerance))
    study.flags = unidentified(study, level)
    return study


def unidentified(study: CurveStudy, level: float = 0.95) -> dict:
    """``{parameter: reason}``: the estimate on a bound, or the bootstrap interval reaching one
    (more than (1 - level) / 2 of the refits on that bound)."""
    out = {k: f"estimate at its {side} bound" for k, side in study.fit.at_bounds().items()}
    for k, share in study.boot_at_bounds.items():
        if k not in out and share > (1 - level) / 2:
            out[k] = f"{100 * share:.0f}% of bootstrap refits at a bound"
    return out
