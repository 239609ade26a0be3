"""`harness report --study`: a hand-made two-seed sweep of every study arm through
build_study_report; the claims' paired differences and verdicts against values computed by
hand here, Table 5, the large-K check, the plots and the CLI."""
from __future__ import annotations

import csv
import json
import math
import statistics
import zlib
from pathlib import Path

import pytest

from harness.cli.main import main as harness_main
from harness.report.stats import paired_diff_ci, verdict
from harness.report.study import (build_study_report, large_k_check, load_study, maj_pass_verdict, run_seconds,
                                   time_summary)

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


def _evals(acc: float, ood: float, pas: list, maj: list) -> dict:
    e = {"eval/arith/acc": acc, "eval/arith/mean_acc": acc, "eval/arith_ood/acc": ood,
         "eval/arith/seconds": 1.5, "eval/arith_ood/seconds": 0.5}
    for k, p, m in zip(KS, pas, maj):
        e.update({f"eval/arith/pass@{k}": p, f"eval/arith/maj@{k}": m,
                  f"eval/arith_ood/pass@{k}": min(1.0, p - 0.2), f"eval/arith_ood/maj@{k}": m - 0.2})
    return e


def write_run(root: Path, algo: str, seed: int, iterative: bool = False) -> Path:
    """One hand-made run directory: summary.json and metrics.jsonl (evaluation rows at SAMPLES,
    accuracy rising from the start to the final value along a saturating curve)."""
    s, (acc, ood, rss) = START[seed], FINAL["grpo_iter" if iterative else algo][seed]
    k = GRPO_K[seed] if algo == "grpo" and not iterative else \
        {"pass": [1 - (1 - acc) ** kk for kk in KS], "maj": [acc] * len(KS)}
    initial, final = _evals(s["acc"], s["ood"], s["pass"], s["maj"]), _evals(acc, ood, k["pass"], k["maj"])
    name = "grpo" if iterative else algo
    d = root / f"{name}-s{seed}-{zlib.crc32(f'{algo}{iterative}'.encode()):08x}"
    d.mkdir(parents=True)
    g = [0.0] + [1 / (1 + (300 / c) ** 1.5) for c in SAMPLES[1:]]
    rows = []
    for c, gi in zip(SAMPLES, g):
        sec = c / 128 * (10.0 + seed)
        ev = initial if c == 0 else (final if c == SAMPLES[-1] else
                                     {"eval/arith/acc": s["acc"] + (acc - s["acc"]) * gi / g[-1],
                                      "eval/arith_ood/acc": s["ood"] + (ood - s["ood"]) * gi / g[-1]})
        rows.append({"samples": c, "tokens": 20 * c, "step": c // 128, "seconds": sec, **ev})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"name": "study", "seed": seed, "algorithm": {"name": name, "ref_reset_every": 4 if iterative else 0},
              "task": {"name": "arith"}, "budget": {"unit": "samples", "amount": 1024}}
    summary = {"run_id": d.name, "name": "study", "algorithm": name, "seed": seed, "status": "finished",
               "config": config, "initial_eval": initial, "final_eval": final,
               "budget": {"unit": "samples", "amount": 1024, "consumed": {"samples": 1024, "seconds": rows[-1]["seconds"]}},
               "peak": {"rss_mb": rss, "rss_above_base_mb": rss - 200, "cuda_mb": None},
               "params": {"policy": 812416}, "start": {"cached": seed != 0, "seconds": 100.0},
               "wall_seconds": rows[-1]["seconds"] + 50.0, "perf": {"perf/peak_rss_mb": rss}}
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def make_study_sweep(root: Path, arms=tuple(FINAL)) -> Path:
    sweep = root / "study"
    for arm in arms:
        for seed in (0, 1):
            write_run(sweep, "grpo" if arm == "grpo_iter" else arm, seed, iterative=arm == "grpo_iter")
    (sweep / "sweep.json").write_text(json.dumps({"name": "study", "started": 1000.0, "updated": 1900.0}))
    return sweep


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    sweep = make_study_sweep(tmp_path_factory.mktemp("res"))
    out = tmp_path_factory.mktemp("study_out")
    return sweep, out, build_study_report(sweep, out, n_boot=20)


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
    up, flat, down = ({"lo": lo, "hi": hi, "n": 3} for lo, hi in ((1.0, 2.0), (-1.0, 1.0), (-2.0, -1.0)))
    assert maj_pass_verdict(up, flat) == "reproduced"
    assert maj_pass_verdict(up, down) == "reproduced"
    assert maj_pass_verdict(up, up) == "contradicted"       # Pass@K lifted too
    assert maj_pass_verdict(down, flat) == "contradicted"   # Maj@K lowered
    assert maj_pass_verdict(flat, flat) == "inconclusive"


def test_arms_come_from_algorithm_and_reference_resets(built):
    sweep, _, _ = built
    study = load_study(sweep)
    assert list(study.arms) == ["grpo", "grpo_ps", "rft", "ppo", "grpo_iter", "dr_grpo", "rloo"]
    assert all(sorted(rs) == [0, 1] for rs in study.arms.values())
    assert study.task == "arith" and study.ood == "arith_ood" and study.ks == {"arith": 4, "arith_ood": 4}


def test_claims_equal_hand_computed_values(built):
    _, out, _ = built
    c = _claims(out)
    expected = {  # (id, what): (per-seed diffs, verdict)
        ("1", "arith/acc"): ([65 - 60, 75 - 70], "reproduced"),
        ("2", "arith/acc"): ([60 - 55, 70 - 58], "inconclusive"),
        ("3", "maj@4"): ([70 - 45, 80 - 55], "reproduced"),
        ("3", "pass@4"): ([78 - 80, 86 - 85], "reproduced"),
        ("4", "arith/acc"): ([58 - 60, 68 - 70], "contradicted"),
        ("5", "peak rss_mb"): ([300 - 500, 320 - 530], "reproduced"),
        ("6", "arith_ood/acc"): ([25 - 20, 35.2 - 30], "reproduced"),
    }
    assert set(c) == set(expected)
    for key, (diffs, v) in expected.items():
        row = c[key]
        mean, half = _t(diffs)
        assert float(row["mean_diff"]) == pytest.approx(mean, abs=1e-9), key
        assert float(row["ci95_half"]) == pytest.approx(half, abs=1e-6), key
        assert float(row["ci95_lo"]) == pytest.approx(mean - half, abs=1e-6), key
        assert int(row["n_pairs"]) == 2 and row["seeds"] == "0 1"
        assert row["verdict"] == v, key


def test_missing_algorithms_are_not_run_and_inconclusive(tmp_path):
    sweep = make_study_sweep(tmp_path, arms=("grpo", "rft"))
    build_study_report(sweep, tmp_path / "out", n_boot=5)
    c = _claims(tmp_path / "out")
    for cid in ("1", "4", "5"):
        (row,) = [r for k, r in c.items() if k[0] == cid]
        assert row["what"].startswith("not run") and row["verdict"] == "inconclusive" and row["n_pairs"] == "0"
    assert c[("2", "arith/acc")]["verdict"] == "inconclusive"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "not run (grpo_ps)" in md and "not run (grpo_iter)" in md and "not run (ppo)" in md


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
    assert f"`harness report {sweep} --study" in md
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
    assert {(r["algorithm"], r["axis"]) for r in rows} == {(a, x) for a in FINAL for x in ("samples", "seconds")}
    g = next(r for r in rows if r["algorithm"] == "grpo" and r["axis"] == "samples")
    assert float(g["r0"]) == pytest.approx(0.45) and 0.45 <= float(g["a"]) <= 1.0
    assert float(g["extrap_observed"]) == pytest.approx(0.65)


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
