"""The study's statistics against independent references: Holm against adjustments worked by
hand, the t and TOST p-values against scipy's t-test on the data, the hierarchical bootstrap
against brute-force resampling with the same draws, against its exact distribution on a tiny
case, against its variance in closed form, and in the two degenerate cases (problems that all
agree: the seed-level bootstrap; one seed: the problem-level bootstrap)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from harness.report.stats import (bootstrap_variance, hierarchical_bootstrap, holm, holm_parts, percentile_interval,
                                  t_pvalues)


# --------------------------------------------------------------------------- Holm


def test_holm_against_hand_adjustments():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> running max 0.06)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1; NaN counts as 1 but stays in the family (m = 3)
    assert holm([0.02, float("nan"), 0.5]) == pytest.approx([0.06, 1.0, 1.0])
    # one hypothesis: unchanged
    assert holm([0.049]) == [0.049]
    # rejected at 0.05 exactly when the step-down rejects: p_(1) <= .05/3, p_(2) <= .05/2, then stop
    adj = holm([0.016, 0.024, 0.051])
    assert [a <= 0.05 for a in adj] == [True, True, False]


# --------------------------------------------------------------------------- t and TOST


def test_t_pvalues_against_scipy_t_tests_on_data():
    x = np.array([1.2, 2.9, 0.4, 1.8, 2.2, 0.9])
    n, mean, se = x.size, x.mean(), x.std(ddof=1) / math.sqrt(x.size)
    p = t_pvalues(mean, se, n - 1, margin=2.0)
    assert p["diff"] == pytest.approx(sps.ttest_1samp(x, 0.0).pvalue, rel=1e-10)
    # TOST = the larger of the one-sided tests against -2 (greater) and +2 (less)
    lo = sps.ttest_1samp(x, -2.0, alternative="greater").pvalue
    hi = sps.ttest_1samp(x, 2.0, alternative="less").pvalue
    assert p["tost"] == pytest.approx(max(lo, hi), rel=1e-10)
    # by hand from the t distribution
    assert p["tost"] == pytest.approx(sps.t.cdf((mean - 2.0) / se, n - 1), rel=1e-10)


def test_t_pvalues_edge_cases():
    assert t_pvalues(3.0, 0.0, 4, 2.0) == {"diff": 0.0, "tost": 1.0}      # every seed +3: a difference, not within 2
    assert t_pvalues(0.5, 0.0, 4, 2.0) == {"diff": 0.0, "tost": 0.0}      # every seed +0.5: both
    assert t_pvalues(0.0, 0.0, 4, 2.0) == {"diff": 1.0, "tost": 0.0}
    nan = t_pvalues(1.0, 0.5, 0, 2.0)                                        # one seed: no test
    assert math.isnan(nan["diff"]) and math.isnan(nan["tost"])
    assert math.isnan(t_pvalues(1.0, 0.5, 3)["tost"])                       # no margin: no TOST


# --------------------------------------------------------------------------- hierarchical bootstrap


def _brute_crossed(d: np.ndarray, n_boot: int, seed: int, chunk: int = 1000) -> np.ndarray:
    """The crossed bootstrap by explicit index resampling, consuming the generator as the
    implementation does (all seed draws first, then problem indices chunk by chunk)."""
    rng = np.random.default_rng(seed)
    s, p = d.shape
    seed_idx = rng.integers(0, s, size=(n_boot, s))
    out = np.empty(n_boot)
    for lo in range(0, n_boot, chunk):
        hi = min(n_boot, lo + chunk)
        idx = rng.integers(0, p, size=(hi - lo, p))
        for b in range(hi - lo):
            out[lo + b] = np.mean([d[j, idx[b]].mean() for j in seed_idx[lo + b]])
    return out


@pytest.mark.parametrize("integral", [True, False])
def test_crossed_bootstrap_equals_brute_force_resampling(integral):
    rng = np.random.default_rng(3)
    d = rng.integers(-1, 2, size=(4, 30)).astype(float) if integral else rng.normal(0, 1, (4, 30))
    fast = hierarchical_bootstrap(list(d), 1500, np.random.default_rng(11), crossed=True)
    assert fast == pytest.approx(_brute_crossed(d, 1500, 11), abs=1e-12)


def test_problems_that_all_agree_give_the_seed_level_bootstrap():
    """Every problem of a seed has that seed's value: the problem level adds nothing, and the
    draws are exactly those of a bootstrap over the seed values alone (same generator seed)."""
    seed_values = np.array([3.0, -1.0, 4.0, 1.5, 2.0])
    per_seed = [np.full(40, v) for v in seed_values]
    ref_rng = np.random.default_rng(7)
    ref = seed_values[ref_rng.integers(0, 5, size=(4000, 5))].mean(axis=1)
    for crossed in (True, False):
        got = hierarchical_bootstrap(per_seed, 4000, np.random.default_rng(7), crossed=crossed)
        assert got == pytest.approx(ref, abs=1e-12)
        assert percentile_interval(got) == pytest.approx(percentile_interval(ref), abs=1e-12)
    seeds_only = hierarchical_bootstrap(seed_values, 4000, np.random.default_rng(7))
    assert seeds_only == pytest.approx(ref, abs=1e-12)
    v = bootstrap_variance(per_seed)
    assert v["problems"] == pytest.approx(0.0, abs=1e-15) and v["seed"] == pytest.approx(seed_values.var() / 5)


def test_one_seed_is_the_problem_level_bootstrap():
    d = np.random.default_rng(5).integers(0, 2, 200).astype(float)
    rng = np.random.default_rng(2)
    rng.integers(0, 1, size=(3000, 1))                     # the (trivial) seed draws come first
    idx = np.concatenate([rng.integers(0, 200, size=(1000, 200)) for _ in range(3)])
    ref = d[idx].mean(axis=1)
    got = hierarchical_bootstrap([d], 3000, np.random.default_rng(2), crossed=True)
    assert got == pytest.approx(ref, abs=1e-12)
    # nested draws differ (multinomial counts) but have the same distribution: the variance d.var()/P
    nested = hierarchical_bootstrap([d], 20000, np.random.default_rng(2), crossed=False)
    assert nested.var() == pytest.approx(d.var() / 200, rel=0.05)
    assert bootstrap_variance([d], crossed=True)["total"] == pytest.approx(d.var() / 200)
    assert bootstrap_variance([d], crossed=False)["total"] == pytest.approx(d.var() / 200)


def test_bootstrap_matches_its_exact_distribution_on_a_tiny_case():
    """Two seeds x two problems: every crossed replicate is one of 4 seed draws x 4 problem
    draws, equally likely; the Monte-Carlo CDF matches the enumerated one."""
    d = np.array([[0.0, 1.0], [2.0, 5.0]])
    exact = []
    for sd in itertools.product(range(2), repeat=2):
        for pd in itertools.product(range(2), repeat=2):
            exact.append(np.mean([d[s, list(pd)].mean() for s in sd]))
    exact = np.array(exact)
    draws = hierarchical_bootstrap(list(d), 40000, np.random.default_rng(1), crossed=True)
    for x in np.unique(exact):
        assert (draws <= x + 1e-12).mean() == pytest.approx((exact <= x + 1e-12).mean(), abs=0.01)
    assert draws.var() == pytest.approx(exact.var(), rel=0.03)
    assert bootstrap_variance(list(d), crossed=True)["total"] == pytest.approx(exact.var(), rel=1e-12)


@pytest.mark.parametrize("crossed", [True, False])
def test_bootstrap_variance_in_closed_form_matches_the_draws(crossed):
    rng = np.random.default_rng(9)
    effect = rng.normal(0, 1, 60)                              # per-problem effects shared by seeds
    d = np.stack([(effect + rng.normal(0.5 * s, 1, 60) > 0).astype(float) for s in range(5)])
    draws = hierarchical_bootstrap(list(d), 30000, np.random.default_rng(4), crossed=crossed)
    v = bootstrap_variance(list(d), crossed=crossed)
    assert v["scheme"] == ("crossed" if crossed else "nested")
    assert draws.var() == pytest.approx(v["total"], rel=0.04)
    assert draws.mean() == pytest.approx(d.mean(), abs=3 * math.sqrt(v["total"] / 30000))
    # crossed counts the shared problem effect once for all seeds: more variance than nested here
    assert bootstrap_variance(list(d), crossed=True)["total"] > bootstrap_variance(list(d), crossed=False)["total"]


def test_ragged_seeds_are_nested_and_crossed_needs_aligned_problems():
    per = [np.array([0.0, 1.0, 1.0]), np.array([1.0, 0.0])]
    assert bootstrap_variance(per)["scheme"] == "nested"
    with pytest.raises(ValueError, match="same problems"):
        hierarchical_bootstrap(per, 10, np.random.default_rng(0), crossed=True)
    draws = hierarchical_bootstrap(per, 20000, np.random.default_rng(0))
    assert draws.var() == pytest.approx(bootstrap_variance(per)["total"], rel=0.04)


def test_bootstrap_is_deterministic():
    per = [np.random.default_rng(s).integers(0, 2, 100) for s in range(3)]
    a = hierarchical_bootstrap(per, 5000, np.random.default_rng([0, 123]))
    b = hierarchical_bootstrap(per, 5000, np.random.default_rng([0, 123]))
    assert a.tobytes() == b.tobytes()


def test_holm_over_parts_by_hand():
    """Parts of two mutually exclusive hypotheses: the j-th smallest p-value is multiplied by the
    number of parts that still hold a hypothesis (a part leaves the count only when both its
    hypotheses are behind); Holm over the 2K hypotheses would multiply by 2K - j + 1."""
    adj, t = holm_parts([(0.01, 0.5), (0.02, 0.003), (0.9, 0.04)])
    # sorted: 0.003 (part 1), 0.01 (part 0), 0.02 (part 1: its last, so it leaves after), 0.04 (part 2),
    # 0.5 (part 0: its last), 0.9 (part 2)
    assert [x for pr in t for x in pr] == [3, 2, 3, 3, 1, 2]
    assert adj[1][1] == pytest.approx(0.009) and adj[0][0] == pytest.approx(0.03)
    assert adj[1][0] == pytest.approx(0.06) and adj[2][1] == pytest.approx(0.08)
    assert adj[0][1] == pytest.approx(1.0) and adj[2][0] == pytest.approx(1.0)
    # the same p-values under Holm over 6 hypotheses: 0.018, 0.05, 0.08, 0.12, ...
    assert holm([0.01, 0.5, 0.02, 0.003, 0.9, 0.04])[3] == pytest.approx(0.018)
    assert holm_parts([(float("nan"), 0.01)])[0] == [(1.0, 0.01)]
