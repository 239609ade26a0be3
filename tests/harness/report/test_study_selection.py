"""The study report's learning-rate selection: per arm, every candidate (lr, and beta where it
varies) with its per-seed validation accuracies, the mean, the seeds and the winner (ties to the
smaller lr), checked against the study's own runs; where the selection folder is looked for;
the runs' provenance (commits, clean tree, CPU, numerics, versions) and wall time per phase in
the header; byte-identical reports with a selection folder. Values by hand."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from _fake_results import make_study_run
from harness.cli.main import main as harness_main
from harness.report.decisions import Design
from harness.report.study import build_study_report, phase_walls
from harness.report.study_data import find_selection_dir, load_selection, load_study

START = {"acc": 0.40, "ood": 0.20, "pass": [0.40, 0.60], "maj": [0.40, 0.42]}
DESIGN2 = Design(first_look=2, cap=2, n_boot=200)

# (arm algorithm, reward model, lr, kl_coef) -> validation accuracy of seeds 100, 101
SELECTION = {
    ("grpo", None, 2e-4, None): (0.50, 0.60),     # mean 0.55 (tie with 4e-4: the smaller lr wins)
    ("grpo", None, 4e-4, None): (0.60, 0.50),     # mean 0.55
    ("grpo", None, 8e-4, None): (0.40, 0.52),     # mean 0.46
    ("grpo_ps", None, 2e-4, 0.01): (0.60, 0.62),  # 0.61
    ("grpo_ps", None, 2e-4, 0.04): (0.58, 0.60),  # 0.59
    ("grpo_ps", None, 4e-4, 0.01): (0.66, 0.60),  # 0.63
    ("grpo_ps", None, 4e-4, 0.04): (0.64, 0.66),  # 0.65: the winner
    ("grpo_ps", "prm", 1e-4, None): (0.30, 0.34),  # the learned-PRM arm: its own entry (grpo_ps_prm)
}
PROV = {"code": {"commit": "aaaa111", "dirty": False}, "cpu": {"model": "Test CPU 9000"},
        "numerics": {"mode": "portable"},
        "versions": {"torch": "2.13.0", "transformers": "4.50.0", "numpy": "2.1.0", "python": "3.11.2"}}


def make_selection(folder: Path) -> Path:
    for (algo, rm, lr, kl), accs in SELECTION.items():
        for seed, acc in zip((100, 101), accs):
            make_study_run(folder, algo, seed, start=START, final={**START, "acc": 0.5}, rss=300.0, records=False,
                           reward_model={"type": rm} if rm else None, lr=lr, kl_coef=kl, val_acc=acc,
                           arm_key=f"{algo}{rm}{lr}{kl}", provenance=PROV, started=0.0, wall=50.0 + seed - 100)
    # an unfinished selection run is listed as not scored
    bad = make_study_run(folder, "grpo", 100, start=START, final=START, rss=300.0, records=False, lr=1.6e-3,
                         arm_key="bad")
    s = json.loads((bad / "summary.json").read_text())
    s["status"] = "failed"
    (bad / "summary.json").write_text(json.dumps(s))
    return folder


def make_study(sweep: Path, provenance=(PROV, PROV)) -> Path:
    """grpo at the selected lr (2e-4); grpo_ps at lr 4e-4 but beta 0.01 (the winner: 0.04); rft
    with no selection entry. Seed 0 and seed 1 runs carry ``provenance[0]`` / ``[1]``."""
    fin = {"acc": 0.6, "ood": 0.3, "pass": [0.6, 0.7], "maj": [0.6, 0.62]}
    for algo, lr, kl in (("grpo", 2e-4, None), ("grpo_ps", 4e-4, 0.01), ("rft", 2e-4, None)):
        for seed in (0, 1):
            make_study_run(sweep, algo, seed, start=START, final=fin, rss=300.0, records=False, lr=lr, kl_coef=kl,
                           provenance=provenance[seed], started=1000.0, wall=200.0 + 10 * seed)
    (sweep / "sweep.json").write_text(json.dumps({"name": "study"}))
    return sweep


def test_selection_winner_tie_and_beta_grid(tmp_path):
    sel = load_selection(make_selection(tmp_path / "sel"))
    groups = {g["group"]: g for g in sel["groups"]}
    assert list(groups) == ["grpo", "grpo_ps", "grpo_ps_prm"]
    g = groups["grpo"]
    assert g["knobs"] == ["train.lr"] and g["task"] == "arith"
    assert [c["values"] for c in g["candidates"]] == [(2e-4,), (4e-4,), (8e-4,)]
    assert [c["mean"] for c in g["candidates"]] == pytest.approx([0.55, 0.55, 0.46], abs=1e-12)
    assert g["candidates"][1]["per_seed"] == {100: 0.60, 101: 0.50} and g["candidates"][1]["n"] == 2
    assert g["winner"] == (2e-4,) and g["val_acc"] == pytest.approx(0.55)   # the tie goes to the smaller lr
    ps = groups["grpo_ps"]
    assert ps["knobs"] == ["train.lr", "algorithm.kl_coef"]                # beta varies: it is a knob
    assert [c["values"] for c in ps["candidates"]] == [(2e-4, 0.01), (2e-4, 0.04), (4e-4, 0.01), (4e-4, 0.04)]
    assert [c["mean"] for c in ps["candidates"]] == pytest.approx([0.61, 0.59, 0.63, 0.65])
    assert ps["winner"] == (4e-4, 0.04)
    assert groups["grpo_ps_prm"]["winner"] == (1e-4,) and groups["grpo_ps_prm"]["val_acc"] == pytest.approx(0.32)
    assert len(sel["skipped"]) == 1 and sel["skipped"][0].endswith("(failed)")
    assert sel["disjoint"] == 16 and len(sel["runs"]) == 17


def test_selection_folder_lookup_order(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    other, inside, rel = tmp_path / "given", sweep / "selection", tmp_path / "lr_select"
    for d in (other, inside, rel):
        d.mkdir()
    sj = {"report": {"study": True, "selection": "../lr_select"}}
    # 1. the explicit folder, even when the others exist
    assert find_selection_dir(sweep, other, sj) == (other, "given with --selection")
    # 2. <sweep>/selection
    assert find_selection_dir(sweep, None, sj) == (inside, "the sweep folder's selection/")
    # 3. sweep.json report.selection, relative to the sweep folder
    inside.rmdir()
    assert find_selection_dir(sweep, None, sj) == (sweep / "../lr_select", "sweep.json report.selection")
    # 4. none: said why
    assert find_selection_dir(sweep, None, {"report": {"selection": "missing"}}) == \
        (None, "sweep.json's report.selection missing is not a folder")
    assert find_selection_dir(sweep, None, {}) == (None, "no selection folder")
    assert find_selection_dir(sweep, None, {"report": ["not", "a", "dict"]}) == (None, "no selection folder")


def test_report_selection_table_and_arm_check(tmp_path):
    sweep = make_study(tmp_path / "study")
    make_selection(sweep / "selection")
    study = load_study(sweep)                           # the selection subfolder's runs are not study runs
    assert list(study.arms) == ["grpo", "grpo_ps", "rft"] and all(sorted(r) == [0, 1] for r in study.arms.values())
    md = build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2).read_text()
    assert "Selection runs: folder `selection` (the sweep folder's selection/); 17 runs, 16 trained with" in md
    assert "never the test split" in md
    assert "| GRPO (outcome supervision) | lr 0.0002 | s100: 50.0, s101: 60.0 | 55.00 | 2 | **winner** |" in md
    assert "| GRPO (outcome supervision) | lr 0.0004 | s100: 60.0, s101: 50.0 | 55.00 | 2 |  |" in md
    assert "lr 0.0004, beta (kl_coef) 0.04 | s100: 64.0, s101: 66.0 | 65.00 | 2 | **winner** |" in md
    assert "- GRPO (outcome supervision) (grpo): runs at the selection's winner" in md
    assert ("(grpo_ps): mismatch: runs at algorithm.kl_coef 0.01 (the selection's winner: 0.04)" in md)
    assert "(rft): no selection entry (its learning rate was not selected here)" in md
    assert "- not scored (no validation accuracy, or not finished): " in md
    # a winner at the end of the lrs tried is flagged (the failed 1.6e-3 run is no candidate); one lr: no flag
    assert ("- GRPO (outcome supervision): the winner is at the smallest learning rate tried (0.0002): "
            "the optimum may lie below it") in md
    assert "the winner is at the largest learning rate tried (0.0004): the optimum may lie above it" in md
    assert md.count("the optimum may lie") == 2
    assert "--study --selection <folder selection> --output-dir" in md


def test_no_selection_folder_says_so(tmp_path):
    sweep = make_study(tmp_path / "study")
    md = build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2).read_text()
    assert "The learning rates were not selected in this report (no selection folder)." in md
    assert "learning-rate selection: no selection runs in this report" in md


def test_selection_from_sweep_json_and_cli(tmp_path, capsys):
    sweep = make_study(tmp_path / "study")
    make_selection(tmp_path / "lr_select")
    (sweep / "sweep.json").write_text(json.dumps({"name": "study", "report": {"study": True,
                                                                              "selection": "../lr_select"}}))
    md = build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2).read_text()
    assert "Selection runs: folder `lr_select` (sweep.json report.selection); 17 runs" in md
    other = make_selection(tmp_path / "other_sel")
    assert harness_main(["report", str(sweep), "--study", "--selection", str(other),
                         "--output-dir", str(tmp_path / "cli")]) == 0
    md = (tmp_path / "cli" / "report.md").read_text()
    assert "Selection runs: folder `other_sel` (given with --selection)" in md


def test_provenance_and_wall_time_per_phase(tmp_path):
    second = {**PROV, "code": {"commit": "bbbb222", "dirty": True}, "cpu": {"model": "Other CPU"},
              "versions": {**PROV["versions"], "torch": "2.12.0"}}
    sweep = make_study(tmp_path / "study", provenance=(PROV, second))
    make_selection(sweep / "selection")
    study = load_study(sweep)
    study.selection = load_selection(sweep / "selection")
    md = build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2).read_text()
    assert "- **Runs' provenance** (6 of 6 runs record it):" in md
    assert "  - commit: 2 commits: aaaa111 (clean tree): 3 runs; bbbb222 (dirty tree): 3 runs" in md
    assert "  - CPU: Other CPU (3 runs); Test CPU 9000 (3 runs)" in md
    assert "  - numerics: portable (6 runs)" in md
    assert ("  - versions: torch 2.12.0 (3 runs); 2.13.0 (3 runs); transformers 4.50.0 (6 runs); numpy 2.1.0 "
            "(6 runs); scipy not recorded (6 runs); python 3.11.2 (6 runs)") in md
    assert "- **Selection runs' provenance** (16 of 17 runs record it; the others predate it):" in md
    assert "  - commit: aaaa111 (clean tree)" in md
    # wall: study runs 200 s (seed 0) + 210 s (seed 1) per arm; selection runs 50 s (seed 100) + 51 s
    # (seed 101) per candidate: grpo 3 candidates = 303 s (+ the failed run's, not counted), grpo_ps 4 = 404 s,
    # grpo_ps_prm 1 = 101 s
    w = phase_walls(study)
    assert w["study"] == (1230.0, {"grpo": 410.0, "grpo_ps": 410.0, "rft": 410.0}, 6)
    assert w["selection"] == (808.0, {"grpo": 303.0, "grpo_ps": 404.0, "grpo_ps_prm": 101.0}, 16)
    assert ("learning-rate selection: 808 s over 16 runs (GRPO (outcome supervision) 303 s, GRPO (process "
            "supervision) 404 s, GRPO (process supervision) + learned PRM 101 s); study: 1230 s over 6 runs") in md


def test_report_with_selection_is_byte_identical_on_recompute(tmp_path):
    sweep = make_study(tmp_path / "a" / "study")
    make_selection(sweep / "selection")
    copy = tmp_path / "b" / "deeper" / "study"
    shutil.copytree(sweep, copy)
    outs = [tmp_path / "o1", tmp_path / "o2" / "x", tmp_path / "o3"]
    for src, out in zip((sweep, sweep, copy), outs):
        build_study_report(src, out, n_boot=10, design=DESIGN2)
    for name in ("report.md", "claims.csv", "table5.csv"):
        first = (outs[0] / name).read_bytes()
        assert all((o / name).read_bytes() == first for o in outs[1:]), name
    assert b"Learning-rate selection" in (outs[0] / "report.md").read_bytes()


def test_a_setting_outside_the_usual_knobs_makes_its_own_candidate(tmp_path):
    """Selection runs of one arm that differ in a setting other than lr and beta (here the clip range) are two
    candidates, not one pooled mean: the study and the plain report share `aggregate.validation_selection`."""
    sel_dir = tmp_path / "sel"
    for clip, accs in ((0.2, (0.50, 0.52)), (0.3, (0.70, 0.72))):
        for seed, acc in zip((100, 101), accs):
            make_study_run(sel_dir, "grpo", seed, start=START, final={**START, "acc": 0.5}, rss=300.0, records=False,
                           lr=2e-4, val_acc=acc, arm_key=f"clip{clip}", config={"algorithm": {"clip_eps": clip}})
    (g,) = load_selection(sel_dir)["groups"]
    assert g["knobs"] == ["train.lr", "algorithm.clip_eps"]
    assert [c["values"] for c in g["candidates"]] == [(2e-4, 0.2), (2e-4, 0.3)]
    assert [c["mean"] for c in g["candidates"]] == pytest.approx([0.51, 0.71])
    assert g["winner"] == (2e-4, 0.3) and g["val_acc"] == pytest.approx(0.71)


def test_a_selection_folder_of_several_selection_sweeps_merges_their_arms(tmp_path, capsys):
    """A study whose arms' rates came from several selections (v3: v2's lr_select, objectives_lr, iter_lr_v3):
    one folder holding each selection sweep's folder; each sweep selects its own arms, and an arm two of them
    select is an error naming both."""
    sweep = make_study(tmp_path / "study")
    sel = sweep / "selection"
    make_selection(sel / "lr_select")
    for lr, accs in ((2e-4, (0.70, 0.72)), (4e-4, (0.66, 0.64))):   # rft: selected only by the second sweep
        for seed, acc in zip((100, 101), accs):
            make_study_run(sel / "rft_lr", "rft", seed, start=START, final=START, rss=300.0, records=False, lr=lr,
                           val_acc=acc, arm_key=f"rft{lr}", provenance=PROV, started=0.0, wall=50.0)
    md = build_study_report(sweep, tmp_path / "out", n_boot=5, design=DESIGN2).read_text()
    assert ("Selection runs: folder `selection` (the sweep folder's selection/), holding 2 selection sweeps, each "
            "selecting its own arms (`lr_select`: 17 runs, `rft_lr`: 4 runs); 21 runs, 20 trained with") in md
    assert "| online RFT | lr 0.0002 | s100: 70.0, s101: 72.0 | 71.00 | 2 | **winner** |" in md
    assert "- online RFT (rft): runs at the selection's winner" in md           # was "no selection entry"
    assert "| GRPO (outcome supervision) | lr 0.0002 | s100: 50.0, s101: 60.0 | 55.00 | 2 | **winner** |" in md
    assert "lr_select/grpo-s100-" in md                                          # a not-scored run names its sweep
    # rft selected twice: an error that names both sweeps, before anything is written
    make_study_run(sel / "rft_again", "rft", 100, start=START, final=START, rss=300.0, records=False, lr=2e-4,
                   val_acc=0.5, arm_key="rft2")
    assert harness_main(["report", str(sweep), "--study", "--output-dir", str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err
    assert "selects online RFT (rft) in both rft_again/ and rft_lr/: keep one of them" in err
    assert not (tmp_path / "out2" / "report.md").exists()
