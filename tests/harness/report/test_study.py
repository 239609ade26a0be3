"""`harness report --study`: a hand-made two-seed sweep of every study arm (with per-problem
records) through build_study_report; the claims' paired differences, standard errors, p-values,
Holm adjustments and verdicts against values computed by hand here; a six-seed sweep built to
give each of the four verdicts; byte-identical reports on recompute; Table 5, the large-K
check, the plots and the CLI."""
from __future__ import annotations

import csv
import json
import math
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t as student_t

from _fake_results import make_study_run
from harness.cli.main import main as harness_main
from harness.report.decisions import Design
from harness.report.stats import paired_diff_ci, verdict
from harness.report.study import (build_study_report, compute_curves, large_k_check, load_study, run_seconds,
                                   time_summary)
from harness.report.study_data import CUMULATIVE_FLOPS, acc_curves, arm_name, axes_of, flop_key

T975_1, T975_2 = 12.706204736174707, 4.302652729749464   # t_{0.975, 1} and t_{0.975, 2} from tables
KS = (1, 2, 3, 4)
SAMPLES = [128 * i for i in range(9)]                   # evaluation points: 0 .. 1024 samples

# start (per seed, shared by every arm): in-domain, OOD, pass@K and maj@K for K = 1..4
START = {0: {"acc": 0.40, "ood": 0.20, "pass": [0.40, 0.60, 0.72, 0.80], "maj": [0.40, 0.40, 0.43, 0.45]},
         1: {"acc": 0.50, "ood": 0.30, "pass": [0.50, 0.68, 0.78, 0.85], "maj": [0.50, 0.50, 0.53, 0.55]}}
# final in-domain acc, OOD acc and peak RSS (MiB) per arm and seed
FINAL = {
    "grpo":      {0: (0.60, 0.25, 300.0), 1: (0.70, 0.352, 320.0)},
    "grpo_ps":   {0: (0.65, 0.26, 305.0), 1: (0.75, 0.36, 322.0)},
    "rft":       {0: (0.55, 0.22, 280.0), 1: (0.58, 0.31, 290.0)},
    "ppo":       {0: (0.62, 0.24, 500.0), 1: (0.69, 0.33, 530.0)},
    "grpo_iter": {0: (0.58, 0.24, 301.0), 1: (0.68, 0.34, 321.0)},
    "dr_grpo":   {0: (0.61, 0.25, 300.0), 1: (0.69, 0.34, 320.0)},
    "rloo":      {0: (0.59, 0.23, 300.0), 1: (0.71, 0.35, 320.0)},
}
GRPO_K = {0: {"pass": [0.60, 0.70, 0.74, 0.78], "maj": [0.60, 0.60, 0.66, 0.70]},
          1: {"pass": [0.70, 0.77, 0.80, 0.86], "maj": [0.70, 0.70, 0.76, 0.80]}}


def write_run(root: Path, algo: str, seed: int, iterative: bool = False, **kw) -> Path:
    """One hand-made study run (`_fake_results.make_study_run`) from the tables above."""
    arm = "grpo_iter" if iterative else algo
    acc, ood, rss = FINAL[arm][seed]
    k = GRPO_K[seed] if arm == "grpo" else {"pass": [1 - (1 - acc) ** kk for kk in KS], "maj": [acc] * len(KS)}
    return make_study_run(root, algo, seed, start=START[seed], final={"acc": acc, "ood": ood, **k}, rss=rss,
                          iterative=iterative, **kw)


def make_study_sweep(root: Path, arms=tuple(FINAL), seeds=(0, 1), **kw) -> Path:
    sweep = root / "study"
    for arm in arms:
        for seed in seeds:
            write_run(sweep, "grpo" if arm == "grpo_iter" else arm, seed, iterative=arm == "grpo_iter", **kw)
    (sweep / "sweep.json").write_text(json.dumps({"name": "study", "started": 1000.0, "updated": 1900.0}))
    return sweep


DESIGN2 = Design(first_look=2, cap=2, n_boot=2000)   # a fixed design at the two seeds of the hand-made sweep


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    sweep = make_study_sweep(tmp_path_factory.mktemp("res"))
    out = tmp_path_factory.mktemp("study_out")
    return sweep, out, build_study_report(sweep, out, n_boot=20, design=DESIGN2)


def _claims(out: Path) -> dict:
    with open(out / "claims.csv") as f:
        return {(r["id"], r["what"]): r for r in csv.DictReader(f)}


def _t(diffs):
    n = len(diffs)
    return statistics.mean(diffs), (T975_1 if n == 2 else T975_2) * statistics.stdev(diffs) / math.sqrt(n)


def test_paired_interval_and_verdict_on_hand_cases():
    d = paired_diff_ci({0: 0.10, 1: 0.11, 2: 0.06}, {0: 0.0, 1: 0.0, 2: 0.0})
    assert d["mean"] == pytest.approx(0.09) and d["n"] == 3
    assert d["half"] == pytest.approx(T975_2 * math.sqrt(0.0007) / math.sqrt(3)) and d["half"] == pytest.approx(0.0657, abs=1e-4)
    assert verdict(d, 1) == "reproduced" and verdict(d, -1) == "contradicted"
    assert verdict(paired_diff_ci({0: 1.0, 1: -1.0}, {0: 0.0, 1: 0.0}), 1) == "inconclusive"


def test_arms_come_from_algorithm_and_reference_resets(built):
    sweep, _, _ = built
    study = load_study(sweep)
    assert list(study.arms) == ["grpo", "grpo_ps", "rft", "ppo", "grpo_iter", "dr_grpo", "rloo"]
    assert all(sorted(rs) == [0, 1] for rs in study.arms.values())
    assert study.task == "arith" and study.ood == "arith_ood" and study.ks == {"arith": 4, "arith_ood": 4}


def _records(run_dir: Path, name: str) -> dict:
    recs = [json.loads(line) for line in (run_dir / "eval" / name).read_text().splitlines()]
    return {r["id"]: r for r in recs}


def _crossed_var_problems(per_seed: list) -> float:
    """The problem main effect's sigma_b^2 / P, by hand (plain Python): two-way analysis of variance
    without replication, sigma_b^2 = var(problem means, ddof 1) - MS_e / S, floored at 0."""
    s, p = len(per_seed), len(per_seed[0])
    col = [sum(d[j] for d in per_seed) / s for j in range(p)]
    row = [sum(d) / p for d in per_seed]
    g = sum(row) / s
    var1 = sum((x - g) ** 2 for x in col) / (p - 1)
    ms_e = sum((per_seed[i][j] - row[i] - col[j] + g) ** 2 for i in range(s) for j in range(p)) / ((s - 1) * (p - 1))
    return max(0.0, var1 - ms_e / s) / p


def test_claims_equal_hand_computed_values(built):
    sweep, out, _ = built
    c = _claims(out)
    expected = {  # (id, what): per-seed diffs
        ("1", "arith/acc"): [65 - 60, 75 - 70],
        ("2", "arith/acc"): [60 - 55, 70 - 58],
        ("3", "maj@4"): [70 - 45, 80 - 55],
        ("3", "pass@4"): [78 - 80, 86 - 85],
        ("4", "arith/acc"): [58 - 60, 68 - 70],
        ("5", "peak rss_mb"): [300 - 500, 320 - 530],
        ("6", "arith_ood/acc"): [25 - 20, 35.2 - 30],
    }
    assert set(c) == set(expected)
    for key, diffs in expected.items():
        row = c[key]
        mean, half = _t(diffs)
        assert float(row["mean_diff"]) == pytest.approx(mean, abs=1e-9), key
        # the t interval is the decision's: mean +- t_{n-1} SE (the seeds' alone where no problem level)
        half = student_t.ppf(0.975, 1) * float(row["se"])
        assert float(row["t_lo"]) == pytest.approx(mean - half, abs=1e-6), key
        assert float(row["t_hi"]) == pytest.approx(mean + half, abs=1e-6), key
        if key[0] == "5":
            assert half == pytest.approx(_t(diffs)[1], rel=1e-9)
        assert [float(v) for v in row["per_seed"].split()] == pytest.approx(diffs, abs=1e-4)
        assert int(row["n_pairs"]) == 2 and row["seeds"] == "0 1"
        assert float(row["boot_lo"]) <= float(row["boot_hi"])
    # claim 1 by hand: per-problem greedy differences of the two seeds (crossed: the same problems)
    study = load_study(sweep)
    per = []
    for seed in (0, 1):
        a = _records(study.arms["grpo_ps"][seed].run_dir, "arith_8.jsonl")
        b = _records(study.arms["grpo"][seed].run_dir, "arith_8.jsonl")
        per.append([100.0 * (a[i]["greedy"]["correct"] - b[i]["greedy"]["correct"]) for i in sorted(a)])
    vp = _crossed_var_problems(per)
    row = c[("1", "arith/acc")]
    assert row["boot_scheme"] == "crossed" and row["n_problems"] == "500"
    assert float(row["var_problems"]) == pytest.approx(vp, rel=1e-8)
    se = math.sqrt(statistics.variance([5.0, 5.0]) / 2 + vp)
    assert float(row["se"]) == pytest.approx(se, rel=1e-8)
    assert float(row["p_diff"]) == pytest.approx(2 * student_t.sf(5.0 / se, 1), rel=1e-8)
    assert float(row["p_tost"]) == pytest.approx(max(student_t.sf((5.0 + 2.0) / se, 1), student_t.cdf((5.0 - 2.0) / se, 1)),
                                                 rel=1e-8)
    # claim 5 has no problem level: SE = s / sqrt(n), SESOI 32 MiB
    row = c[("5", "peak rss_mb")]
    assert row["boot_scheme"] == "seeds" and float(row["var_problems"]) == 0.0 and float(row["sesoi"]) == 32.0
    se = statistics.stdev([-200.0, -210.0]) / math.sqrt(2)
    assert float(row["p_diff"]) == pytest.approx(2 * student_t.sf(205.0 / se, 1), rel=1e-8)
    # a fixed design: the sequential p-value is the look's; Holm over the 7 parts by hand (the j-th
    # smallest p-value times the parts with a hypothesis at position j or later)
    rows = list(c.values())
    assert all(r["seq_p_diff"] == r["p_diff"] and r["seq_p_tost"] == r["p_tost"] for r in rows)
    ps = [float(r[k]) for r in rows for k in ("p_diff", "p_tost")]
    order = sorted(range(len(ps)), key=lambda i: (ps[i], i))
    adj, run = [0.0] * len(ps), 0.0
    for j, i in enumerate(order):
        run = max(run, min(1.0, len({k // 2 for k in order[j:]}) * ps[i]))
        adj[i] = run
    got = [float(r[k]) for r in rows for k in ("holm_p_diff", "holm_p_tost")]
    assert got == pytest.approx(adj, rel=1e-8)
    # each part's verdict follows its Holm p-values and its mean's sign (a fixed design: one look)
    for r in rows:
        sign = 1 if float(r["mean_diff"]) > 0 else -1
        want = ("reproduced" if sign == (1 if r["expected"] == "> 0" else -1) else "contradicted") \
            if float(r["holm_p_diff"]) <= 0.05 else ("equivalent" if float(r["holm_p_tost"]) <= 0.05 else "underpowered")
        assert r["part_verdict"] == want, (r["id"], r["what"])
    # (with two seeds, t on 1 degree of freedom, a part is decided only where the seeds agree: no seed
    # spread, the test set's term alone is its SE)
    # (claim 3's maj@4 part alone is decided: +25 points on every seed and problem)
    assert c[("3", "maj@4")]["part_verdict"] == "reproduced" and c[("3", "pass@4")]["part_verdict"] == "underpowered"
    # seeds needed: claim 1 (+5 per seed) a finite number
    assert int(c[("1", "arith/acc")]["seeds_needed"]) > 2
    md = (out / "report.md").read_text()
    assert "m = 7 parts" in md and "α = 0.05" in md and "claim 5: ±32 MiB" in md and "claim 1: ±2.00 points" in md


def test_missing_algorithms_are_not_run(tmp_path):
    sweep = make_study_sweep(tmp_path, arms=("grpo", "rft"))
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2)
    c = _claims(tmp_path / "out")
    for cid in ("1", "4", "5"):
        (row,) = [r for k, r in c.items() if k[0] == cid]
        assert row["what"].startswith("not run") and row["verdict"] == "not run" and row["n_pairs"] == "0"
    assert c[("2", "arith/acc")]["verdict"] == "underpowered"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "not run (grpo_ps)" in md and "not run (grpo_iter)" in md and "not run (ppo)" in md
    assert "family** of claims 2, 3, 6" in md and "m = 4 parts" in md


def _six_seed_sweep(root: Path) -> Path:
    """Six seeds built so that each verdict occurs: claim 1 (grpo_ps 20 points above grpo on
    every seed) reproduced; claim 2 (rft = grpo, the same problems right) equivalent; claim 4
    (grpo_iter 15 points below grpo) contradicted; claim 5 (grpo 200 MiB below ppo) reproduced;
    claim 6 (the out-of-domain gain +3, -4, +5, -2, +1, -3 points) underpowered."""
    sweep = root / "six"
    ood_gain = [0.03, -0.04, 0.05, -0.02, 0.01, -0.03]
    for seed in range(6):
        start = {"acc": 0.40, "ood": 0.20, "pass": [0.40, 0.60], "maj": [0.40, 0.42]}
        fin = lambda acc, ood: {"acc": acc, "ood": ood, "pass": [acc, min(1.0, acc + 0.15)], "maj": [acc, acc + 0.02]}
        base = fin(0.60 + 0.01 * seed, 0.20 + ood_gain[seed])
        make_study_run(sweep, "grpo", seed, start=start, final=base, rss=300.0 + seed, arm_key="g")
        make_study_run(sweep, "rft", seed, start=start, final=base, rss=280.0, arm_key="g")
        make_study_run(sweep, "grpo_ps", seed, start=start, final=fin(0.80 + 0.01 * seed, 0.2), rss=300.0)
        make_study_run(sweep, "grpo", seed, start=start, final=fin(0.45 + 0.01 * seed, 0.2), rss=300.0, iterative=True)
        make_study_run(sweep, "ppo", seed, start=start, final=base, rss=500.0 + seed)
    return sweep


def test_each_verdict_on_a_constructed_sweep(tmp_path):
    sweep = _six_seed_sweep(tmp_path)
    design = Design(first_look=6, cap=6, n_boot=2000)
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=design)
    c = _claims(tmp_path / "out")
    verdicts = {cid: r["verdict"] for (cid, _), r in c.items()}
    assert verdicts["1"] == "reproduced" and verdicts["5"] == "reproduced"
    assert verdicts["2"] == "equivalent" and verdicts["4"] == "contradicted" and verdicts["6"] == "underpowered"
    eq = c[("2", "arith/acc")]
    assert float(eq["mean_diff"]) == 0.0 and float(eq["se"]) == 0.0 and float(eq["p_tost"]) == 0.0
    und = c[("6", "arith_ood/acc")]
    diffs = [3.0, -4.0, 5.0, -2.0, 1.0, -3.0]
    assert [float(v) for v in und["per_seed"].split()] == pytest.approx(diffs, abs=1e-9)
    # mean 0: only equivalence could decide it; the seeds a fixed design would need for the TOST
    assert int(und["seeds_needed"]) > 6 and und["status"].startswith("cap of 6 seeds reached")
    assert c[("1", "arith/acc")]["status"] == "decided: stop" and c[("1", "arith/acc")]["decided_at"] == "6"


def test_sequential_looks_decide_early_and_say_which_arms_need_seeds(tmp_path):
    """Looks at 3..6 of a cap of 10: claim 5's 200 MiB on every seed is decided at the first
    look; claim 6 stays open and its arm (grpo) is asked for a seventh seed."""
    sweep = _six_seed_sweep(tmp_path)
    design = Design(first_look=3, cap=10, n_boot=2000)
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=design)
    c = _claims(tmp_path / "out")
    mem = c[("5", "peak rss_mb")]
    assert mem["verdict"] == "reproduced" and mem["decided_at"] == "3"
    assert c[("6", "arith_ood/acc")]["status"] == "continue: next look at 7 seeds (cap 10)"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "**Arms that need more seeds** (for the claims still open, up to the cap): GRPO" in md
    assert "obrien-fleming-type α spending" in md


def test_reports_are_byte_identical_on_recompute(tmp_path):
    """report.md, claims.csv and table5.csv: twice from the same run folders, and once more from
    a copy of them elsewhere, into other output folders: the same bytes."""
    sweep = make_study_sweep(tmp_path / "a")
    copy = tmp_path / "b" / "elsewhere" / "study"
    shutil.copytree(sweep, copy)
    outs = [tmp_path / "o1", tmp_path / "o2" / "deeper", tmp_path / "o3"]
    for src, out in zip((sweep, sweep, copy), outs):
        build_study_report(src, out, n_boot=30, design=DESIGN2)
    for name in ("report.md", "claims.csv", "table5.csv", "compute_curves.csv"):
        first = (outs[0] / name).read_bytes()
        assert all((o / name).read_bytes() == first for o in outs[1:]), name


def test_runs_without_records_resample_seeds_only_and_say_so(tmp_path):
    sweep = make_study_sweep(tmp_path, arms=("grpo", "grpo_ps"), records=False)
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2)
    c = _claims(tmp_path / "out")
    row = c[("1", "arith/acc")]
    assert row["boot_scheme"] == "seeds" and "problems not resampled" in row["note"] and "no records" in row["note"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "0 of 4 runs have per-problem evaluation records" in md


def test_table5_and_header(built):
    sweep, out, report = built
    with open(out / "table5.csv") as f:
        rows = {r["algorithm"]: r for r in csv.DictReader(f)}
    g = rows["grpo"]
    assert float(g["id_start_mean"]) == pytest.approx(45.0) and float(g["id_after_mean"]) == pytest.approx(65.0)
    assert float(g["id_after_ci95"]) == pytest.approx(T975_1 * statistics.stdev([60, 70]) / math.sqrt(2))
    assert float(g["ood_after_mean"]) == pytest.approx(30.1)
    assert float(g["id_gain_mean"]) == pytest.approx(20.0) and float(g["id_gain_hi"]) == pytest.approx(20.0)
    md = report.read_text()
    assert "`harness report <sweep folder study> --study --output-dir <folder>`" in md
    assert "**Runs' provenance:** not recorded" in md and "numpy " in md and "scipy " in md
    assert "all 14 runs have per-problem evaluation records" in md
    assert "two-sided Student-t" in md and "paired by seed" in md
    assert "grpo: 2 (0, 1)" in md and "iterative GRPO" in md
    # warm-up trained by the seed-0 runs only (7 x 100 s); the sweep's wall-clock from sweep.json
    assert "warm-up 700 s" in md and "900 s (sweep.json)" in md
    assert "exact expectation over all K-subsets" in md and "unbiased estimator" in md


def test_large_k_check_means_and_per_seed(built):
    sweep, _, report = built
    study = load_study(sweep)
    (g,) = [r for r in large_k_check(study, "arith") if r["algorithm"] == "grpo"]
    # means: start [.45, .64, .75, .825] vs grpo [.65, .735, .77, .82] -> the start is above at K = 4
    assert g["mean_cross"] == 4
    assert g["per_seed"] == {0: 4, 1: None}  # seed 0: .80 > .78 at K = 4; seed 1: .85 < .86
    assert g["diff_at_n"]["mean"] == pytest.approx(-0.5)
    assert "s0: 4, s1: never" in report.read_text()


def test_plots_and_compute_curves_exist(built):
    _, out, report = built
    for name in ("fig5_accuracy", "fig6_iterative", "fig7_maj_pass_at_k", "compute_curves"):
        p = out / "plots" / f"{name}.png"
        assert p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"plots/{name}.png" in report.read_text()
    with open(out / "compute_curves.csv") as f:
        rows = list(csv.DictReader(f))
    # seconds from runs not flagged as timed on an uncontended machine are not a compute axis
    assert {(r["algorithm"], r["axis"]) for r in rows} == {(a, "samples") for a in FINAL}
    g = next(r for r in rows if r["algorithm"] == "grpo" and r["axis"] == "samples")
    assert float(g["r0"]) == pytest.approx(0.45) and 0.45 <= float(g["a"]) <= 1.0
    assert g["n_points"] == "8" and g["n_boot"] == "20"
    assert float(g["extrap_observed"]) == pytest.approx(0.65) and float(g["extrap_fit_upto"]) == 512.0
    assert float(g["extrap_tolerance"]) == 0.02 and g["extrap_passed"] in ("pass", "fail")
    assert (abs(float(g["extrap_error"])) <= 0.02) == (g["extrap_passed"] == "pass")
    md = report.read_text()
    assert "seconds: not used (runs not flagged as timed on an uncontended machine)" in md
    assert "|predicted − observed| ≤ 2.0 accuracy points" in md


def test_flops_and_uncontended_seconds_are_compute_axes(tmp_path):
    sweep = tmp_path / "axes"
    for seed in (0, 1):
        write_run(sweep, "grpo", seed, flops_per_sample=3.0e9, uncontended=True)
        write_run(sweep, "ppo", seed)
    study = load_study(sweep)
    rows = compute_curves(study, n_boot=10)
    assert {(r["algorithm"], r["axis"]) for r in rows} == {("grpo", "samples"), ("grpo", "flops"),
                                                            ("grpo", "seconds"), ("ppo", "samples")}
    f = next(r for r in rows if r["axis"] == "flops")
    s = next(r for r in rows if r["algorithm"] == "grpo" and r["axis"] == "samples")
    # FLOPs proportional to samples: the same fit, C_mid scaled by the FLOPs per sample
    assert f["a"] == pytest.approx(s["a"], abs=1e-6) and f["b"] == pytest.approx(s["b"], rel=1e-4)
    assert f["c_mid"] == pytest.approx(3.0e9 * s["c_mid"], rel=1e-4)


def test_cli_study_flag(tmp_path, capsys):
    sweep = make_study_sweep(tmp_path, arms=("grpo", "ppo"))
    assert harness_main(["report", str(sweep), "--study"]) == 0
    assert (sweep / "study" / "report.md").is_file() and (sweep / "study" / "claims.csv").is_file()
    assert "report.md" in capsys.readouterr().out


def test_run_seconds_with_setup_phases(tmp_path):
    d = write_run(tmp_path, "grpo", 0)
    s = json.loads((d / "summary.json").read_text())
    s.update(setup_seconds={"warmup_wait": 5.0, "warmup_build": 100.0, "initial_eval": 3.0}, started=1000.0,
             ended=1500.0, wall_seconds=392.0)
    (d / "summary.json").write_text(json.dumps(s))
    study = load_study(tmp_path)
    sec = run_seconds(study.arms["grpo"][0])
    # eval: the start evaluation from setup_seconds (3 s) + the final evaluation row (1.5 + 0.5 s);
    # the step-0 row's seconds are the start evaluation already counted
    assert sec == {"warmup": 100.0, "warmup_wait": 5.0, "train": 80.0, "eval": 5.0, "wall": 500.0, "other": 310.0}
    t = time_summary(study)
    assert t["sweep_wall"] == 500.0 and t["sweep_wall_from"] == "first run start to last run end"
    # with time stamps, an evaluation's time is the span from the row before it (the trainer logs a
    # training row, evaluates, logs the evaluation row): 7 s each here, whatever eval/<task>/seconds says
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    t_now, later_evals = 2000.0, 0
    for row in rows:
        is_eval = any(k.startswith("eval/") and k.endswith("/seconds") for k in row)
        later = is_eval and (row.get("samples") or 0) > 0
        later_evals += later
        t_now += 7.0 if later else 10.0
        row["time"] = t_now
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert later_evals >= 1
    assert run_seconds(load_study(tmp_path).arms["grpo"][0])["eval"] == pytest.approx(3.0 + 7.0 * later_evals)


def test_reward_model_arms_and_their_claims(tmp_path):
    """The reward-model sweep's arms: GRPO+PS with a learned PRM (1 and 4 rounds) and PRIME.
    Claim 4 then compares 4 rounds with 1; claim 7 (PRIME vs RLOO, samples to the lower final
    accuracy) and claim 8 (exact checker vs learned PRM) join; by hand below."""
    sweep = tmp_path / "rm"
    start = {"acc": 0.40, "ood": 0.20, "pass": [0.40, 0.60], "maj": [0.40, 0.42]}
    fin = lambda acc: {"acc": acc, "ood": 0.25, "pass": [acc, min(1.0, acc + 0.1)], "maj": [acc, acc + 0.01]}
    acc = {"grpo": (0.60, 0.62), "grpo_ps": (0.66, 0.70), "rloo": (0.58, 0.60), "prime": (0.64, 0.66),
           ("grpo_ps", 1): (0.62, 0.64), ("grpo_ps", 4): (0.64, 0.68)}
    for key, (a0, a1) in acc.items():
        algo, rm = (key, {"type": "implicit"} if key == "prime" else None) if isinstance(key, str) else \
            (key[0], {"type": "prm", "rounds": key[1]})
        for seed, a in ((0, a0), (1, a1)):
            make_study_run(sweep, algo, seed, start=start, final=fin(a), rss=300.0, reward_model=rm)
    study = load_study(sweep)
    assert list(study.arms) == ["grpo", "grpo_ps", "rloo", "grpo_ps_prm", "grpo_ps_prm_r4", "prime"]
    assert arm_name("grpo_ps_prm_r4") == "GRPO (process supervision) + learned PRM, 4 rounds"
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2)
    c = _claims(tmp_path / "out")
    it = c[("4", "arith/acc")]
    assert it["comparison"].startswith("grpo_ps_prm_r4 − grpo_ps_prm")
    assert [float(v) for v in it["per_seed"].split()] == pytest.approx([2.0, 4.0])
    assert [float(v) for v in c[("8", "arith/acc")]["per_seed"].split()] == pytest.approx([4.0, 6.0])
    # claim 7: RLOO reaches its own final accuracy (the lower one) at its last point, 1,024 samples;
    # PRIME's curve crosses it earlier, found here by interpolating its evaluation points
    s7 = c[("7", "samples to the lower final accuracy")]
    assert s7["unit"] == "samples" and float(s7["sesoi"]) == pytest.approx(102.4)   # 10% of the 1,024-sample budget
    g = np.array([0.0] + [1 / (1 + (300 / x) ** 1.5) for x in SAMPLES[1:]])
    want = []
    for (p, r) in zip(acc["prime"], acc["rloo"]):
        y = 0.40 + (p - 0.40) * g / g[-1]
        want.append(1024.0 - float(np.interp(r, y, SAMPLES)))
    assert [float(v) for v in s7["per_seed"].split()] == pytest.approx(want, rel=1e-5)
    assert s7["boot_scheme"] == "seeds"


def test_a_claim_never_measured_is_not_run(tmp_path):
    """Runs without an out-of-domain set: claim 6 is not run (no data), outside the family."""
    sweep = make_study_sweep(tmp_path, arms=("grpo", "grpo_ps"))
    for summary in sweep.glob("*/summary.json"):
        s = json.loads(summary.read_text())
        for k in ("initial_eval", "final_eval"):
            s[k] = {m: v for m, v in s[k].items() if "arith_ood" not in m}
        summary.write_text(json.dumps(s))
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2)
    c = _claims(tmp_path / "out")
    (row,) = [r for k, r in c.items() if k[0] == "6"]
    assert row["verdict"] == "not run" and row["what"].startswith("not run: no data: ")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "family** of claims 1, 3: " in md and "m = 3 parts" in md


def test_stage_flops_summed_into_the_flop_axis(tmp_path):
    """Training rows that carry their own model FLOPs (perf/flops, harness.train.flops) give the
    evaluation rows a cumulative FLOP count: the flops axis is used, x = the sum up to each row."""
    sweep = tmp_path / "study"
    for seed in (0, 1):
        d = make_study_run(sweep, "grpo", seed, start={"acc": 0.5, "ood": 0.1, "pass": [0.5], "maj": [0.5]},
                           final={"acc": 0.7, "ood": 0.2, "pass": [0.7], "maj": [0.7]}, rss=300.0, records=False)
        evals = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        rows = []
        for i, ev in enumerate(evals):  # before each evaluation after the start: its stages, 10 + seed FLOPs each
            if i:
                for s in range(evals[i - 1]["step"] + 1, ev["step"] + 1):
                    rows.append({"step": s, "samples": s * 128, "perf/step_seconds": 1.0, "perf/flops": 10.0 + seed})
            rows.append(ev)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    study = load_study(sweep)
    runs = study.arms["grpo"]
    assert all(flop_key(r, "arith") == CUMULATIVE_FLOPS for r in runs.values())
    assert "flops" in axes_of(study, runs)[0]
    for seed, (x, y) in zip((0, 1), acc_curves(runs, "arith", "flops")):
        steps = [row["step"] for row in runs[seed].rows if "eval/arith/acc" in row]
        assert list(x) == [s * (10.0 + seed) for s in steps]
    # one training row without it: no FLOP axis
    r0 = runs[0]
    r0.rows[1].pop("perf/flops")
    assert flop_key(r0, "arith") is None


def test_a_claim_whose_arm_the_sweep_plans_no_more_seeds_of_stays_underpowered(tmp_path):
    """sweep.json's plan caps an arm's seeds: an open claim on it says so, and asks for no seed of it."""
    from harness.report.study_claims import arms_to_extend, claims, planned_seeds
    sweep = tmp_path / "capped"
    start = {"acc": 0.40, "ood": 0.20, "pass": [0.40, 0.60], "maj": [0.40, 0.42]}
    plan = []
    for algo, seeds in (("grpo", range(5)), ("grpo_ps", range(3))):
        for seed in seeds:
            plan.append({"run_id": f"{algo}-s{seed}", "algorithm": algo, "seed": seed, "cell": {"seed": seed}})
            if seed < 3:
                acc = 0.60 + 0.01 * seed + ((0.01, -0.012, 0.004)[seed] if algo == "grpo_ps" else 0.0)
                make_study_run(sweep, algo, seed, start=start, rss=300.0,
                               final={"acc": acc, "ood": 0.25, "pass": [acc, acc + 0.1], "maj": [acc, acc]})
    (sweep / "sweep.json").write_text(json.dumps({"name": "capped", "runs": plan}))
    study = load_study(sweep)
    assert planned_seeds(study) == {"grpo": 5, "grpo_ps": 3}
    design = Design()
    rows = {c["id"]: c for c in claims(study, design)}
    assert rows["1"]["verdict"] == "underpowered" and rows["1"]["n_pairs"] == 3
    assert rows["1"]["status"].text == "the sweep plans no more seeds of grpo_ps (3): stays underpowered"
    # its spending is measured against its arms' own cap (3): one look, at the full alpha
    res1 = rows["1"]["parts"][0]["result"]
    assert res1["cap"] == 3 and [lk["n"] for lk in res1["looks"]] == [3] and res1["seq_p_diff"] == res1["looks"][0]["p_diff"]
    assert rows["3"]["status"].text.startswith("continue: next look at 4 seeds")   # GRPO alone: more planned
    assert arms_to_extend(list(rows.values()), design) == {"grpo": 4}


def test_amendments_in_sweep_json_are_printed_beside_the_decision_rules(tmp_path):
    """sweep.json's report.amendments (the sweep file's dated design changes) appear under the claims'
    decision rules, in order; without any, no such paragraph."""
    sweep = make_study_sweep(tmp_path, arms=("grpo", "grpo_ps"))
    doc = {"name": "study", "report": {"study": True, "selection": None, "amendments": [
        "2026-11-27: the learned-PRM arms from 3 to 5 seeds.", "2026-11-28: a second change."]}}
    (sweep / "sweep.json").write_text(json.dumps(doc))
    md = build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2).read_text()
    i = md.index("**Amendments to the design after data came in**")
    assert md.index("Decision rules, stated before the data") < i < md.index("| id | claim | comparison |")
    assert "\n- 2026-11-27: the learned-PRM arms from 3 to 5 seeds.\n- 2026-11-28: a second change.\n" in md[i:]
    doc["report"].pop("amendments")
    (sweep / "sweep.json").write_text(json.dumps(doc))
    assert "Amendments" not in build_study_report(sweep, tmp_path / "out2", n_boot=5, design=DESIGN2).read_text()
