"""Setup jobs (harness.sweep.run, "Setup jobs"): the sweep builds each seed's warm-up and start
evaluation in a process of its own before the runs, so no run builds them in-process.

With the real trainer, a tiny Llama (two 64-wide layers, a warm-up of a few seconds) and two
algorithms x two seeds: one setup job per seed builds the warm-up and the start evaluation;
every run then reads both from the caches (nothing built, the start evaluation's records and
its recorded seconds identical to the setup job's), and a second launch starts no setup job.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import yaml

from harness.report.study import time_summary
from harness.report.study_data import load_study
from harness.rundir.export import export_runs
from harness.rundir.layout import SETUP_DIR, read_json, read_jsonl
from harness.sweep.plan import load_sweep
from harness.sweep.run import run_sweep, setup_jobs, setup_key
from harness.sweep.spec import LaunchOptions
from harness.train.evalpoints import _cache_dir, initial_eval_key


def _sweep(path: Path, cache: Path) -> Path:
    cfg = {
        "device": "cpu",
        "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128, "max_length": 48},
        "task": {"min_ops": 1, "max_ops": 1, "operators": "+", "max_operand": 5, "eval_size": 16},
        "warmup": {"steps": 60, "examples_per_step": 32, "lr": 3.0e-3, "cache_dir": str(cache), "per_seed": True},
        "sampling": {"samples_per_prompt": 4, "max_new_tokens": 12},
        "train": {"prompts_per_step": 4, "lr": 1.0e-3, "micro_batch_size": 16, "threads": 1},
        "eval": {"n": 4, "sample_problems": 8},
    }
    path.write_text(yaml.safe_dump({"name": "st", "config": cfg,
                                    "grid": {"algorithm": ["grpo", "rloo"], "seed": [0, 1]},
                                    "budget": {"unit": "samples", "amount": 32, "eval_points": 1},
                                    "launcher": {"cpus": 1, "workers": 2}}))
    return path


def _launch(path: Path, out: Path) -> tuple[int, str]:
    buf = io.StringIO()
    old = os.environ.pop("HARNESS_TRAIN_FN", None)
    try:
        rc = run_sweep(load_sweep(path, output_dir=str(out)), progress=False, stream=buf)
    finally:
        if old is not None:
            os.environ["HARNESS_TRAIN_FN"] = old
    return rc, buf.getvalue()


def test_setup_jobs_build_each_seeds_warmup_and_start_evaluation_before_the_runs(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "warm"
    path = _sweep(tmp_path / "s.yaml", cache)
    rc, text = _launch(path, out)
    assert rc == 0, text
    assert "setup: 2 warm-up and start-evaluation job(s) (seed 0, seed 1)" in text, text
    for seed in (0, 1):   # progress: a line when each job starts and one when it ends, with its times
        assert f"setup (seed {seed}): building the warm-up and the start evaluation" in text
        done = next(line for line in text.splitlines() if line.startswith(f"setup (seed {seed}): done in"))
        assert "warm-up built" in done and "start evaluation" in done, done
    jobs = sorted((out / "st" / SETUP_DIR).glob("*/summary.json"))
    assert len(jobs) == 2
    built = {}
    for j in jobs:
        s = read_json(j)
        assert s["status"] == "finished"
        assert s["setup_seconds"]["warmup_build"] > 0 and s["start"]["cached"] is False   # it built the warm-up
        assert read_jsonl(j.parent / "metrics.jsonl")[-1].get("rollout/reward_mean") is None  # and trained nothing
        built[s["seed"]] = s["initial_eval"]
    assert set(built) == {0, 1} and built[0] != built[1]
    for r in load_sweep(path, output_dir=str(out)).runs:
        s = read_json(r.run_dir / "summary.json")
        assert s["status"] == "finished"
        assert s["start"]["cached"] is True and s["setup_seconds"]["warmup_build"] == 0.0
        # read from the cache: the very record the setup job computed, its seconds included
        assert s["initial_eval"] == built[r.config.seed]
        assert any(k.endswith("/seconds") and v > 0 for k, v in s["initial_eval"].items())
    # not runs of the sweep; exported beside them, and the study report counts their time once per seed
    export_runs(out / "st", tmp_path / "exp")
    assert sorted(p.parent.name for p in (tmp_path / "exp" / SETUP_DIR).glob("*/summary.json")) == \
        sorted(j.parent.name for j in jobs)
    t = time_summary(load_study(tmp_path / "exp"))
    assert t["runs"] == 4 and t["setup_jobs"] == 2 and t["warmup"] == 0.0
    assert t["setup_warmup"] == sum(read_json(j)["setup_seconds"]["warmup_build"] for j in jobs) > 0
    assert t["setup_eval"] == sum(read_json(j)["setup_seconds"]["initial_eval"] for j in jobs) > 0
    # everything finished: a second launch starts no setup job
    rc, text = _launch(path, out)
    assert rc == 0 and "setup:" not in text, text


def test_setup_jobs_one_per_seed_and_none_where_they_do_not_apply(tmp_path):
    path = _sweep(tmp_path / "s.yaml", tmp_path / "warm")
    sw = load_sweep(path, output_dir=str(tmp_path / "out"))
    real = LaunchOptions(train="harness.train.loop:train")
    jobs = setup_jobs(sw.sweep_dir, sw.runs, real)
    assert sorted(j.label for j in jobs) == ["seed 0", "seed 1"]
    assert len({setup_key(r.config) for r in sw.runs}) == 2             # grpo and rloo share their seed's setup
    for j in jobs:                                                       # <sweep>/setup/<job>/, not mirrored
        assert Path(j.run_dir).parent == tmp_path / "out" / "st" / SETUP_DIR
        assert j.config["tracking"]["mlflow"] is False and j.config["warmup"]["cache_dir"] == str(tmp_path / "warm")
    assert setup_jobs(sw.sweep_dir, sw.runs, LaunchOptions(train="sweep_fake_trainer:train")) == []   # the test seam
    assert setup_jobs(sw.sweep_dir, sw.runs, LaunchOptions(train="harness.train.loop:train", procs=2)) == []
    # a run that resumes from a checkpoint is past its start evaluation
    seed0 = [r for r in sw.runs if r.config.seed == 0]
    for r in seed0:
        (r.run_dir / "checkpoint").mkdir(parents=True)
    assert [j.label for j in setup_jobs(sw.sweep_dir, sw.runs, real)] == ["seed 1"]


def test_a_greedy_only_start_evaluation_is_one_setup_job_for_every_seed(tmp_path):
    """The start evaluation draws nothing when eval.n is 0, so seeds sharing a warm-up share one setup job (and one
    cache entry); with samples drawn each seed has its own."""
    path = _sweep(tmp_path / "s.yaml", tmp_path / "warm")
    real = LaunchOptions(train="harness.train.loop:train")
    greedy = load_sweep(path, output_dir=str(tmp_path / "out"), overrides=["warmup.per_seed=false", "eval.n=0"])
    assert [j.label for j in setup_jobs(greedy.sweep_dir, greedy.runs, real)] == ["seeds 0, 1"]
    assert len({initial_eval_key(r.config) for r in greedy.runs}) == 1
    sampled = load_sweep(path, output_dir=str(tmp_path / "out"), overrides=["warmup.per_seed=false"])
    assert sorted(j.label for j in setup_jobs(sampled.sweep_dir, sampled.runs, real)) == ["seed 0", "seed 1"]
    assert len({initial_eval_key(r.config) for r in sampled.runs}) == 2


def test_the_smollm2_recipe_sweep_has_one_setup_job_and_a_pretrained_start_is_cached(tmp_path):
    """A pretrained model's warm-up (warmup.pretrained) gets the setup job and the start evaluation's cache the tiny
    model's has: the recipe's 3 seeds (greedy only) one job; without warmup.pretrained there is nothing to set up."""
    root = Path(__file__).resolve().parents[2]
    real = LaunchOptions(train="harness.train.loop:train")
    sw = load_sweep(root / "sweeps" / "wordarith_lora.yaml", output_dir=str(tmp_path / "out"))
    assert [j.label for j in setup_jobs(sw.sweep_dir, sw.runs, real)] == ["seeds 0, 1, 2"]
    start = tmp_path / "warm" / "entry"
    start.mkdir(parents=True)
    (start / "warmup.json").write_text("{}")
    cfg = sw.runs[0].config
    assert _cache_dir(cfg, {"source": str(start)}) == start / "initial_eval" / initial_eval_key(cfg)
    plain = load_sweep(root / "sweeps" / "wordarith_lora.yaml", output_dir=str(tmp_path / "out"),
                       overrides=["warmup.pretrained=false"])
    assert setup_jobs(plain.sweep_dir, plain.runs, real) == []
