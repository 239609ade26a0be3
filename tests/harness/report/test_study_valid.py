"""The study report's valid-step metrics and guessing floor, on hand-made records: claim 3 over
valid-step solutions (valid_maj@n, valid_pass@n from the records' samples and num_valid: per seed
and per problem by hand), the plain fallback with its note, claim 6's second part on the OOD
valid_acc (and the Holm family that counts it), Table 5's valid columns, the guessing floor of a
set (the share of problems whose gold answer key is the most frequent one) and acc − valid_acc."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from _fake_results import eval_records, make_study_run, sample_records
from harness.report.decisions import Design
from harness.report.problems import gold_keys, guessing_floor, problem_values
from harness.report.study import build_study_report, guessing_floors, large_k_check, load_study
from harness.rundir.export import export_runs

T, F = True, False
# one problem: (correct, valid) per sample, n = 2 (every sample of a problem has the gold's key, or "x")
TYPES = {"V": [(T, T), (T, T)], "C": [(T, F), (T, F)], "W": [(F, F), (F, F)],
         "M": [(T, T), (T, F)], "R": [(T, F), (T, T)]}
# per type, by hand: a correct but invalid sample votes for ("invalid", key): M's two samples tie 1-1 and the
# tie goes to the first sample in order (valid: maj@2 = 1), R's to its first (invalid: maj@2 = 0)
HAND = {  # acc, valid_acc, pass@1, pass@2, maj@1, maj@2, valid_pass@1, valid_pass@2, valid_maj@1, valid_maj@2
    "V": (1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
    "C": (1, 0, 1, 1, 1, 1, 0, 0, 0, 0),
    "W": (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    "M": (1, 1, 1, 1, 1, 1, 0.5, 1, 0.5, 1),
    "R": (1, 0, 1, 1, 1, 1, 0.5, 1, 0.5, 0),
}
NAMES = ("acc", "valid_acc", "pass@1", "pass@2", "maj@1", "maj@2", "valid_pass@1", "valid_pass@2", "valid_maj@1",
         "valid_maj@2")
ARITH = {0: ("VCWW", "VVRC"), 1: ("VMCW", "VVMW")}          # seed: (start, final) problem types
GOLDS = ["7", "7", "8", "7.0"]                              # answer keys 7, 7, 8, 7: floor 3/4
OOD = {0: (0.20, 0.10, 0.30, 0.16), 1: (0.30, 0.20, 0.32, 0.22)}   # seed: start acc, valid, final acc, valid
DESIGN2 = Design(first_look=2, cap=2, n_boot=500)


def _means(types: str) -> dict:
    return {f"eval/arith/{n}": sum(HAND[t][i] for t in types) / len(types) for i, n in enumerate(NAMES)}


def make_valid_sweep(root: Path, valid: bool = True) -> Path:
    sweep = root / "study"
    for seed in (0, 1):
        s0, s1, f0, f1 = OOD[seed]
        start = {"acc": 0.5, "ood": s0, "pass": [0.5, 0.6], "maj": [0.5, 0.5]}
        fin = {"acc": 0.7, "ood": f0, "pass": [0.7, 0.8], "maj": [0.7, 0.7]}
        if valid:
            start["ood_valid"], fin["ood_valid"] = s1, f1
        d = make_study_run(sweep, "grpo", seed, start=start, final=fin, rss=300.0, spread=0.0)
        summary = json.loads((d / "summary.json").read_text())
        for side, step, types in (("initial_eval", 0, ARITH[seed][0]), ("final_eval", 8, ARITH[seed][1])):
            recs = sample_records("arith", [TYPES[t] for t in types], golds=GOLDS)
            if not valid:
                for r in recs:
                    for item in r["samples"] + [r["greedy"]]:
                        del item["valid"]
                    del r["num_valid"]
            (d / "eval" / f"arith_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
            e = {k: v for k, v in summary[side].items() if not k.startswith("eval/arith/")}
            e.update({k: v for k, v in _means(types).items() if valid or "valid" not in k})
            summary[side] = e
        (d / "summary.json").write_text(json.dumps(summary))
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        for i, side in ((0, "initial_eval"), (-1, "final_eval")):   # the logged rows say the same
            rows[i] = {**{k: v for k, v in rows[i].items() if not k.startswith("eval/")}, **summary[side]}
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return sweep


def _claims(out: Path) -> dict:
    with open(out / "claims.csv") as f:
        return {(r["id"], r["what"]): r for r in csv.DictReader(f)}


def test_problem_values_of_valid_metrics(tmp_path):
    study = load_study(make_valid_sweep(tmp_path))
    r = study.arms["grpo"][0]
    vals, why = problem_values(r, "arith", "valid_maj@2", "final")
    assert why == "" and vals == {"arith-0": 1.0, "arith-1": 1.0, "arith-2": 0.0, "arith-3": 0.0}   # V V R C
    vals, _ = problem_values(r, "arith", "valid_pass@1", "final")
    assert vals == {"arith-0": 1.0, "arith-1": 1.0, "arith-2": 0.5, "arith-3": 0.0}
    vals, _ = problem_values(r, "arith", "valid_acc", "initial")
    assert vals == {"arith-0": 1.0, "arith-1": 0.0, "arith-2": 0.0, "arith-3": 0.0}                # V C W W


def test_claim3_counts_valid_step_solutions(tmp_path):
    sweep = make_valid_sweep(tmp_path)
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2)
    c = _claims(tmp_path / "out")
    # valid_maj@2: s0 final VVRC 0.5 - start VCWW 0.25; s1 final VVMW 0.75 - start VMCW 0.5
    maj, pas = c[("3", "valid_maj@2")], c[("3", "valid_pass@2")]
    assert [float(v) for v in maj["per_seed"].split()] == pytest.approx([25.0, 25.0])
    # valid_pass@2: s0 0.75 - 0.25, s1 0.75 - 0.5 (plain pass@2 would be +50 and 0)
    assert [float(v) for v in pas["per_seed"].split()] == pytest.approx([50.0, 25.0])
    # per problem (x100): s0 [0, 100, 0, 0], s1 [0, 0, 100, 0], crossed; problem means [0, 50, 50, 0]:
    # var (ddof 1) 833.3; residuals s0 [0, 50, -50, 0], s1 [0, -50, 50, 0]: MS_e = 10000 / 3; sigma_b^2 =
    # 833.3 - 3333.3 / 2 < 0 -> 0: the problems' spread is all seed x problem residual, already in s^2 / n (0)
    assert maj["boot_scheme"] == "crossed" and maj["n_problems"] == "4"
    assert float(maj["var_problems"]) == 0.0 and float(maj["se"]) == 0.0
    assert maj["comparison"] == ("grpo after RL − its start: arith/maj@2 and arith/pass@2 (the verdict); beside: "
                                 "arith/valid_maj@2 and arith/valid_pass@2 (points)")
    # the verdict's parts are the paper's plain metrics: maj@2 s0 1.0 - 0.5, s1 0.75 - 0.75
    assert [float(v) for v in c[("3", "maj@2")]["per_seed"].split()] == pytest.approx([50.0, 0.0])
    assert [k for k in c if k[0] == "3"] == [("3", "maj@2"), ("3", "pass@2"), ("3", "valid_maj@2"), ("3", "valid_pass@2")]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "- claim 3: decided on the paper's maj@n / pass@n (all correct answers); beside them, not decisive" in md
    # claim 6 gains a second part on the OOD valid_acc: +6 and +2 points; the family counts it (2 + 2 parts)
    v6 = c[("6", "arith_ood/valid_acc")]
    assert [float(v) for v in v6["per_seed"].split()] == pytest.approx([6.0, 2.0])
    assert c[("6", "arith_ood/acc")]["per_seed"].split() == ["10", "2"]
    assert "m = 6 parts" in md and "claim 6: the claim's verdict is its first part's" in md


def test_large_k_and_table5_use_valid_steps(tmp_path):
    sweep = make_valid_sweep(tmp_path)
    study = load_study(sweep)
    (g,) = large_k_check(study, "arith")
    assert g["metric"] == "valid_pass"
    # means over seeds: start valid_pass@1, @2 = [(0.25+0.5)/2, (0.25+0.5)/2] ... by type: s0 VCWW [.25, .25],
    # s1 VMCW [.375, .5]; final s0 VVRC [.625, .75], s1 VVMW [.625, .75]
    assert g["start_mean"] == pytest.approx([0.3125, 0.375]) and g["arm_mean"] == pytest.approx([0.625, 0.75])
    assert g["diff_at_n"]["mean"] == pytest.approx(37.5)
    out = tmp_path / "out"
    build_study_report(sweep, out, n_boot=5, design=DESIGN2)
    with open(out / "table5.csv") as f:
        (row,) = list(csv.DictReader(f))
    # valid_acc: s0 VCWW .25 -> VVRC .5; s1 VMCW .5 -> VVMW .75; OOD valid .10/.20 -> .16/.22
    assert float(row["id_valid_start_mean"]) == pytest.approx(37.5) and float(row["id_valid_after_mean"]) == 62.5
    assert float(row["ood_valid_start_mean"]) == pytest.approx(15.0)
    assert float(row["ood_valid_after_mean"]) == pytest.approx(19.0) and float(row["ood_valid_gain_mean"]) == 4.0
    md = (out / "report.md").read_text()
    assert "| arith_ood valid start | arith_ood valid after RL |" in md
    assert "valid-step solutions only (valid_pass@K" in md and "valid_pass@2 arm − start" in md


def test_guessing_floor(tmp_path):
    # a tiny set: gold answers 3, 3.0, 5, 6/2, 7 have the answer keys 3, 3, 5, 3, 7: the constant answer 3
    # is right on 3 of 5 problems
    d = make_study_run(tmp_path / "s", "grpo", 0, start={"acc": 0.4, "ood": 0.2, "pass": [0.4], "maj": [0.4]},
                       final={"acc": 0.6, "ood": 0.3, "pass": [0.6], "maj": [0.6]}, rss=1.0, records=False)
    recs = eval_records("arith", [T, F, T, F, F], golds=["3", "3.0", "5", "6/2", "7"])
    (d / "eval" / "arith_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    study = load_study(tmp_path / "s")
    golds = gold_keys(study.arms["grpo"][0], "arith")
    assert golds == {"arith-0": "3", "arith-1": "3", "arith-2": "5", "arith-3": "3", "arith-4": "7"}
    assert guessing_floor(golds) == {"floor": 0.6, "answer": "3", "count": 3, "problems": 5}
    assert guessing_floor({"a": "1", "b": "2"}) == {"floor": 0.5, "answer": "1", "count": 1, "problems": 2}
    assert guessing_floor({}) is None


def test_guessing_floor_and_invalid_share_in_the_report(tmp_path):
    sweep = make_valid_sweep(tmp_path)
    rows = {r["task"]: r for r in guessing_floors(load_study(sweep))}
    assert rows["arith"]["floor"] == {"floor": 0.75, "answer": "7", "count": 3, "problems": 4}
    ood = rows["arith_ood"]
    assert ood["floor"]["floor"] == pytest.approx(1 / 500)          # 500 distinct gold answers
    (g,) = ood["arms"]
    # acc - valid_acc: start (20 - 10, 30 - 20) -> 10; after (30 - 16, 32 - 22) -> 12; after 31.0 - 0.2 = 30.8
    assert g["start_invalid"] == pytest.approx(10.0) and g["after_invalid"] == pytest.approx(12.0)
    assert g["after_acc"] == pytest.approx(31.0) and g["above_floor"] == pytest.approx(30.8)
    (a,) = rows["arith"]["arms"]
    # in-domain acc - valid_acc: start s0 VCWW .5 - .25, s1 VMCW .75 - .5 -> 25; after VVRC 1 - .5, VVMW .75 - .75
    assert a["start_invalid"] == pytest.approx(25.0) and a["after_invalid"] == pytest.approx(25.0)
    md = build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2).read_text()
    assert "**`arith`**: guessing floor 75.0% (3 of 4 problems have the most frequent gold answer, 7)." in md
    assert ("Out-of-domain: GRPO (outcome supervision)'s accuracy after RL, 31.0%, is +30.8 points above the "
            "guessing floor of 0.2% (the start: 25.0%, +24.8 points).") in md


def test_older_runs_fall_back_to_plain_counts_with_a_note(tmp_path):
    sweep = make_valid_sweep(tmp_path, valid=False)
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2)
    c = _claims(tmp_path / "out")
    # plain maj@2: s0 VVRC 1.0 - VCWW 0.5; s1 VVMW 0.75 - VMCW 0.75
    assert [float(v) for v in c[("3", "maj@2")]["per_seed"].split()] == pytest.approx([50.0, 0.0])
    assert ("6", "arith_ood/valid_acc") not in c
    md = (tmp_path / "out" / "report.md").read_text()
    assert ("- claim 3: the runs carry no valid-step maj@n / pass@n (older evaluator): counted over all correct "
            "answers") in md
    assert "all correct answers: the runs carry no valid_pass@K" in md and "m = 3 parts" in md  # 2 + 1 parts
    assert "arith valid start" not in md


def test_the_exported_runs_give_the_same_report_bytes(tmp_path):
    """`harness export` compacts the records (no per-sample items: counts, answer histograms and the
    curves at k = 1, 2, 4, ..., n); the study report from the exported copy is byte for byte the
    report from the runs as they were written, valid-step claim 3 and the guessing floor included."""
    sweep = make_valid_sweep(tmp_path)
    export_runs(sweep, tmp_path / "exported" / "study")
    for d in (tmp_path / "exported" / "study").iterdir():
        if d.is_dir():
            for f in (d / "eval").glob("*.jsonl"):
                assert '"samples"' not in f.read_text() or '"samples":[]' in f.read_text()
    outs = (tmp_path / "o_full", tmp_path / "o_exported")
    build_study_report(sweep, outs[0], n_boot=200, design=DESIGN2)
    build_study_report(tmp_path / "exported" / "study", outs[1], n_boot=200, design=DESIGN2)
    for name in ("report.md", "claims.csv", "table5.csv", "compute_curves.csv"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    assert "valid_maj@2" in (outs[1] / "claims.csv").read_text()
