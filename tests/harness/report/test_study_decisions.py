"""Verdicts on constructed data: each of the four verdicts from per-seed (and per-problem)
differences, their p-values and Holm adjustments by hand, decisions at looks, the seeds a
claim would need (against the noncentral t), the sequential plan, composite claims, and the
per-problem records reader (full, trimmed, missing, inconsistent)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from _fake_results import eval_records
from harness.report.decisions import (Design, PartData, analyse_part, claim_verdict, decide, look_stats,
                                      seeds_needed, sequential_plan, sequential_status)
from harness.report.problems import problem_values
from harness.report.sequential import nominal_levels
from harness.rundir.read import load_run


def _part(values, expected=1, sesoi=2.0, problems=None, key="x/0"):
    return PartData("acc", "points", expected, sesoi, list(range(len(values))), list(values), problems=problems,
                    crossed=problems is not None, key=key)


FIXED6 = Design(first_look=6, cap=6, n_boot=2000)
CASES = {
    "reproduced": ([5.1, 4.9, 5.0, 5.2, 4.8, 5.3], 1),
    "contradicted": ([5.1, 4.9, 5.0, 5.2, 4.8, 5.3], -1),
    "equivalent": ([0.1, -0.1, 0.05, -0.05, 0.0, 0.02], 1),
    "underpowered": ([3.0, -2.0, 5.0, -1.0, 0.5, 4.0], 1),
}


def test_each_verdict_with_hand_p_values_and_holm():
    parts = [_part(v, e, key=f"{i}/0") for i, (v, e) in enumerate(CASES.values())]
    res = decide([(p, analyse_part(p, FIXED6)) for p in parts], FIXED6)
    assert [r["verdict"] for r in res] == list(CASES)
    ps = []
    for (vals, _), r in zip(CASES.values(), res):
        x = np.array(vals)
        assert r["last"]["p_diff"] == pytest.approx(sps.ttest_1samp(x, 0.0).pvalue, rel=1e-9)
        tost = max(sps.ttest_1samp(x, -2.0, alternative="greater").pvalue,
                   sps.ttest_1samp(x, 2.0, alternative="less").pvalue)
        assert r["last"]["p_tost"] == pytest.approx(tost, rel=1e-9)
        assert r["seq_p_diff"] == r["last"]["p_diff"]          # one look at the cap: the fixed test
        ps += [r["seq_p_diff"], r["seq_p_tost"]]
    # Holm over the 4 parts by hand: the j-th smallest of the 8 p-values is multiplied by the number
    # of parts with a hypothesis at position j or later (a part's diff and TOST nulls exclude each other)
    order = list(np.argsort(ps, kind="stable"))
    adj, run = np.empty(8), 0.0
    for j, i in enumerate(order):
        t = len({k // 2 for k in order[j:]})
        run = max(run, min(1.0, t * ps[i]))
        adj[i] = run
    assert len({k // 2 for k in order}) == 4
    got = [p for r in res for p in (r["holm_p_diff"], r["holm_p_tost"])]
    assert got == pytest.approx(list(adj), rel=1e-12)
    # the t interval over seeds and the (seed-level) bootstrap interval are shown
    r = res[0]
    x = np.array(CASES["reproduced"][0])
    half = sps.t.ppf(0.975, 5) * x.std(ddof=1) / math.sqrt(6)
    assert (r["t_lo"], r["t_hi"]) == pytest.approx((x.mean() - half, x.mean() + half))
    assert r["boot_lo"] >= x.min() and r["boot_hi"] <= x.max() and r["scheme"] == "seeds"
    # underpowered: how many seeds; the decided ones: none
    assert res[3]["seeds_needed"] > 6 and res[0]["seeds_needed"] is None and res[0]["decided_at"] == 6


def test_holm_can_withhold_a_verdict_a_lone_test_would_give():
    """p_diff = 0.02 alone is 'reproduced' at 0.05; beside three null parts (m = 4 parts) it is not."""
    lone = _part([1.0, 2.0, 1.5, 0.5, 2.5, 0.2])
    p = analyse_part(lone, FIXED6)["last"]["p_diff"]
    assert 0.01 < p < 0.05
    assert decide([(lone, analyse_part(lone, FIXED6))], FIXED6)[0]["verdict"] == "reproduced"
    nulls = [_part([3.0, -2.0, 5.0, -1.0, 0.5, -4.0], key=f"n/{i}") for i in range(3)]
    res = decide([(q, analyse_part(q, FIXED6)) for q in [lone] + nulls], FIXED6)
    assert res[0]["verdict"] == "underpowered" and res[0]["holm_p_diff"] > 0.05


def test_problem_level_widens_the_standard_error():
    """Per-seed differences all +3, but the per-problem differences scatter: SE^2 = 0 + the
    problem main effect's sigma_b^2 / P, so the difference test sees the test set's noise."""
    rng = np.random.default_rng(0)
    base = rng.choice([-100.0, 0.0, 100.0], size=50, p=[0.1, 0.77, 0.13])
    base += 3.0 - base.mean()
    per = [base.copy() for _ in range(6)]
    part = _part([3.0] * 6, problems=per)
    lk = look_stats(part, 6)
    vp = base.var(ddof=1) / 50 - 0.0                    # identical seeds: no residual (MS_e = 0)
    assert lk["var_problems"] == pytest.approx(vp) and lk["se"] == pytest.approx(math.sqrt(vp))
    assert lk["p_diff"] == pytest.approx(2 * sps.t.sf(3.0 / math.sqrt(vp), 5))
    seed_only = look_stats(_part([3.0] * 6), 6)
    assert seed_only["se"] == 0.0 and seed_only["p_diff"] == 0.0


def test_a_sequential_design_decides_at_the_first_look_whose_p_is_below_its_boundary():
    design = Design(first_look=3, cap=10, n_boot=500)
    vals = [4.0, 4.4, 3.8, 4.2, 3.9, 4.1, 4.3]
    part = _part(vals)
    r = decide([(part, analyse_part(part, design))], design)[0]
    assert [lk["n"] for lk in r["looks"]] == [3, 4, 5, 6, 7]
    # one part: Holm's first step gives its diff hypothesis all of alpha (m = 1 part)
    lv = nominal_levels([n / 10 for n in range(3, 8)], 0.05)
    first = next(lk["n"] for lk, v in zip(r["looks"], lv) if lk["p_diff"] <= v)
    assert r["verdict"] == "reproduced" and r["decided_at"] == first
    # the same p-values tested at 0.05 at every look without spending would have stopped earlier
    assert any(lk["p_diff"] <= 0.05 for lk in r["looks"][: first - 3]) or first == 3


def test_seeds_needed_against_the_noncentral_t():
    for mean, sd in ((1.0, 2.0), (2.5, 4.0), (0.8, 1.0)):
        n = seeds_needed(mean, sd, 0.0, sesoi=0.1, a=0.05 / 8)
        power = lambda k: sps.nct.sf(sps.t.ppf(1 - 0.05 / 16, k - 1), k - 1, mean / (sd / math.sqrt(k)))
        assert power(n) >= 0.78 and power(n - 1) < 0.8
    # equivalence is what decides a near-zero mean
    n_eq = seeds_needed(0.1, 2.0, 0.0, sesoi=2.0, a=0.05)
    assert n_eq is not None and n_eq < seeds_needed(0.1, 2.0, 0.0, sesoi=1.0, a=0.05)
    assert seeds_needed(0.1, 2.0, 0.0, sesoi=0.2, a=0.05) is None      # ~3,000 seeds: beyond the search
    # a test-set variance that alone exceeds what the effect allows: never, whatever the seeds
    assert seeds_needed(1.0, 2.0, 1.0, sesoi=2.0, a=0.05) is None
    assert seeds_needed(float("nan"), 2.0, 0.0, 2.0, 0.05) is None


def test_claim_verdict_rules():
    assert claim_verdict("simple", ["equivalent"]) == "equivalent"
    mp = lambda maj, pas: claim_verdict("maj_pass", [maj, pas])
    assert mp("reproduced", "reproduced") == "reproduced"       # pass@n below 0
    assert mp("reproduced", "equivalent") == "reproduced"       # pass@n within the SESOI
    assert mp("reproduced", "contradicted") == "contradicted"   # pass@n lifted too
    assert mp("contradicted", "underpowered") == "contradicted"
    assert mp("equivalent", "equivalent") == "contradicted"     # no maj@n lift
    assert mp("reproduced", "underpowered") == "underpowered"
    assert mp("underpowered", "equivalent") == "underpowered"


def test_sequential_status_and_plan():
    d = Design(first_look=3, cap=10)
    assert sequential_status("reproduced", 4, ["grpo"], d).decided
    st = sequential_status("underpowered", 4, ["grpo", "rft"], d)
    assert not st.decided and st.text == "continue: next look at 5 seeds (cap 10)" and st.arms == ["grpo", "rft"]
    assert sequential_status("underpowered", 2, ["grpo"], d).text.startswith("continue: next look at 3 seeds")
    assert sequential_status("underpowered", 10, ["grpo"], d).text == "cap of 10 seeds reached: stays underpowered"
    plan = sequential_plan([{"id": "1", "verdict": "underpowered", "n_pairs": 5, "arms": ["grpo", "grpo_ps"]},
                            {"id": "2", "verdict": "equivalent", "n_pairs": 5, "arms": ["grpo", "rft"]},
                            {"id": "4", "verdict": "underpowered", "n_pairs": 3, "arms": ["grpo", "grpo_iter"]}], d)
    assert plan["arms"] == {"grpo": 6, "grpo_iter": 4, "grpo_ps": 6}
    assert plan["status"]["2"].decided and not plan["status"]["1"].decided
    with pytest.raises(ValueError):
        Design(first_look=1)


# --------------------------------------------------------------------------- per-problem records


def _run(tmp_path, recs_by_file: dict, final_eval: dict, initial_eval: dict | None = None):
    d = tmp_path / "run"
    (d / "eval").mkdir(parents=True)
    for name, recs in recs_by_file.items():
        (d / "eval" / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = [{"step": 0, "samples": 0, "tokens": 0, "seconds": 0.0, **(initial_eval or {})},
            {"step": 4, "samples": 64, "tokens": 640, "seconds": 1.0, **final_eval}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"run_id": "r", "algorithm": "grpo", "seed": 0, "status": "finished",
                                                "config": {"task": {"name": "arith"}},
                                                "final_eval": final_eval, "initial_eval": initial_eval or {}}))
    return load_run(d)


def test_problem_values_from_full_and_trimmed_records(tmp_path):
    correct = [True, False, True, True]
    recs = eval_records("arith", correct, {"pass": [0.5, 0.75], "maj": [0.5, 0.6]}, spread=0.1)
    run = _run(tmp_path, {"arith_4.jsonl": recs},
               {"eval/arith/acc": 0.75, "eval/arith/pass@2": 0.75, "eval/arith/maj@2": 0.6})
    acc, why = problem_values(run, "arith", "acc", "final")
    assert why == "" and acc == {"arith-0": 1.0, "arith-1": 0.0, "arith-2": 1.0, "arith-3": 1.0}
    p2, _ = problem_values(run, "arith", "pass@2", "final")
    assert p2 == pytest.approx({"arith-0": 0.85, "arith-1": 0.65, "arith-2": 0.85, "arith-3": 0.65})
    # trimmed: no curves, only the samples' keys and correctness -> recomputed
    trimmed = [{"id": "a", "greedy": {"correct": True}, "samples": [{"key": "1", "correct": True}, {"key": "2", "correct": False},
                                                                    {"key": "1", "correct": True}]},
               {"id": "b", "greedy": {"correct": False}, "num_correct": 0,
                "samples": [{"key": "3", "correct": False}] * 3}]
    run = _run(tmp_path / "t", {"arith_4.jsonl": trimmed},
               {"eval/arith/acc": 0.5, "eval/arith/pass@2": 0.5, "eval/arith/maj@3": 0.5})
    p2, why = problem_values(run, "arith", "pass@2", "final")
    assert why == "" and p2 == {"a": 1.0, "b": 0.0}          # 1 - C(1,2)/C(3,2) = 1
    m3, _ = problem_values(run, "arith", "maj@3", "final")
    assert m3 == {"a": 1.0, "b": 0.0}


def test_problem_values_refuse_missing_or_inconsistent_records(tmp_path):
    recs = eval_records("arith", [True, False], None)
    run = _run(tmp_path, {"arith_4.jsonl": recs}, {"eval/arith/acc": 0.9}, {"eval/arith/acc": 0.5})
    vals, why = problem_values(run, "arith", "acc", "final")
    assert vals is None and "differs from the summary" in why
    vals, why = problem_values(run, "arith", "acc", "initial")
    assert vals is None and "no records eval/arith_0.jsonl" in why
    vals, why = problem_values(run, "arith", "pass@2", "final")
    assert vals is None and "lacks pass@2" in why


def test_seeds_beyond_the_cap_are_shown_not_used():
    design = Design(first_look=3, cap=4, n_boot=200)
    part = _part([1.0, 1.2, 0.9, 1.1, -9.0, 30.0])
    r = decide([(part, analyse_part(part, design))], design)[0]
    assert [lk["n"] for lk in r["looks"]] == [3, 4] and r["n"] == 6
    assert r["verdict"] == "reproduced" and "seeds beyond the cap (4 5)" in r["note"]
