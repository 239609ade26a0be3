"""Saturating compute curves (ScaleRL, arXiv 2510.13786): fit, seed bootstrap and an extrapolation check.

The model is ``R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)``: ``R0`` the accuracy at
``C = 0`` (fixed, not fitted), ``A`` the asymptote (bounded to ``[R0, 1]``: accuracies are
fractions), ``B`` the efficiency exponent and ``C_mid`` the compute at which half of the gain
``A - R0`` is reached. For fixed ``(B, C_mid)`` the model is linear in ``A - R0``, so ``A``
has a closed-form least-squares value (clipped to its bounds, which is the constrained
optimum of a one-dimensional quadratic). The fit is a grid over ``log B`` x ``log C_mid``
with ``A`` profiled out, then a bounded Nelder-Mead refine (``scipy.optimize.minimize``) of
the profiled sum of squares from the best grid point.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize

from harness.report.stats import mean_curve

B_BOUNDS = (0.05, 20.0)
MID_SPAN = 100.0  # C_mid within [min C / MID_SPAN, max C * MID_SPAN]


@dataclass
class CurveFit:
    """One fitted curve: parameters, residual sum of squares and the points it saw."""
    r0: float
    a: float
    b: float
    c_mid: float
    sse: float
    n_points: int

    def predict(self, c) -> np.ndarray:
        return predict(c, self.r0, self.a, self.b, self.c_mid)


@dataclass
class CurveStudy:
    """A fit of the mean curve over seeds, its bootstrap intervals and the extrapolation check."""
    fit: CurveFit
    n_seeds: int
    intervals: dict = field(default_factory=dict)   # "a" | "b" | "c_mid" -> (lo, hi)
    n_boot: int = 0
    extrapolation: dict = field(default_factory=dict)


def predict(c, r0: float, a: float, b: float, c_mid: float) -> np.ndarray:
    """R(C); R(0) = R0."""
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        g = np.where(c > 0, 1.0 / (1.0 + (c_mid / np.where(c > 0, c, 1.0)) ** b), 0.0)
    return r0 + (a - r0) * g


def _profile(c: np.ndarray, y: np.ndarray, r0: float, b, c_mid):
    """Best ``A - R0`` and the SSE for broadcastable arrays of ``b`` and ``c_mid``."""
    b, c_mid = np.asarray(b, float)[..., None], np.asarray(c_mid, float)[..., None]
    with np.errstate(over="ignore"):
        g = 1.0 / (1.0 + (c_mid / c) ** b)
    t = y - r0
    gg = (g * g).sum(-1)
    d = np.where(gg > 0, (g * t).sum(-1) / np.where(gg > 0, gg, 1.0), 0.0)
    d = np.clip(d, 0.0, max(1.0 - r0, 0.0))
    sse = ((t - d[..., None] * g) ** 2).sum(-1)
    return d, sse


def fit_curve(c, y, r0: float | None = None) -> CurveFit:
    """Fit R(C) to points ``(c, y)``. ``R0`` is the mean ``y`` at ``c == 0`` unless given;
    the fit uses the points with ``c > 0`` (at least 3 are needed)."""
    c, y = np.asarray(c, float), np.asarray(y, float)
    ok = np.isfinite(c) & np.isfinite(y)
    c, y = c[ok], y[ok]
    if r0 is None:
        if not (c == 0).any():
            raise ValueError("no C = 0 point to take R0 from; pass r0")
        r0 = float(y[c == 0].mean())
    pos = c > 0
    c, y = c[pos], y[pos]
    if c.size < 3:
        raise ValueError(f"need at least 3 points with C > 0 to fit A, B and C_mid, got {c.size}")
    lb = np.log(B_BOUNDS)
    lm = (np.log(c.min() / MID_SPAN), np.log(c.max() * MID_SPAN))
    gb, gm = np.meshgrid(np.linspace(*lb, 61), np.linspace(*lm, 81), indexing="ij")
    _, sse = _profile(c, y, r0, np.exp(gb), np.exp(gm))
    i = np.unravel_index(int(np.argmin(sse)), sse.shape)
    bounds = np.array([lb, lm])

    def objective(p):
        return float(_profile(c, y, r0, np.exp(p[0]), np.exp(p[1]))[1])

    res = minimize(objective, np.array([gb[i], gm[i]]), method="Nelder-Mead", bounds=bounds,
                   options={"xatol": 1e-9, "fatol": 1e-15, "maxiter": 2000})
    best = np.clip(res.x, bounds[:, 0], bounds[:, 1])
    b, c_mid = float(np.exp(best[0])), float(np.exp(best[1]))
    d, sse_best = _profile(c, y, r0, b, c_mid)
    return CurveFit(r0=float(r0), a=float(r0 + d), b=b, c_mid=c_mid, sse=float(sse_best), n_points=int(c.size))


def extrapolation_check(c, y, r0: float | None = None, budget: float | None = None) -> dict:
    """Fit on the points with ``C <= budget / 2`` (``budget``: the largest C by default),
    predict the accuracy at the last point and compare with the observed value there.
    Returns ``{"fit_upto", "at", "predicted", "observed", "error"}`` (error = predicted -
    observed), or ``{"error": nan, "reason": ...}`` when the first half has under 3 points."""
    c, y = np.asarray(c, float), np.asarray(y, float)
    budget = float(c.max()) if budget is None else float(budget)
    last = int(np.argmax(c))
    half = c <= budget / 2.0
    if r0 is None and (c == 0).any():
        r0 = float(y[c == 0].mean())
    try:
        f = fit_curve(c[half], y[half], r0)
    except ValueError as e:
        return {"fit_upto": budget / 2.0, "at": float(c[last]), "predicted": float("nan"),
                "observed": float(y[last]), "error": float("nan"), "reason": str(e)}
    pred = float(f.predict(c[last]))
    return {"fit_upto": budget / 2.0, "at": float(c[last]), "predicted": pred, "observed": float(y[last]),
            "error": pred - float(y[last]), "fit": f}


def _on_grid(cx, cy, grid: np.ndarray) -> np.ndarray:
    """One seed's curve on the mean curve's grid (linear interpolation; the last value at a repeated C)."""
    cx, cy = np.asarray(cx, float), np.asarray(cy, float)
    ok = np.isfinite(cx) & np.isfinite(cy)
    cx, cy = cx[ok], cy[ok]
    order = np.argsort(cx, kind="stable")
    ux, idx = np.unique(cx[order][::-1], return_index=True)
    return np.interp(grid, ux, cy[order][::-1][idx])


def study_curves(curves: list[tuple], n_boot: int = 200, seed: int = 0, level: float = 0.95,
                 budget: float | None = None) -> CurveStudy:
    """Fit the mean over seeds of per-seed ``(c, y)`` curves (`stats.mean_curve`); bootstrap
    over seeds (resample the curves with replacement, each on the mean curve's grid, and
    refit their mean; numpy RNG ``seed``) for percentile intervals of A, B and C_mid; and
    `extrapolation_check` on the mean curve."""
    mc = mean_curve(curves)
    if mc is None:
        raise ValueError("no points to fit")
    x, m, _, n = mc
    fit = fit_curve(x, m)
    ys = np.stack([_on_grid(cx, cy, x) for cx, cy in curves])
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot if len(curves) > 1 else 0):
        idx = rng.integers(0, len(curves), len(curves))
        try:
            f = fit_curve(x, np.nanmean(ys[idx], axis=0))
        except ValueError:
            continue
        draws.append((f.a, f.b, f.c_mid))
    q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
    intervals = {}
    if draws:
        arr = np.array(draws)
        intervals = {k: tuple(float(v) for v in np.percentile(arr[:, j], q)) for j, k in enumerate(("a", "b", "c_mid"))}
    return CurveStudy(fit=fit, n_seeds=n, intervals=intervals, n_boot=len(draws),
                      extrapolation=extrapolation_check(x, m, fit.r0, budget))
