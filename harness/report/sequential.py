"""Group-sequential boundaries over seeds: alpha spending (Lan-DeMets), classical Pocock / O'Brien-Fleming constants, sequential p-values.

A claim of the study may be examined at several planned *looks* (after 3, 4, ..., 10 seeds,
say) and stop as soon as it is decided. Testing at every look at the fixed level alpha would
reject a true null far more often than alpha; a group-sequential test spends alpha over the
looks instead. With the statistic at look k standardised as ``Z_k`` (information fraction
``t_k``, here seeds at the look / the cap), the continuation region at look k is
``|Z_k| < c_k`` (two-sided) or ``Z_k < c_k`` (one-sided), and the ``c_k`` are chosen so that
the probability under the null of first crossing at look k is the alpha spent there:

- `spending_boundaries`: Lan & DeMets (1983) spending functions, per side at level ``a``:
  O'Brien-Fleming type ``f(t) = 2 - 2 Phi(z_{1-a/2} / sqrt(t))`` (spends almost nothing early:
  the default of the study) and Pocock type ``f(t) = a ln(1 + (e - 1) t)``; looks may be
  unequally spaced;
- `classical_boundaries`: Pocock (1977) (one constant ``c``) and O'Brien & Fleming (1979)
  (``c sqrt(K / k)``) for K equally spaced looks, solved for the constant.

The null distribution of ``(Z_1, ..., Z_K)`` is that of a Brownian motion observed at the
information fractions; the probabilities come from the recursive numerical integration of
Armitage, McPherson & Rowe (1969) (Jennison & Turnbull 2000, ch. 19): the density of the score
``S_k = Z_k sqrt(t_k)`` on the continuation region, carried from look to look by the normal
increment, integrated with Simpson's rule on ``GRID`` points.

A look's boundary becomes a *nominal level* (``2 (1 - Phi(c_k))`` two-sided, ``1 - Phi(c_k)``
one-sided) at which that look's p-value is compared (Jennison & Turnbull §3.8: applying the
z-boundaries' nominal levels to t-test p-values keeps the error rate close to the target).
`sequential_p` turns the p-values of the looks taken into the smallest overall level at which
the sequential test rejects (stage-wise: rejected at level a iff some look's p-value is below
that look's nominal level for a): a valid p-value, so Holm's procedure applies to it as to any
other (`harness.report.stats.holm`).
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.optimize import brentq
from scipy.special import ndtr, ndtri

SPENDING = ("obrien_fleming", "pocock")
GRID = 201          # Simpson points over each look's continuation region (odd): 1e-8 on the published constants
C_MAX = 40.0        # a boundary beyond this is "no rejection at this look"
SPAN = 10.0         # the grid reaches at most SPAN standard deviations of the score


def spend(t: float, a: float, kind: str = "obrien_fleming") -> float:
    """Alpha spent by information fraction ``t`` (0 < t <= 1) by one side of a test of level
    ``a`` (``f(1) = a``)."""
    if kind not in SPENDING:
        raise ValueError(f"spending must be one of {SPENDING}, got {kind!r}")
    t = min(max(float(t), 0.0), 1.0)
    if t <= 0:
        return 0.0
    if kind == "obrien_fleming":
        return float(2.0 - 2.0 * ndtr(ndtri(1.0 - a / 2.0) / math.sqrt(t)))
    return float(a * math.log(1.0 + (math.e - 1.0) * t))


def _simpson_weights(n: int) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w / 3.0


class _Walk:
    """The null density of the score S_k = Z_k sqrt(t_k) on the continuation region of the
    looks passed so far, and the probability of first crossing at the next look."""

    def __init__(self, two_sided: bool):
        self.two_sided = two_sided
        self.x = None        # grid of S_{k-1} on the continuation region
        self.f = None        # density times Simpson weights (sub-density: mass still going)
        self.t = 0.0

    def cross(self, c: float, t: float) -> float:
        """P(not stopped before, and |Z| >= c (two-sided) or Z >= c at information t)."""
        b = c * math.sqrt(t)
        if self.x is None:  # first look: S ~ N(0, t)
            sd = math.sqrt(t)
            up = float(ndtr(-b / sd))
            return 2.0 * up if self.two_sided else up
        sd = math.sqrt(t - self.t)
        up = ndtr((self.x - b) / sd)
        if self.two_sided:
            up = up + ndtr((-b - self.x) / sd)
        return float(np.dot(self.f, up))

    def advance(self, c: float, t: float) -> None:
        """Condition on not stopping at a look with boundary c at information t."""
        b, far = c * math.sqrt(t), SPAN * math.sqrt(t)   # beyond SPAN sd the density is < 1e-20
        hi = min(b, far)
        lo = max(-b, -far) if self.two_sided else -far
        x = np.linspace(lo, hi, GRID)
        w = _simpson_weights(GRID) * (hi - lo) / (GRID - 1)
        if self.x is None:
            dens = np.exp(-0.5 * x * x / t) / math.sqrt(2 * math.pi * t)
        else:
            sd = math.sqrt(t - self.t)
            z = (x[:, None] - self.x[None, :]) / sd
            dens = (np.exp(-0.5 * z * z) / (sd * math.sqrt(2 * math.pi))) @ self.f
        self.x, self.f, self.t = x, dens * w, t


def _solve(walk: _Walk, t: float, target: float) -> float:
    """The boundary c at information t whose first-crossing probability is ``target``."""
    if target <= walk.cross(C_MAX, t):
        return C_MAX
    lo = 1e-6
    if walk.cross(lo, t) <= target:
        return lo
    return brentq(lambda c: walk.cross(c, t) - target, lo, C_MAX, xtol=1e-10, rtol=1e-12, maxiter=200)


@lru_cache(maxsize=4096)
def _spending(fracs: tuple, a: float, kind: str, two_sided: bool) -> tuple:
    walk, spent, out = _Walk(two_sided), 0.0, []
    for t in fracs:
        f = spend(t, a, kind)
        inc = (f - spent) * (2.0 if two_sided else 1.0)
        spent = f
        c = _solve(walk, t, inc) if inc > 1e-300 else C_MAX
        out.append(c)
        walk.advance(c, t)
    return tuple(out)


def _check_fracs(fracs) -> tuple:
    fr = tuple(float(t) for t in fracs)
    if not fr or any(not 0 < t <= 1 for t in fr) or any(b <= a for a, b in zip(fr, fr[1:])):
        raise ValueError(f"information fractions must increase within (0, 1], got {fracs}")
    return fr


def spending_boundaries(fracs, alpha: float = 0.05, kind: str = "obrien_fleming", two_sided: bool = True) -> list:
    """Boundaries ``c_k`` (on the Z scale) at information fractions ``fracs`` for a test of
    overall level ``alpha`` (two-sided: alpha / 2 spent per side by `spend`; one-sided: alpha
    on the upper side only)."""
    side = alpha / 2.0 if two_sided else alpha
    return list(_spending(_check_fracs(fracs), float(side), kind, bool(two_sided)))


def classical_boundaries(k: int, alpha: float = 0.05, kind: str = "pocock", two_sided: bool = True) -> list:
    """Pocock's constant boundary or O'Brien-Fleming's ``C sqrt(K / k)`` for ``k`` equally
    spaced looks and overall level ``alpha``, the constant solved numerically."""
    if kind not in SPENDING:
        raise ValueError(f"kind must be one of {SPENDING}, got {kind!r}")
    fracs = [(i + 1) / k for i in range(k)]
    shape = [1.0] * k if kind == "pocock" else [math.sqrt(k / (i + 1)) for i in range(k)]

    def total(c):
        walk, p = _Walk(two_sided), 0.0
        for t, g in zip(fracs, shape):
            p += walk.cross(c * g, t)
            walk.advance(c * g, t)
        return p - alpha

    c = brentq(total, 0.5, 10.0, xtol=1e-10)
    return [c * g for g in shape]


def nominal_levels(fracs, alpha: float = 0.05, kind: str = "obrien_fleming", two_sided: bool = True) -> list:
    """The per-look nominal levels of `spending_boundaries`: the p-value at look k rejects when
    it is <= ``2 (1 - Phi(c_k))`` (two-sided) or ``1 - Phi(c_k)`` (one-sided)."""
    cs = spending_boundaries(fracs, alpha, kind, two_sided)
    return [float((2.0 if two_sided else 1.0) * ndtr(-c)) if c < C_MAX else 0.0 for c in cs]


def sequential_p(pvalues, fracs, kind: str = "obrien_fleming", two_sided: bool = True, tol: float = 1e-7) -> float:
    """The smallest overall level at which the group-sequential test of the looks taken
    rejects: ``inf { a : p_k <= nominal_k(a) for some look k }``, ``pvalues[k]`` the nominal
    p-value at look k and ``fracs[k]`` its information fraction (looks not yet taken are simply
    absent; their boundaries do not change the earlier ones). Found by bisection on log a
    (the nominal levels increase with a); 1.0 when even a = 1 rejects nothing. With one look
    at ``t = 1`` it is the p-value itself."""
    fr = _check_fracs(fracs)
    ps = [1.0 if (p is None or not np.isfinite(p)) else float(p) for p in pvalues]
    if len(ps) != len(fr):
        raise ValueError("one p-value per look")
    if len(fr) == 1 and fr[0] == 1.0:
        return min(1.0, ps[0])

    def rejects(a):
        return any(p <= lv for p, lv in zip(ps, nominal_levels(fr, a, kind, two_sided)))

    if not rejects(1.0):
        return 1.0
    lo, hi = math.log(1e-12), 0.0
    if rejects(math.exp(lo)):
        return math.exp(lo)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if rejects(math.exp(mid)) else (mid, hi)
    return math.exp(hi)
