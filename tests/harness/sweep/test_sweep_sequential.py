"""``report.sequential`` (harness.sweep.sequential): the study sweep runs seed by seed and, from the
design's first look (3 seeds), only the runs whose arm an open claim needs; the others are recorded
'not needed', and the sweep counts as complete without them (the study report is written)."""
from __future__ import annotations

import json

import pytest

from harness.cli.main import main
from harness.sweep import sequential
from harness.sweep.plan import load_sweep
import harness.sweep.run as run_module
from harness.sweep.run import _looks as sequential_looks, unfinished_runs
from harness.sweep.spec import SweepError
from sweep_testing import calls, run_inproc, sweep_file
from _fake_results import make_study_run

GRID = "name: sq\ngrid:\n  algorithm: [grpo, rft]\n  seed: [0, 1, 2, 3, 4]\nbudget: {unit: samples, amount: 16, eval_points: 1}\n"


def test_sequential_needs_the_study_report_and_a_boolean(tmp_path):
    p = sweep_file(tmp_path, GRID + "report: {sequential: true}\n")
    with pytest.raises(SweepError, match="report.sequential is true but report.study is not"):
        load_sweep(p, output_dir=str(tmp_path / "out"))
    p = sweep_file(tmp_path, GRID + "report: {study: true, sequential: 'yes'}\n")
    with pytest.raises(SweepError, match="report.sequential='yes' is invalid: expected true or false"):
        load_sweep(p, output_dir=str(tmp_path / "out"))
    p = sweep_file(tmp_path, GRID + "report: {study: true, sequential: true}\n")
    assert load_sweep(p, output_dir=str(tmp_path / "out")).report_sequential is True


def test_seed_by_seed_and_only_the_needed_arms_after_the_first_look(tmp_path, monkeypatch):
    asked = []

    def fake_not_needed(sw, batch):
        asked.append(sorted({r.config.seed for r in batch}))
        done = {json.loads((r.run_dir / "summary.json").read_text())["seed"] for r in sw.runs
                if (r.run_dir / "summary.json").exists()}
        assert set(range(batch[0].config.seed)) <= done         # every earlier seed finished first
        return {r.run_id: "sequential design: test" for r in batch if r.config.algo.name == "rft"}

    monkeypatch.setattr(sequential, "decide",
                        lambda sw, batch: (fake_not_needed(sw, batch), ["claim 2 (GRPO > online RFT): equivalent"]))
    setups = []

    def fake_setup(sw, todo, opts, stream, ahead=()):
        setups.append((sorted({r.config.seed for r in todo}), sorted({r.config.seed for r in ahead})))
        return False
    monkeypatch.setattr(run_module, "_run_setup", fake_setup)
    p = sweep_file(tmp_path, GRID + "report: {study: true, sequential: true}\n")
    out = tmp_path / "out"
    rc, text = run_inproc(p, out)
    assert rc == 0, text
    assert asked == [[3], [4]]                                    # decided before the 4th and 5th seed only
    # the seeds before the first look in one batch; each batch's setup builds the next seed's alongside
    assert setups == [([0, 1, 2], [3]), ([3], [4]), ([4], [])]
    sw = load_sweep(p, output_dir=str(out))
    ran = calls(out)
    assert sorted(ran) == sorted(r.run_id for r in sw.runs if not (r.config.algo.name == "rft" and r.config.seed >= 3))
    seeds_in_order = [next(r.config.seed for r in sw.runs if r.run_id == rid) for rid in ran]
    assert seeds_in_order == sorted(seeds_in_order)               # seed by seed
    assert "seed 3: 1 run(s) not needed" in text and "seed 4: claim 2 (GRPO > online RFT): equivalent" in text
    states = {r["run_id"]: r["state"] for r in json.loads((sw.sweep_dir / "sweep.json").read_text())["runs"]}
    assert {rid for rid, st in states.items() if st == "not needed"} == \
        {r.run_id for r in sw.runs if r.config.algo.name == "rft" and r.config.seed >= 3}
    # the sweep is complete without them; a new launch decides the same and runs nothing more
    sw.not_needed = {rid: "x" for rid, st in states.items() if st == "not needed"}
    assert unfinished_runs(sw) == []
    rc, text = run_inproc(p, out)
    assert rc == 0 and sorted(calls(out)) == sorted(ran), text
    assert asked == [[3], [4], [3], [4]]
    assert sequential_looks([(s, [s]) for s in (0, 1, 2, 3)], [0, 1, 2, 3], 3) == [([0, 1, 2], [0, 1, 2]), ([3], [3])]
    assert sequential_looks([(3, [3]), (4, [4])], [0, 1, 2, 3, 4], 3) == [([3], [3]), ([4], [4])]   # resumed late


def test_a_seed_that_does_not_finish_stops_the_sequential_sweep(tmp_path, monkeypatch):
    monkeypatch.setattr(sequential, "decide", lambda sw, batch: ({}, []))
    head = GRID + "algorithms:\n  rft: {train.lr: 0.0666}\nreport: {study: true, sequential: true}\n"
    p = sweep_file(tmp_path, head)   # rft fails at every seed (the fake trainer's fault injection)
    out = tmp_path / "out"
    rc, text = run_inproc(p, out)
    assert rc == 1, text
    assert {rid.split("-")[1] for rid in calls(out)} == {"s0", "s1", "s2"}      # the first look's seeds only
    assert ("seeds 0, 1, 2: 3 run(s) did not finish" in text
            and "the sequential design stops here (4 later run(s) not started)" in text)


def test_not_needed_drops_known_arms_without_an_open_claim(tmp_path, monkeypatch):
    p = sweep_file(tmp_path, "name: study\ngrid:\n  algorithm: [grpo, rft, ppo]\n  seed: [0, 1, 2, 3]\n"
                             "budget: {unit: samples, amount: 16, eval_points: 1}\nreport: {study: true, sequential: true}\n")
    sw = load_sweep(p, output_dir=str(tmp_path / "out"))
    start = {"acc": 0.4, "ood": 0.1, "pass": [0.4, 0.5], "maj": [0.4, 0.4]}
    for algo in ("grpo", "rft"):                                   # ppo: nothing finished yet
        for seed in (0, 1, 2):
            make_study_run(sw.sweep_dir, algo, seed, start=start, final=dict(start, acc=0.6), rss=300.0)
    monkeypatch.setattr(sequential, "arms_to_extend", lambda rows, design: {"grpo": 4})
    batch = [r for r in sw.runs if r.config.seed == 3]
    drop, _ = sequential.decide(sw, batch)
    assert [rid.split("-")[0] for rid in drop] == ["rft"]
    assert "no open claim needs rft after 3 seed(s)" in next(iter(drop.values()))
    # the real rule on these runs: the claims open at 3 seeds name the arms they need
    monkeypatch.undo()
    need = sequential.needed_arms(sw)
    assert set(need) <= {"grpo", "rft", "grpo_ps", "ppo"} and all(v == 4 for v in need.values())


def test_the_plan_says_the_sweep_is_sequential(tmp_path, capsys):
    p = sweep_file(tmp_path, GRID + "report: {study: true, sequential: true}\n")
    assert main(["sweep", str(p), "--output-dir", str(tmp_path / "out"), "--dry-run"]) == 0
    assert "report.sequential: seed by seed; after the first look, only the arms of open claims" in \
        capsys.readouterr().out


def _grid(grpo_seeds, rft_seeds):
    return ("name: sq\ngrid:\n"
            f"  - seed: {list(grpo_seeds)}\n    algorithm: [grpo]\n"
            f"  - seed: {list(rft_seeds)}\n    algorithm: [rft]\n"
            "budget: {unit: samples, amount: 16, eval_points: 1}\nreport: {study: true, sequential: true}\n")


def test_the_plan_warns_of_claims_whose_arms_stop_before_the_first_look(tmp_path, capsys):
    # claim 2 pairs grpo with rft; claims 3 and 6 use grpo alone; claims on arms not run are left out. Each part
    # spends its whole alpha by its arms' own cap, so a short grid (5 or 3 seeds) is tested at the full alpha.
    for grpo, rft in ((10, 5), (3, 3), (10, 10)):
        p = sweep_file(tmp_path, _grid(range(grpo), range(rft)))
        assert sequential.design_warnings(load_sweep(p, output_dir=str(tmp_path / "out"))) == [], (grpo, rft)
    p = sweep_file(tmp_path, _grid(range(10), range(2)))
    lines = sequential.design_warnings(load_sweep(p, output_dir=str(tmp_path / "out")))
    assert lines == ["claim 2 (GRPO > online RFT): the grid gives rft (2 seeds): it is never tested (the first look "
                     "needs 3 seeds); give its arms at least 3 (docs/study.md, Seeds)"]
    p = sweep_file(tmp_path, _grid(range(2), range(2)))
    lines = sequential.design_warnings(load_sweep(p, output_dir=str(tmp_path / "out")))
    assert [ln.split(" (")[0] for ln in lines] == ["claim 2", "claim 3", "claim 6"]
    # printed with the plan, before anything runs
    p = sweep_file(tmp_path, _grid(range(10), range(2)))
    assert main(["sweep", str(p), "--output-dir", str(tmp_path / "out"), "--dry-run"]) == 0
    assert "\nwarning: claim 2 (GRPO > online RFT): the grid gives rft (2 seeds)" in capsys.readouterr().out
