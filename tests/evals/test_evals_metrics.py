"""pass@k, maj@k and aggregation (evals.metrics), against values computed by hand."""
import math
import random

import pytest

from evals.metrics import (aggregate_curves, accuracy, maj_at_k, maj_at_k_bruteforce, maj_at_k_curve, majority_key,
                           pass_at_k, pass_at_k_curve, problem_curves)


def test_pass_at_k_n4_c1():
    assert pass_at_k_curve(4, 1) == pytest.approx([0.25, 0.5, 0.75, 1.0], abs=1e-12)


def test_pass_at_k_edges():
    assert pass_at_k_curve(4, 0) == [0.0, 0.0, 0.0, 0.0]
    assert pass_at_k_curve(4, 4) == [1.0, 1.0, 1.0, 1.0]
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0
    # n=5, c=2: pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-12)
    assert pass_at_k(5, 2, 4) == 1.0  # n - c < k
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 0)


def test_pass_at_k_matches_binomials_and_is_stable():
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(1, 40)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    # large n: no overflow, pass@1 = c/n
    assert pass_at_k(10000, 3, 1) == pytest.approx(3e-4, rel=1e-9)
    assert pass_at_k(10000, 3, 10000) == 1.0


def test_pass_at_k_monotone_in_k():
    for n in (1, 4, 16):
        for c in range(n + 1):
            curve = pass_at_k_curve(n, c)
            assert all(a <= b + 1e-15 for a, b in zip(curve, curve[1:]))
            assert curve[0] == pytest.approx(c / n)


# -- maj@k ---------------------------------------------------------------------------------
def test_maj_at_k_by_hand_first_key_correct():
    # samples a b a c ; a is right. k=2: of the 6 pairs only {b, c} votes wrong (tie b/c -> b,
    # which appears first); the ties {a,b} and {a,c} go to a. k=3: every triple -> a.
    keys, correct = ["a", "b", "a", "c"], [True, False, True, False]
    assert maj_at_k_curve(keys, correct) == pytest.approx([0.5, 5 / 6, 1.0, 1.0], abs=1e-12)


def test_maj_at_k_tie_breaking_by_first_appearance():
    # samples b a a b ; a is right. Ties always go to b (it appears first in the n samples):
    # k=2: only {a,a} -> 1/6; k=3: {b,a,a} and {a,a,b} -> 2/4; k=4: 2-2 tie -> b -> 0.
    keys, correct = ["b", "a", "a", "b"], [False, True, True, False]
    assert maj_at_k_curve(keys, correct) == pytest.approx([0.5, 1 / 6, 0.5, 0.0], abs=1e-12)
    # the same answers in the other order flips every tie
    assert maj_at_k_curve(["a", "b", "b", "a"], [True, False, False, True]) == pytest.approx(
        [0.5, 5 / 6, 0.5, 1.0], abs=1e-12)


def test_maj_at_k_unanswered_samples_do_not_vote():
    # None a None b ; a right. k=1: 1/4. k=2: {N,a},{a,N},{a,b}(tie -> a) right; {N,N},{N,b},{N,b} not -> 3/6.
    # k=3: {N,a,N} {N,a,b}->a {a,N,b}->a right, {N,N,b} not -> 3/4. k=4: a/b tie -> a.
    keys, correct = [None, "a", None, "b"], [False, True, False, False]
    assert maj_at_k_curve(keys, correct) == pytest.approx([0.25, 0.5, 0.75, 1.0], abs=1e-12)
    assert maj_at_k_curve([None, None], [False, False]) == [0.0, 0.0]


def test_maj_at_1_is_mean_accuracy_and_maj_at_n_is_the_full_vote():
    rng = random.Random(2)
    for _ in range(50):
        n = rng.randint(1, 12)
        keys = [rng.choice([None, "p", "q", "r"]) for _ in range(n)]
        right = rng.choice(["p", "q", "r"])
        correct = [k == right for k in keys]
        curve = maj_at_k_curve(keys, correct)
        assert curve[0] == pytest.approx(accuracy(correct), abs=1e-12)
        assert curve[-1] == (1.0 if majority_key(keys) == right else 0.0)


def test_exact_maj_matches_brute_force_enumeration():
    rng = random.Random(3)
    for _ in range(150):
        n = rng.randint(1, 10)
        keys = [rng.choice([None, "a", "b", "c", "d"]) for _ in range(n)]
        good = {"a": rng.random() < 0.5, "b": rng.random() < 0.5, "c": False, "d": True}
        correct = [k is not None and good[k] for k in keys]
        exact = maj_at_k_curve(keys, correct, method="exact")
        brute = [maj_at_k_bruteforce(keys, correct, k) for k in range(1, n + 1)]
        assert exact == pytest.approx(brute, abs=1e-12), (keys, correct)


def test_sampled_maj_is_seeded_and_close_to_exact():
    rng = random.Random(4)
    keys = [rng.choice(["a", "b", "c", None]) for _ in range(12)]
    correct = [k == "a" for k in keys]
    s1 = maj_at_k_curve(keys, correct, method="sampled", num_subsets=2000, seed=7)
    s2 = maj_at_k_curve(keys, correct, method="sampled", num_subsets=2000, seed=7)
    assert s1 == s2
    exact = maj_at_k_curve(keys, correct, method="exact")
    assert max(abs(a - b) for a, b in zip(s1, exact)) < 0.05
    assert maj_at_k(keys, correct, 3) == pytest.approx(exact[2])
    with pytest.raises(ValueError):
        maj_at_k_curve(keys, correct, method="bogus")


def test_majority_key_ties():
    assert majority_key(["x", "y", "y", "x"]) == "x"
    assert majority_key(["y", "x", "x", "y", "x"]) == "x"
    assert majority_key([None, None, "z"]) == "z"
    assert majority_key([None]) is None
    assert majority_key(["x", "y"], order={"y": 0, "x": 1}) == "y"


def test_problem_curves_and_aggregation():
    p1 = problem_curves(["a", "b", "a", "c"], [True, False, True, False])
    p2 = problem_curves(["b", "a", "a", "b"], [False, True, True, False])
    p3 = problem_curves(["x", "y", "z", "w"], [False, False, False, False])
    assert p1["num_correct"] == 2 and p1["mean_acc"] == 0.5 and p1["n"] == 4
    assert p1["pass@k"] == pytest.approx([0.5, 5 / 6, 1.0, 1.0])
    assert p3["pass@k"] == [0.0] * 4 and p3["maj@k"] == [0.0] * 4
    agg = aggregate_curves([p1["maj@k"], p2["maj@k"], p3["maj@k"]])
    assert agg == pytest.approx([(0.5 + 0.5) / 3, (5 / 6 + 1 / 6) / 3, 1.5 / 3, 1 / 3])
    assert aggregate_curves([]) == []
    with pytest.raises(ValueError):
        aggregate_curves([[0.1], [0.1, 0.2]])
    assert accuracy([True, False, True, True]) == 0.75 and accuracy([]) == 0.0


def test_maj_exact_is_fast_for_n64():
    import time
    rng = random.Random(5)
    keys = [rng.choice("abcdefghij") for _ in range(64)]
    correct = [k == "a" for k in keys]
    t0 = time.time()
    curve = maj_at_k_curve(keys, correct)
    assert time.time() - t0 < 2.0
    assert len(curve) == 64 and all(0.0 <= v <= 1.0 for v in curve)
    assert curve[0] == pytest.approx(keys.count("a") / 64)


def _two_groups_closed_form(a: int, b: int, z: int, k: int) -> float:
    """maj@k with a right answer given a times (ranked first: it wins ties), a wrong one b times and z samples
    without an answer, counted over all C(n, k) subsets in exact integers."""
    from fractions import Fraction
    from math import comb
    hits = 0
    for xz in range(0, min(z, k) + 1):
        for xb in range(0, min(b, k - xz) + 1):
            xa = k - xz - xb
            if 1 <= xa <= a and xa >= xb:
                hits += comb(a, xa) * comb(b, xb) * comb(z, xz)
    return float(Fraction(hits, comb(a + b + z, k)))


def _two_groups(a, b, z):
    keys = ["r"] + ["w"] * b + [None] * z + ["r"] * (a - 1)  # "r" appears first
    return keys, [q == "r" for q in keys]


def test_exact_maj_at_large_n_matches_integer_counting():
    for a, b, z in [(300, 295, 5), (480, 510, 10)]:  # n = 600 and n = 1000 (the exact path's limit)
        keys, correct = _two_groups(a, b, z)
        curve = maj_at_k_curve(keys, correct)
        assert len(curve) == a + b + z
        for k in list(range(1, 40)) + list(range(40, a + b + z + 1, 37)) + [a + b + z]:
            assert curve[k - 1] == pytest.approx(_two_groups_closed_form(a, b, z, k), rel=1e-12, abs=1e-300), k


def test_above_the_exact_limit_maj_is_estimated_from_seeded_orders():
    a, b, z = 620, 590, 20  # n = 1230 > MAJ_EXACT_MAX_N
    keys, correct = _two_groups(a, b, z)
    s1 = maj_at_k_curve(keys, correct, num_subsets=400, seed=1)
    assert s1 == maj_at_k_curve(keys, correct, num_subsets=400, seed=1)
    assert s1 != maj_at_k_curve(keys, correct, num_subsets=400, seed=2)
    ks = list(range(1, 1231, 41))
    err = [abs(s1[k - 1] - _two_groups_closed_form(a, b, z, k)) for k in ks]
    assert max(err) < 0.1 and sum(err) / len(err) < 0.03  # 400 orders: standard error <= 0.025 per k
    assert s1[-1] == 1.0  # every order's full vote: 620 against 590
    with pytest.raises(ValueError, match="n <= 1000"):
        maj_at_k_curve(keys, correct, method="exact")


def test_sampled_orders_agree_with_brute_force_on_small_problems():
    rng = random.Random(9)
    for _ in range(20):
        n = rng.randint(2, 8)
        keys = [rng.choice([None, "a", "b", "c"]) for _ in range(n)]
        correct = [q == "b" for q in keys]
        est = maj_at_k_curve(keys, correct, method="sampled", num_subsets=4000, seed=3)
        brute = [maj_at_k_bruteforce(keys, correct, k) for k in range(1, n + 1)]
        assert max(abs(x - y) for x, y in zip(est, brute)) < 0.04, (keys, est, brute)
