"""Group-sequential boundaries against published constants (Jennison & Turnbull 2000, Tables
2.1 and 2.3; the Lan-DeMets examples of R's ldbounds), the type I error they keep (simulated
Brownian motion), and sequential p-values."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from harness.report.sequential import (classical_boundaries, nominal_levels, sequential_p, spend,
                                       spending_boundaries)

# two-sided alpha = 0.05, K equally spaced looks
POCOCK = {2: 2.178, 3: 2.289, 4: 2.361, 5: 2.413}            # C_P(K, 0.05), J&T Table 2.1
OBRIEN_FLEMING = {2: 1.977, 3: 2.004, 4: 2.024, 5: 2.040}    # C_B(K, 0.05), J&T Table 2.3
LD_OBF_5 = [4.8769, 3.3569, 2.6803, 2.2898, 2.0310]          # ldbounds, t = .2 .. 1, alpha .025 per side
LD_POCOCK_5 = [2.4380, 2.4268, 2.4101, 2.3966, 2.3859]


@pytest.mark.parametrize("k", sorted(POCOCK))
def test_classical_constants(k):
    p = classical_boundaries(k, 0.05, "pocock")
    assert p == pytest.approx([POCOCK[k]] * k, abs=5e-4)
    o = classical_boundaries(k, 0.05, "obrien_fleming")
    assert o[-1] == pytest.approx(OBRIEN_FLEMING[k], abs=5e-4)
    assert o == pytest.approx([OBRIEN_FLEMING[k] * np.sqrt(k / (i + 1)) for i in range(k)], abs=2e-3)


def test_lan_demets_spending_boundaries():
    fr = [0.2, 0.4, 0.6, 0.8, 1.0]
    assert spending_boundaries(fr, 0.05, "obrien_fleming") == pytest.approx(LD_OBF_5, abs=2e-4)
    assert spending_boundaries(fr, 0.05, "pocock") == pytest.approx(LD_POCOCK_5, abs=2e-4)
    # the spending functions themselves: all of alpha by t = 1; O'Brien-Fleming's first look by hand
    assert spend(1.0, 0.025) == pytest.approx(0.025) and spend(1.0, 0.025, "pocock") == pytest.approx(0.025)
    assert spend(0.2, 0.025) == pytest.approx(2 - 2 * norm.cdf(norm.ppf(1 - 0.0125) / np.sqrt(0.2)))
    assert 2 * norm.sf(LD_OBF_5[0]) == pytest.approx(2 * spend(0.2, 0.025), rel=1e-3)


def test_one_look_is_the_fixed_test():
    assert nominal_levels([1.0], 0.05) == pytest.approx([0.05])
    assert nominal_levels([1.0], 0.05, two_sided=False) == pytest.approx([0.05])
    assert sequential_p([0.031], [1.0]) == 0.031


def test_boundaries_keep_the_type_one_error():
    """Under the null, a z test at 8 unequally spaced looks (3..10 seeds of 10) that stops at
    the first crossing rejects about alpha of the time; testing every look at 0.05 does not."""
    looks = np.arange(3, 11)
    fr = looks / 10
    c = np.array(spending_boundaries(fr, 0.05, "obrien_fleming"))
    rng = np.random.default_rng(0)
    inc = rng.normal(0, 1, (200_000, 10))
    s = np.cumsum(inc, axis=1)[:, looks - 1]
    z = s / np.sqrt(looks)
    rate = (np.abs(z) >= c).any(axis=1).mean()
    assert rate == pytest.approx(0.05, abs=0.002)
    naive = (np.abs(z) >= norm.ppf(0.975)).any(axis=1).mean()
    assert naive > 0.12


def test_sequential_p_is_the_smallest_rejecting_level():
    fr = [0.3, 0.4, 0.5, 0.6]
    ps = [0.2, 0.01, 0.004, 0.03]
    p = sequential_p(ps, fr)
    for a in (0.98 * p, 1.02 * p):
        rejects = any(q <= lv for q, lv in zip(ps, nominal_levels(fr, a)))
        assert rejects == (a >= p)
    # more looks can only lower it (another chance to reject); a larger p at a look changes nothing
    assert sequential_p(ps[:3], fr[:3]) >= p - 1e-12
    assert sequential_p([0.2, 0.01, 0.004, 0.9], fr) == pytest.approx(sequential_p(ps[:3], fr[:3]), rel=1e-5)
    assert sequential_p([1.0, 1.0], [0.5, 1.0]) == 1.0
    with pytest.raises(ValueError):
        sequential_p([0.1, 0.2], [0.6, 0.5])
