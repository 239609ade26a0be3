"""The learned-PRM gate and retired claims (docs/study.md, "Study v3"): claims 4 and 8 are tested with the
learned-PRM arms only when that arm's selected setting gained at least 3 validation points over its start
(`report.prm_selection`); otherwise claim 8 is listed as retired with the gate's figure as the reason and claim 4
falls back to reference resets. `report.retired` lists hand-named claims as retired with their reason. The
selection figures are set by hand; the gains below follow from them."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from _fake_results import make_study_run
from harness.report.decisions import Design
from harness.report.study import build_study_report, load_study
from harness.report.study_data import PRM_GATE_POINTS, prm_gate
from harness.sweep.spec import SweepError, report_options

DESIGN2 = Design(first_look=2, cap=2, n_boot=50)
START = {"acc": 0.40, "ood": 0.20, "pass": [0.40, 0.60], "maj": [0.40, 0.42]}


def _selection(folder: Path, runs: dict) -> Path:
    """PRM selection runs: ``{(lr, kl): (val_acc, start_val_acc)}`` on seed 100, plus one GRPO run (not the gate's
    arm: it must not be read as the PRM arm's winner)."""
    for (lr, kl), (val, start) in runs.items():
        make_study_run(folder, "grpo_ps", 100, start=START, final=START, rss=300.0, records=False,
                       reward_model={"type": "prm"}, lr=lr, kl_coef=kl, val_acc=val, start_val_acc=start,
                       arm_key=f"prm{lr}{kl}")
    make_study_run(folder, "grpo", 100, start=START, final=START, rss=300.0, records=False, lr=2e-4,
                   val_acc=0.90, start_val_acc=0.40, arm_key="grpo")
    return folder


def _study(sweep: Path, report: dict, prm_arms: bool = False) -> Path:
    """GRPO, GRPO+PS and GRPO with reference resets on seeds 0-1 (and, with ``prm_arms``, the two learned-PRM
    arms); sweep.json's report section as given."""
    arms = [("grpo", None, False, (0.60, 0.62)), ("grpo_ps", None, False, (0.63, 0.64)),
            ("grpo", None, True, (0.64, 0.67))]
    if prm_arms:
        arms += [("grpo_ps", {"type": "prm"}, False, (0.50, 0.52)),
                 ("grpo_ps", {"type": "prm", "rounds": 4}, False, (0.49, 0.55))]
    for algo, rm, it, accs in arms:
        for seed, acc in enumerate(accs):
            make_study_run(sweep, algo, seed, start=START, final={**START, "acc": acc}, rss=300.0, iterative=it,
                           reward_model=rm)
    (sweep / "sweep.json").write_text(json.dumps({"name": "v3", "report": {"study": True, **report}}))
    return sweep


def _report(sweep: Path, out: Path) -> tuple:
    build_study_report(sweep, out, n_boot=5, design=DESIGN2)
    with open(out / "claims.csv") as f:
        rows = {}
        for r in csv.DictReader(f):
            rows.setdefault(r["id"], r)
    return rows, (out / "report.md").read_text()


def test_a_prm_arm_that_did_not_train_retires_claim_8_with_its_figure(tmp_path):
    sel = _selection(tmp_path / "prm_sel", {(2.5e-5, 0.4): (0.522, 0.524), (1e-4, 0.04): (0.103, 0.524)})
    sweep = _study(tmp_path / "v3", {"prm_selection": str(sel)}, prm_arms=True)
    gate = load_study(sweep).prm_gate
    assert gate["passes"] is False and gate["gain"] == pytest.approx(-0.2)
    assert gate["val_acc"] == pytest.approx(0.522) and gate["start_val_acc"] == pytest.approx(0.524)
    assert "train.lr 2.5e-05" in gate["winner"] and "algorithm.kl_coef 0.4" in gate["winner"]
    c, md = _report(sweep, tmp_path / "out")
    assert c["8"]["verdict"] == "retired" and c["8"]["n_pairs"] == "0"
    assert c["8"]["what"].startswith("retired: the learned-PRM arm's selected setting")
    assert "52.2% on the validation split against its start's 52.4%, a gain of -0.2 points" in c["8"]["what"]
    # claim 4 falls back to reference resets although both PRM arms ran: the gate, not the arms, decides
    assert c["4"]["comparison"].startswith("grpo_iter − grpo")
    assert [float(v) for v in c["4"]["per_seed"].split()] == pytest.approx([4.0, 5.0])
    assert "claim 4: its learned-PRM version (4 rounds of iterative RL" in md and "is retired: the learned-PRM" in md
    assert "| 8 | GRPO+PS: the exact step checker beats a learned PRM |" in md
    assert "| retired: the learned-PRM arm's selected setting" in md
    # retired claims are outside the Holm family
    assert "family** of claims 1, 3, 4, 6: m = 5 parts" in md


def test_a_prm_arm_that_trains_lets_claims_4_and_8_be_tested(tmp_path):
    # gain exactly the threshold passes (3.0 points); the runs' values make the sums exact in binary
    sel = _selection(tmp_path / "prm_sel", {(2.5e-5, 0.4): (0.53125, 0.5), (1e-4, 0.04): (0.25, 0.5)})
    sweep = _study(tmp_path / "v3", {"prm_selection": str(sel)}, prm_arms=True)
    gate = load_study(sweep).prm_gate
    assert gate["gain"] == pytest.approx(3.125) and gate["passes"] is True
    c, md = _report(sweep, tmp_path / "out")
    assert c["8"]["verdict"] != "retired"
    assert [float(v) for v in c["8"]["per_seed"].split()] == pytest.approx([13.0, 12.0])   # grpo_ps - grpo_ps_prm
    assert c["4"]["comparison"].startswith("grpo_ps_prm_r4 − grpo_ps_prm")
    assert [float(v) for v in c["4"]["per_seed"].split()] == pytest.approx([-1.0, 3.0])
    assert "its learned-PRM version" not in md


@pytest.mark.parametrize("val,start,passes", [(0.53, 0.50, True), (0.529, 0.50, False), (0.60, 0.58, False)])
def test_the_gate_is_three_points_over_the_start(tmp_path, val, start, passes):
    sel = _selection(tmp_path / "prm_sel", {(2.5e-5, 0.4): (val, start)})
    sweep = _study(tmp_path / "v3", {"prm_selection": str(sel)})
    gate = prm_gate(sweep, json.loads((sweep / "sweep.json").read_text()))
    assert PRM_GATE_POINTS == 3.0
    assert gate["gain"] == pytest.approx(100 * (val - start)) and gate["passes"] is passes


def test_a_gate_that_cannot_be_read_retires_claim_8_and_says_why(tmp_path):
    sweep = _study(tmp_path / "v3", {"prm_selection": str(tmp_path / "nowhere")})
    c, md = _report(sweep, tmp_path / "out")
    assert c["8"]["verdict"] == "retired"
    assert "could not be read: sweep.json's report.prm_selection" in c["8"]["what"]
    assert "is not a folder here" in c["8"]["what"]
    # the folder convention beside the runs wins over sweep.json (a committed sweep.json names another machine's path)
    _selection(sweep / "prm_selection", {(2.5e-5, 0.4): (0.60, 0.50)})
    assert load_study(sweep).prm_gate["passes"] is True
    assert set(load_study(sweep).arms) == {"grpo", "grpo_ps", "grpo_iter"}    # its runs are not study arms
    # a selection without the PRM arm does not pass
    other = tmp_path / "no_prm"
    make_study_run(other, "grpo", 100, start=START, final=START, rss=300.0, records=False, lr=2e-4, val_acc=0.9,
                   start_val_acc=0.4, arm_key="g")
    g = prm_gate(tmp_path / "v4", {"report": {"prm_selection": str(other)}})
    assert g["passes"] is False and "has no finished" in g["text"]


def test_without_a_gate_claim_8_needs_its_arms_as_before(tmp_path):
    sweep = _study(tmp_path / "v2", {})
    assert load_study(sweep).prm_gate is None
    c, md = _report(sweep, tmp_path / "out")
    assert "8" not in c and "7" not in c
    assert c["4"]["comparison"].startswith("grpo_iter − grpo")


def test_report_retired_lists_named_claims_with_their_reason(tmp_path):
    sweep = _study(tmp_path / "v3", {"retired": {"5": "memory on a 0.87M model is the interpreter's",
                                                 "7": "PRIME's reward model was never selected", "19": "no such"}})
    c, md = _report(sweep, tmp_path / "out")
    assert c["7"]["verdict"] == "retired" and c["7"]["what"] == "retired: PRIME's reward model was never selected"
    assert c["5"]["verdict"] == "retired"            # listed before too (as not run: no PPO); now with its reason
    assert c["2"]["verdict"] == "not run"            # no online RFT: still "not run", not retired
    assert "report.retired names claim 19, not a claim of this study's family: ignored." in md
    assert "family** of claims 1, 3, 4, 6: m = 5 parts" in md


def test_report_section_checks_prm_selection_and_retired(tmp_path):
    opts = report_options({"study": True, "prm_selection": "../sel", "retired": {7: " why  not "}}, "s.yaml",
                          tmp_path / "sweeps")
    assert opts.prm_selection == (tmp_path / "sel").resolve() and opts.retired == {"7": "why not"}
    for bad, said in [({"study": True, "retired": {"x": "why"}}, "expected a claim id"),
                      ({"study": True, "retired": {0: "why"}}, "expected a claim id"),
                      ({"study": True, "retired": {True: "why"}}, "expected a claim id"),
                      ({"study": True, "retired": {7: ""}}, "saying why claim 7"),
                      ({"study": True, "retired": ["7"]}, "must be a mapping"),
                      ({"study": True, "retired": {7: "a", "7": "b"}}, "names claim 7 twice"),
                      ({"retired": {7: "why"}}, "report.study is not true"),
                      ({"prm_selection": "x"}, "report.study is not true"),
                      ({"study": True, "prm_selection": 3}, "report.prm_selection=3 is invalid")]:
        with pytest.raises(SweepError, match=said):
            report_options(bad, "s.yaml", tmp_path)
