"""The real trainer (harness.train.loop.train) on two processes: ``torchrun --nproc_per_node=2``
on CPU over gloo (``DS_ACCELERATOR=cpu``), plain DDP, DeepSpeed ZeRO-2 and ZeRO-3, through
harness.engine.distributed (tests/distributed_train_worker.py runs the cases one after another).

A tiny setting (a 2-layer 32-wide Llama, warmed up for 200 steps by rank 0 inside the
2-rank run, 4 prompts x 4 samples per stage, a budget of 36 samples so the last stage has
one prompt: rank 1 gets only padding and must still join every collective forward).

- the learner step through ``dist`` equals a single-process step on the union of both
  ranks' groups (GRPO: same gradient norm and loss); online RFT where one rank keeps
  nothing: that rank pads with zero-weight micro-batches and gradients are averaged over
  ranks, so the gradient is exactly half the single-process one (documented: ranks
  normalise with their local counts);
- each run finishes at the matched budget (36 samples, 3 stages; evaluations at the same
  budget checkpoints as a single-process run), the main rank alone writes metrics,
  summary and final model, losses are finite, parameter counts are the full model's
  (ZeRO-3 loads partitioned); DDP, ZeRO-2 and ZeRO-3 log the same metrics; the start
  (initial evaluation) is the single-process one;
- a run that fails after a checkpoint resumes (``dist.load_state``) and ends with exactly
  the metrics of an uninterrupted run (ZeRO-2 GRPO; ZeRO-3 PPO with a critic and a
  reference reset every 2 stages);
- the sweep launcher (``launcher.procs: 2, zero_stage: 2``) runs the same trainer under
  torchrun and gets the same run.

Single-process and 2-rank runs sample different completions (each rank draws its shard
with its own generator), so beyond the start and the budget their metrics are not compared.
Takes ~50 s on 2 cores once DeepSpeed's shared-memory op is compiled (~/.cache/torch_extensions).
"""
from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")

from harness.config.schema import load_config  # noqa: E402
from harness.foundation.base import to_dict  # noqa: E402
from harness.rundir.layout import read_json, read_jsonl  # noqa: E402
import support_paths

REPO = support_paths.REPO
BUDGET = 36


def overrides(out: Path, cache: Path, name: str, algorithm: str = "grpo", extra=()) -> list[str]:
    return ["device=cpu", "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2",
            "model.intermediate_size=64", "model.max_length=48",
            "task.min_ops=1", "task.max_ops=1", "task.operators=+", "task.max_operand=6", "task.eval_size=20",
            "warmup.steps=200", "warmup.examples_per_step=32", "warmup.lr=3e-3", f"warmup.cache_dir={cache}",
            "sampling.samples_per_prompt=4", "sampling.max_new_tokens=10",
            "train.prompts_per_step=4", "train.lr=1e-3", "train.micro_batch_size=4", "train.threads=1",
            "budget.unit=samples", f"budget.amount={BUDGET}", "budget.eval_points=2",
            f"algorithm={algorithm}", f"output_dir={out / name}", "name=dt", *extra]


CASES = [
    {"name": "learner_zero3", "kind": "learner", "mode": "zero3"},
    {"name": "learner_ddp", "kind": "learner", "mode": "ddp"},
    {"name": "zero2", "mode": "zero2"},
    {"name": "zero2_resumed", "mode": "zero2", "crash_at_step": 2},
    {"name": "ddp", "mode": "ddp"},
    {"name": "zero3", "mode": "zero3"},
    {"name": "zero3_rft", "mode": "zero3", "algorithm": "rft"},
    {"name": "zero3_ppo", "mode": "zero3", "algorithm": "ppo", "extra": ["algorithm.ref_reset_every=2"]},
    {"name": "zero3_ppo_resumed", "mode": "zero3", "algorithm": "ppo", "extra": ["algorithm.ref_reset_every=2"],
     "crash_at_step": 2},
]
RUNS = [c["name"] for c in CASES if c.get("kind") != "learner"]


def env() -> dict:
    e = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
             TORCH_CPP_LOG_LEVEL="ERROR", PYTHONWARNINGS="ignore::FutureWarning")
    e.pop("CUDA_VISIBLE_DEVICES", None)
    for k in ("HARNESS_ZERO_STAGE", "HARNESS_DEEPSPEED_CONFIG", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        e.pop(k, None)
    return e


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist_train")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def results(work):
    """Both ranks' results of every case (one torchrun)."""
    cache = work / "cache"
    cases = [dict(c, overrides=overrides(work, cache, c["name"], c.get("algorithm", "grpo"), c.get("extra", ())))
             for c in CASES]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(support_paths.SUPPORT / "distributed_train_worker.py"), json.dumps(cases), str(work)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=400, cwd=work)
    assert p.returncode == 0, (p.stdout + p.stderr)[-8000:]
    return [json.loads((work / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def single(work, results):
    """The same run in one process (after the 2-rank run: the warm-up cache is there)."""
    from harness.train.loop import run_dir, train
    cfg = load_config(None, overrides(work, work / "cache", "single"))
    s = train(cfg, progress=False)
    return s, read_jsonl(run_dir(cfg) / "metrics.jsonl")


def comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("time", "seconds") and not k.startswith("perf/")
             and not k.endswith("/seconds")} for r in rows]


def train_rows(rows):
    return [r for r in rows if "rollout/reward_mean" in r]


def eval_rows(rows):
    return [r for r in rows if "eval/arith/acc" in r]


def test_learner_step_through_dist_matches_one_process(results):
    for case in ("learner_zero3", "learner_ddp"):
        r0, r1 = results[0][case], results[1][case]
        assert r0["grpo"]["dist"] == r1["grpo"]["dist"] and r0["rft"]["dist"] == r1["rft"]["dist"]  # combined
        g_single, g_dist = r0["grpo"]["single"], r0["grpo"]["dist"]
        assert g_single["train/grad_norm"] > 0.1
        for k in ("train/grad_norm", "train/loss", "train/kept_fraction", "train/adv_mean", "train/adv_abs_mean",
                  "train/kl", "train/clip_frac"):
            assert g_dist[k] == pytest.approx(g_single[k], rel=1e-4, abs=1e-6), (case, k)


def test_rft_step_through_dist_matches_one_process(results):
    # RFT keeps the 5 correct of 16 samples, all on rank 0; normalised by the sampled outputs, rank 0's
    # loss is S/8 and rank 1's 0, averaged over ranks S/16: the single-process loss and gradient
    for case in ("learner_zero3", "learner_ddp"):
        f_single, f_dist = results[0][case]["rft"]["single"], results[0][case]["rft"]["dist"]
        assert 0 < f_single["train/kept_fraction"] == f_dist["train/kept_fraction"] < 0.5
        assert f_dist["train/loss"] == pytest.approx(f_single["train/loss"], rel=1e-4)
        assert f_dist["train/grad_norm"] == pytest.approx(f_single["train/grad_norm"], rel=1e-4)


@pytest.mark.parametrize("name", RUNS)
def test_two_rank_run_finishes_at_the_matched_budget(results, single, name):
    r0, r1 = results[0][name], results[1][name]
    case = next(c for c in CASES if c["name"] == name)
    algorithm = case.get("algorithm", "grpo")
    for r in (r0, r1):
        s = r["summary"]
        assert s["status"] == "finished" and s["distributed"] == {"mode": case["mode"], "world_size": 2}
        assert s["budget"]["consumed"]["samples"] == BUDGET and s["budget"]["consumed"]["steps"] == 3
    assert r0["summary"]["budget"] == r1["summary"]["budget"]            # the same counters on both ranks
    run = Path(r0["run_dir"])
    on_disk = read_json(run / "summary.json")
    assert on_disk["status"] == "finished" and on_disk["budget"] == r0["summary"]["budget"]
    rows = read_jsonl(run / "metrics.jsonl")
    tr = train_rows(rows)
    assert [row["samples"] for row in tr] == [16, 32, 36]                # written once (main rank only)
    assert [row["samples"] for row in eval_rows(rows)] == [0, 16, 36]
    s_single, rows_single = single
    assert [row["samples"] for row in eval_rows(rows_single)] == [0, 16, 36]   # same budget checkpoints
    assert comparable([r0["summary"]["initial_eval"]]) == comparable([s_single["initial_eval"]])
    for row in tr:
        for k in ("train/loss", "train/pg_loss", "train/value_loss", "rollout/reward_mean"):
            if k in row:
                assert math.isfinite(row[k]), (k, row)
    assert not any("train/skipped" in row for row in tr[:1]) and "train/grad_norm" in tr[0]
    if algorithm == "ppo":
        assert all(row["train/value_loss"] > 0 for row in tr[:1])
    # full-model parameter counts (ZeRO-3 loads partitioned), as in one process
    p = r0["summary"]["params"]
    assert p["policy"] == s_single["params"]["policy"] > 10_000
    assert p["reference"] == (p["policy"] if algorithm != "rft" else 0)
    assert p["critic"] == (p["policy"] + 32 + 1 if algorithm == "ppo" else 0)
    # the final model: full weights, written by the main rank
    from harness.engine.models import load_policy, num_params
    model, _ = load_policy(str(run / "final_model"))
    assert num_params(model) == p["policy"]
    # no resume state left behind
    assert not (run / "checkpoint" / "state.pt").exists() and not list((run / "checkpoint").glob("dist_*"))


def test_ddp_zero2_zero3_log_the_same_metrics(results):
    ref = train_rows(results[0]["ddp"]["metrics"])
    for name in ("zero2", "zero3"):
        got = train_rows(results[0][name]["metrics"])
        for a, b in zip(comparable(ref), comparable(got)):
            assert a.keys() == b.keys()
            for k in a:
                assert b[k] == pytest.approx(a[k], rel=1e-3, abs=1e-5), (name, k)
    evals = [comparable(eval_rows(results[0][n]["metrics"])) for n in ("ddp", "zero2", "zero3")]
    assert evals[0] == evals[1] == evals[2]


@pytest.mark.parametrize("name", ["zero2", "zero3_ppo"])
def test_resume_after_a_failure_matches_an_uninterrupted_run(results, name):
    r = results[0][f"{name}_resumed"]
    assert r["crashed"] == "injected at step 2" and r["status_after_crash"] == "failed"
    assert r["summary"]["resumed_from_step"] == 1                       # the checkpoint at 16 samples
    assert results[1][f"{name}_resumed"]["summary"]["resumed_from_step"] == 1
    assert comparable(r["metrics"]) == comparable(results[0][name]["metrics"])   # bit for bit
    assert comparable([r["summary"]["final_eval"]]) == comparable([results[0][name]["summary"]["final_eval"]])


def test_sweep_launcher_runs_the_trainer_under_torchrun(work, results, monkeypatch):
    from harness.sweep.plan import load_sweep
    from harness.sweep.run import run_sweep
    for k, v in env().items():
        if k in ("DS_ACCELERATOR", "PYTHONPATH", "TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS"):
            monkeypatch.setenv(k, v)
    cfg = to_dict(load_config(None, overrides(work, work / "cache", "unused")))
    budget = cfg.pop("budget")
    for k in ("name", "output_dir"):
        cfg.pop(k)
    path = work / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "dt", "config": cfg, "grid": {"seed": [0]}, "budget": budget,
                                    "launcher": {"procs": 2, "cpus": 2, "zero_stage": 2, "workers": 1}}))
    sw = load_sweep(path, output_dir=str(work / "sweep"))
    buf = io.StringIO()
    assert run_sweep(sw, progress=False, stream=buf) == 0, buf.getvalue()
    run = sw.runs[0].run_dir
    assert run.name == Path(results[0]["zero2"]["run_dir"]).name          # the same run id: the same config
    s = read_json(run / "summary.json")
    assert s["status"] == "finished" and s["distributed"] == {"mode": "zero2", "world_size": 2}
    assert comparable(read_jsonl(run / "metrics.jsonl")) == comparable(results[0]["zero2"]["metrics"])
