"""Study v3's claims (docs/study.md, "Study v3"): the arms of off-policy and LoRA runs, claims 9-14 on the
arithmetic family and 15-18 on the SmolLM2 family, and the rule of a claim that predicts no difference
(reproduced when equivalent). Per-seed differences against the hand-made runs' values."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from _fake_results import make_study_run
from harness.report.decisions import Design, PartData, analyse_part, claim_verdict, decide
from harness.report.study import DESIGN, build_study_report, design_of, load_study
from harness.report.study_data import arm_for, arm_name, off_setting
from harness.rundir.read import load_run

DESIGN2 = Design(first_look=2, cap=2, n_boot=200)
START = {0: {"acc": 0.40, "ood": 0.20, "pass": [0.40, 0.60], "maj": [0.40, 0.42]},
         1: {"acc": 0.50, "ood": 0.30, "pass": [0.50, 0.68], "maj": [0.50, 0.52]}}


def _run(root: Path, algo: str, seed: int, acc: float, arm: str, rss: float = 300.0, config: dict | None = None):
    fin = {"acc": acc, "ood": 0.25, "pass": [acc, min(1.0, acc + 0.1)], "maj": [acc, acc + 0.01]}
    return make_study_run(root, algo, seed, start=START[seed], final=fin, rss=rss, arm_key=arm, config=config)


def _claims(out: Path) -> dict:
    with open(out / "claims.csv") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def _per_seed(row: dict) -> list:
    return [float(v) for v in row["per_seed"].split()]


def test_arms_of_off_policy_and_lora_runs():
    assert arm_for("grpo", {"train": {"staleness": 8}, "algorithm": {"correction": "token_tis"}}) == "grpo_k8_token_tis"
    assert arm_for("grpo", {"train": {"staleness": 1}, "algorithm": {"correction": "none"}}) == "grpo_k1"
    assert arm_for("grpo", {"train": {"staleness": 0}}) == "grpo"
    assert arm_for("dr_grpo", {"model": {"lora": {"rank": 16}}}) == "dr_grpo_lora"
    assert arm_for("dr_grpo", {"model": {"lora": {"rank": 0}}}) == "dr_grpo"
    assert arm_for("grpo_ps", {"reward_model": {"type": "prm", "rounds": 4}}) == "grpo_ps_prm_r4"
    assert arm_name("grpo_k8_token_tis") == "GRPO (outcome supervision), staleness 8, token-level TIS"
    assert arm_name("grpo_k2_seq_mask") == "GRPO (outcome supervision), staleness 2, sequence-level mask"
    assert arm_name("ppo_lora") == "PPO, LoRA"
    assert arm_name("grpo_ps_prm_r4") == "GRPO (process supervision) + learned PRM, 4 rounds"


# final accuracy per arm and seed (the runs' summaries; records consistent with them)
ARITH = {"grpo": ((0.60, 0.70), {}), "dapo": ((0.63, 0.74), {}),
         "grpo_k1": ((0.61, 0.69), {"train": {"staleness": 1}}),
         "grpo_k8": ((0.55, 0.66), {"train": {"staleness": 8}}),
         "grpo_k8_token_tis": ((0.58, 0.67), {"train": {"staleness": 8}, "algorithm": {"correction": "token_tis"}})}


def test_arithmetic_v3_claims_join_when_their_arms_ran(tmp_path):
    sweep = tmp_path / "v3"
    for arm, (accs, cfg) in ARITH.items():
        algo = arm.split("_k")[0]
        for seed, acc in enumerate(accs):
            _run(sweep, algo, seed, acc, arm, config=cfg)
    (sweep / "sweep.json").write_text(json.dumps({"name": "v3"}))
    assert set(load_study(sweep).arms) == set(ARITH)
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2)
    c = _claims(tmp_path / "out")
    assert "10" not in c and "11" not in c            # GSPO and CISPO did not run: not listed (as claims 7, 8)
    assert c["1"]["verdict"] == "not run"             # claims 1-6 stay listed: the arithmetic family
    assert _per_seed(c["9"]) == pytest.approx([3.0, 4.0])            # dapo - grpo
    assert _per_seed(c["12"]) == pytest.approx([1.0, -1.0])          # k = 1 - on-policy
    assert _per_seed(c["13"]) == pytest.approx([-5.0, -4.0])         # k = 8 - on-policy
    assert _per_seed(c["14"]) == pytest.approx([3.0, 1.0])           # k = 8 TIS - k = 8 none
    assert c["12"]["expected"] == "within ±SESOI" and c["13"]["expected"] == "< 0" and c["9"]["expected"] == "> 0"
    assert c["12"]["comparison"] == "grpo_k1 − grpo: final arith/acc (points; expected within ±SESOI)"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "claim 12: the claim predicts no difference: reproduced when the TOST" in md


LORA = {"dr_grpo_lora": ((0.30, 0.34), 2000.0, 2010.0), "rft_lora": ((0.26, 0.31), 1990.0, 2000.0),
        "ppo_lora": ((0.29, 0.33), 2100.0, 2140.0), "dr_grpo": ((0.31, 0.33), 2900.0, 2950.0)}


def test_smollm2_family_lists_claims_15_to_18_only(tmp_path):
    sweep = tmp_path / "lora"
    for arm, (accs, *rss) in LORA.items():
        algo = arm.removesuffix("_lora")
        cfg = {"model": {"lora": {"rank": 16 if arm.endswith("_lora") else 0}}}
        for seed, acc in enumerate(accs):
            _run(sweep, algo, seed, acc, arm, rss=rss[seed], config=cfg)
    (sweep / "sweep.json").write_text(json.dumps({"name": "lora"}))
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2)
    c = _claims(tmp_path / "out")
    assert sorted(c, key=int) == ["15", "16", "17", "18"]
    assert _per_seed(c["15"]) == pytest.approx([4.0, 3.0])           # dr_grpo_lora - rft_lora
    assert _per_seed(c["16"]) == pytest.approx([1.0, 1.0])           # dr_grpo_lora - ppo_lora
    assert _per_seed(c["17"]) == pytest.approx([-1.0, 1.0])          # LoRA - full
    assert _per_seed(c["18"]) == pytest.approx([-100.0, -130.0])     # peak RSS, MiB
    assert c["18"]["unit"] == "MiB" and float(c["18"]["sesoi"]) == 32.0
    assert c["16"]["expected"] == c["17"]["expected"] == "within ±SESOI"
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.splitlines()[0] == "# Real-model study (SmolLM2 family, claims 15-18): lora"
    assert "family** of claims 15, 16, 17, 18: m = 4 parts" in md
    assert "committed to docs/study.md before the runs that judge them: claims 15, 16, 17, 18 at 8e7189c" in md


def _equivalence_verdict(values: list) -> tuple:
    n = len(values)
    part = PartData("acc", "points", 0, 2.0, list(range(n)), values, key="12/0")
    design = Design(first_look=n, cap=n, n_boot=50)
    (r,) = decide([(part, analyse_part(part, design))], design)
    return r["verdict"], claim_verdict("equivalence", [r["verdict"]])


def test_a_claim_predicting_no_difference_is_reproduced_when_equivalent():
    # 10 seeds within 0.3 of 0: TOST rejects (SE about 0.1 against a margin of 2), the difference test does not
    assert _equivalence_verdict([0.1, -0.2, 0.3, 0.0, -0.1, 0.2, -0.3, 0.1, 0.0, -0.1]) == ("equivalent", "reproduced")
    # a clear difference either way contradicts it
    assert _equivalence_verdict([5.1, 4.8, 5.3, 4.9, 5.0, 5.2]) == ("contradicted", "contradicted")
    assert _equivalence_verdict([-5.1, -4.8, -5.3, -4.9, -5.0, -5.2]) == ("contradicted", "contradicted")
    # three noisy seeds decide neither
    assert _equivalence_verdict([1.5, -2.0, 3.0]) == ("underpowered", "underpowered")


def test_the_sweep_files_cap_lets_arms_be_looked_at_past_ten_seeds(tmp_path):
    """sweep.json's report.cap (the sweep file's) sets the design's cap: 12 seeds of GRPO and online RFT are all
    used to decide claim 2 under cap 12; under the default (10) seeds 10 and 11 are shown, not used."""
    assert design_of({}) is DESIGN and DESIGN.cap == 10
    assert design_of({"report": {"cap": 20}}).cap == 20 and design_of({"report": {"cap": 20}}).first_look == 3
    assert design_of({"report": {"cap": True}}) is DESIGN and design_of({"report": {"cap": 2}}) is DESIGN
    sweep = tmp_path / "s"
    for seed in range(12):
        start = {"acc": 0.40, "ood": 0.20, "pass": [0.40, 0.60], "maj": [0.40, 0.42]}
        for algo, acc in (("grpo", 0.60 + 0.002 * seed), ("rft", 0.62)):
            fin = {"acc": acc, "ood": 0.25, "pass": [acc, acc + 0.1], "maj": [acc, acc + 0.01]}
            make_study_run(sweep, algo, seed, start=start, final=fin, rss=300.0)
    for cap, used in ((None, 10), (12, 12)):
        (sweep / "sweep.json").write_text(json.dumps({"name": "s", "report": {"study": True, "cap": cap}}))
        build_study_report(sweep, tmp_path / f"out{cap}", n_boot=5)
        row = _claims(tmp_path / f"out{cap}")["2"]
        assert row["n_pairs"] == "12"
        beyond = "seeds beyond the cap (10 11) are shown, not used to decide"
        assert (beyond in row["note"]) == (used == 10)
        assert row["holm_p_diff"] != ""


LR2, LR4 = {"train": {"lr": 2e-4}}, {"train": {"lr": 4e-4}}


def test_a_run_whose_settings_differ_from_its_arms_is_excluded_and_named(tmp_path, capsys):
    sweep = tmp_path / "mixed"
    _run(sweep, "grpo", 0, 0.60, "g0", config=LR2)
    _run(sweep, "grpo", 1, 0.70, "g1", config=LR2)
    odd = _run(sweep, "grpo", 1, 0.90, "g1-odd", config=LR4)    # another lr: pooled before, or kept by folder order
    for seed, acc in enumerate((0.55, 0.62)):
        _run(sweep, "rft", seed, acc, "r", config=LR2)
    (sweep / "sweep.json").write_text(json.dumps({"name": "mixed"}))
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2)
    c = _claims(tmp_path / "out")
    assert sorted(abs(v) for v in _per_seed(c["2"])) == pytest.approx([5.0, 8.0])   # the 2e-4 runs only
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"{odd.name}: train.lr=0.0004 (the arm's: 0.0002)" in md
    assert f"run {odd.name}: train.lr=0.0004 (the arm's: 0.0002): excluded from the study" in capsys.readouterr().err



def test_a_tie_between_an_arms_settings_keeps_the_smallest_seeds(tmp_path):
    runs = [load_run(_run(tmp_path, "grpo", seed, 0.6, f"g{seed}", config=c)) for seed, c in ((1, LR4), (0, LR2))]
    assert off_setting(runs) == {runs[0].run_id: "train.lr=0.0004 (the arm's: 0.0002)"}
    assert off_setting(runs[:1]) == {}


def test_a_seed_left_out_of_a_part_for_a_missing_value_is_named(tmp_path):
    sweep, lora = tmp_path / "lora", {"model": {"lora": {"rank": 16}}}
    for seed, acc in enumerate((0.5, 0.6)):
        _run(sweep, "dr_grpo", seed, acc, "d", rss=200.0, config=lora)
        ppo = _run(sweep, "ppo", seed, acc - 0.01, "p", rss=300.0, config=lora)
    s = json.loads((ppo / "summary.json").read_text())
    s["peak"] = {}                                      # seed 1's PPO run recorded no peak memory
    (ppo / "summary.json").write_text(json.dumps(s))
    (sweep / "sweep.json").write_text(json.dumps({"name": "lora"}))
    build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2)
    c = _claims(tmp_path / "out")
    assert _per_seed(c["18"]) == pytest.approx([-100.0]) and _per_seed(c["16"]) == pytest.approx([1.0, 1.0])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "left out for a value missing in a run: seed 1 (dr_grpo-s1-" in md and f"/ {ppo.name})" in md
