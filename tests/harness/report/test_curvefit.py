"""The ScaleRL compute-curve fit: parameters recovered from noise-free and noisy curves, the
bounds on A, the seed bootstrap, parameters flagged at their bounds on constructed curves, and
the extrapolation check on a held-out point with its tolerance."""
from __future__ import annotations

import numpy as np
import pytest

from harness.report.curvefit import (B_BOUNDS, TOLERANCE, extrapolation_check, fit_curve, fit_curves, predict,
                                     study_curves)

C = np.array([0.0, 256, 512, 1024, 2048, 3072, 4096, 8192, 16384, 32768])
TRUE = dict(r0=0.40, a=0.80, b=1.5, c_mid=3000.0)


def test_predict_starts_at_r0_and_is_halfway_at_c_mid():
    assert predict(0.0, **TRUE) == pytest.approx(0.40)
    assert predict(3000.0, **TRUE) == pytest.approx(0.60)
    assert predict(1e12, **TRUE) == pytest.approx(0.80, abs=1e-9)


@pytest.mark.parametrize("true", [TRUE, dict(r0=0.1, a=0.55, b=0.7, c_mid=800.0), dict(r0=0.5, a=0.95, b=3.0, c_mid=6000.0)])
def test_recovers_known_parameters_from_noise_free_data(true):
    f = fit_curve(C, predict(C, **true))
    assert f.r0 == true["r0"]
    # stated tolerance: 1e-3 relative on every parameter
    assert f.a == pytest.approx(true["a"], rel=1e-3)
    assert f.b == pytest.approx(true["b"], rel=1e-3)
    assert f.c_mid == pytest.approx(true["c_mid"], rel=1e-3)
    assert f.sse < 1e-12


def test_recovers_parameters_from_noisy_seeds_with_bootstrap_intervals():
    rng = np.random.default_rng(0)
    curves = [(C, predict(C, **TRUE) + np.r_[0.0, rng.normal(0, 0.005, C.size - 1)]) for _ in range(5)]
    s = study_curves(curves, n_boot=100, seed=1)
    # stated (looser) tolerance for noise sd 0.005 per point and 5 seeds
    assert s.fit.a == pytest.approx(0.80, abs=0.02)
    assert s.fit.b == pytest.approx(1.5, rel=0.2)
    assert s.fit.c_mid == pytest.approx(3000.0, rel=0.2)
    assert s.n_seeds == 5 and s.n_boot == 100
    for k in ("a", "b", "c_mid"):
        lo, hi = s.intervals[k]
        assert lo <= getattr(s.fit, k) <= hi
    again = study_curves(curves, n_boot=100, seed=1)
    assert again.intervals == s.intervals  # seeded RNG: the same intervals


def test_a_stays_in_r0_to_one():
    down = fit_curve(C, 0.5 - 0.1 * C / C.max())          # accuracy falling: A cannot go below R0
    assert down.a == pytest.approx(0.5)
    up = fit_curve(C, np.r_[0.5, np.full(C.size - 1, 1.3)])  # above 1: A clipped at 1
    assert up.a == pytest.approx(1.0)


def test_extrapolation_error_is_zero_on_noise_free_data():
    y = predict(C, **TRUE)
    ex = extrapolation_check(C, y)
    assert ex["fit_upto"] == C.max() / 2 and ex["at"] == C.max()
    assert ex["observed"] == pytest.approx(y[-1])
    assert abs(ex["error"]) < 1e-6  # zero up to the optimiser's precision
    s = study_curves([(C, y), (C, y)], n_boot=5)
    assert abs(s.extrapolation["error"]) < 1e-6


def test_too_few_points_are_an_error_or_a_reason():
    with pytest.raises(ValueError, match="at least 3"):
        fit_curve([0, 1, 2], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="R0"):
        fit_curve([1, 2, 3], [0.1, 0.2, 0.3])
    ex = extrapolation_check([0, 1, 2, 3, 4], [0.1, 0.2, 0.3, 0.35, 0.4])
    assert np.isnan(ex["error"]) and "at least 3" in ex["reason"]


# --------------------------------------------------------------------------- bounds and the held-out check


def test_a_step_curve_puts_b_at_its_upper_bound_and_is_flagged():
    """A jump between two points: the steepest B allowed fits best; B is not identified."""
    y = np.where(C < 3000, 0.40, 0.80)
    f = fit_curve(C, y)
    assert f.b == pytest.approx(B_BOUNDS[1]) and f.at_bounds() == {"b": "upper"}
    s = study_curves([(C, y), (C, y + np.r_[0.0, np.full(C.size - 1, 0.01)])], n_boot=50)
    assert s.flags["b"] == "estimate at its upper bound"


def test_a_flat_curve_puts_a_at_r0_and_is_flagged():
    f = fit_curve(C, np.full(C.size, 0.5))
    assert f.a == pytest.approx(0.5) and f.at_bounds()["a"] == "lower"


def test_a_curve_still_rising_linearly_pushes_a_to_one():
    """No saturation in sight: the asymptote runs to its upper bound (100%) and C_mid past the data."""
    y = 0.1 + 0.3 * C / C.max()
    f = fit_curve(C, y)
    assert f.a == pytest.approx(1.0) and f.at_bounds() == {"a": "upper"} and f.c_mid > C.max()


def test_identified_parameters_are_not_flagged_and_bootstrap_shares_are_reported():
    rng = np.random.default_rng(0)
    curves = [(C, predict(C, **TRUE) + np.r_[0.0, rng.normal(0, 0.003, C.size - 1)]) for _ in range(6)]
    s = study_curves(curves, seed=2)
    assert s.n_boot == 1000 and s.flags == {}
    assert s.boot_at_bounds == {"a": 0.0, "b": 0.0, "c_mid": 0.0}


def test_bootstrap_intervals_reaching_a_bound_are_flagged():
    """Seeds that disagree on whether the curve saturates: some refits end on a bound."""
    flat = np.r_[0.40, np.full(C.size - 1, 0.40)]
    step = np.where(C < 3000, 0.40, 0.80)
    s = study_curves([(C, flat), (C, step), (C, 0.5 * (flat + step))], n_boot=200, seed=0)
    assert s.flags and all("bound" in why for why in s.flags.values())


def test_extrapolation_check_tolerance_pass_and_fail():
    y = predict(C, **TRUE)
    ok = extrapolation_check(C, y)
    assert ok["passed"] is True and ok["tolerance"] == TOLERANCE == 0.02
    off = y.copy()
    off[-1] -= 0.05                                   # the held-out point 5 points below the curve
    bad = extrapolation_check(C, off)
    assert bad["passed"] is False and bad["error"] == pytest.approx(0.05, abs=1e-4)
    assert extrapolation_check(C, off, tolerance=0.06)["passed"] is True
    # fit on C <= 4096 (six points, three of them > 0), predict 32768
    early = extrapolation_check(C, y, fit_upto=4096)
    assert early["fit"].n_points == 6 and early["at"] == 32768 and early["passed"] is True
    none = extrapolation_check(C, y, fit_upto=C.max())
    assert none["passed"] is None and "no held-out point" in none["reason"]


def test_batch_fit_equals_one_by_one():
    rng = np.random.default_rng(4)
    ys = np.stack([predict(C, **TRUE) + np.r_[0.0, rng.normal(0, 0.01, C.size - 1)] for _ in range(5)])
    batch = fit_curves(C, ys, ys[:, 0])
    for y, f in zip(ys, batch):
        g = fit_curve(C, y)
        assert (f.a, f.b, f.c_mid, f.sse) == (g.a, g.b, g.c_mid, g.sse)
