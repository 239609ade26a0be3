"""The sweep with the real trainer (harness.train.loop.train) on a tiny setting: a Llama with
two 64-wide layers, warmed up for a few seconds on one-operation sums (so rollouts earn
non-zero rewards and the policy really moves), 16 completions per step.

- budget stopping in every unit, through the sweep: each run stops at the sweep's budget
  and evaluates at the same budget checkpoints, whatever the algorithm;
- resume after SIGKILL: a run whose worker is SIGKILLed after a checkpoint, and then a
  launcher SIGKILLed (its worker dies with it) after a later one, re-launched each time,
  ends with exactly the metrics of an uninterrupted run.
"""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from harness.rundir.layout import read_json, read_jsonl
from harness.sweep.plan import load_sweep
from harness.sweep.run import run_sweep
import support_paths

REPO = support_paths.REPO



def tiny(cache: Path, **extra) -> dict:
    cfg = {
        "device": "cpu",
        "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128, "max_length": 48},
        "task": {"min_ops": 1, "max_ops": 1, "operators": "+", "max_operand": 5, "eval_size": 16},
        "warmup": {"steps": 150, "examples_per_step": 32, "lr": 3.0e-3, "cache_dir": str(cache)},
        "sampling": {"samples_per_prompt": 4, "max_new_tokens": 12},
        "train": {"prompts_per_step": 4, "lr": 1.0e-3, "micro_batch_size": 16, "threads": 1},
    }
    cfg.update(extra)
    return cfg


def write_sweep(path: Path, name: str, cache: Path, grid: dict, budget: dict) -> Path:
    path.write_text(yaml.safe_dump({"name": name, "config": tiny(cache), "grid": grid, "budget": budget,
                                    "launcher": {"cpus": 1, "workers": 1}}))
    return path


def env() -> dict:
    e = dict(os.environ, PYTHONPATH=str(REPO))
    e.pop("CUDA_VISIBLE_DEVICES", None)
    return e


def inproc(path: Path, out: Path) -> tuple[int, str]:
    buf = io.StringIO()
    rc = run_sweep(load_sweep(path, output_dir=str(out)), progress=False, stream=buf)
    return rc, buf.getvalue()


def train_rows(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "rollout/reward_mean" in r]


def eval_points(run_dir: Path, counter: str) -> list:
    return [r[counter] for r in read_jsonl(run_dir / "metrics.jsonl") if "eval/arith/acc" in r]


def test_budget_stops_every_unit_at_matched_checkpoints(tmp_path, warm_cache):
    out = tmp_path / "out"
    # samples: two algorithms, same sample counts at every evaluation and at the end
    p = write_sweep(tmp_path / "samples.yaml", "b_samples", warm_cache, {"algorithm": ["grpo", "rloo"]},
                    {"unit": "samples", "amount": 56, "eval_points": 2})
    rc, text = inproc(p, out)
    assert rc == 0, text
    for r in load_sweep(p, output_dir=str(out)).runs:
        s = read_json(r.run_dir / "summary.json")
        assert s["status"] == "finished" and s["budget"]["consumed"]["samples"] == 56   # last stage cut to fit
        assert [row["samples"] for row in train_rows(r.run_dir)] == [16, 32, 48, 56]
        assert eval_points(r.run_dir, "samples") == [0, 32, 56]                           # 28 -> first step past it
    # steps
    p = write_sweep(tmp_path / "steps.yaml", "b_steps", warm_cache, {"seed": [0]},
                    {"unit": "steps", "amount": 3, "eval_points": 3})
    rc, text = inproc(p, out)
    assert rc == 0, text
    rd = load_sweep(p, output_dir=str(out)).runs[0].run_dir
    assert read_json(rd / "summary.json")["budget"]["consumed"]["steps"] == 3
    assert eval_points(rd, "step") == [0, 1, 2, 3]
    # tokens and seconds: stop at the first step that reaches the amount
    for unit, amount in (("tokens", 300), ("seconds", 0.6)):
        p = write_sweep(tmp_path / f"{unit}.yaml", f"b_{unit}", warm_cache, {"seed": [0]},
                        {"unit": unit, "amount": amount, "eval_points": 1})
        rc, text = inproc(p, out)
        assert rc == 0, text
        rd = load_sweep(p, output_dir=str(out)).runs[0].run_dir
        consumed = read_json(rd / "summary.json")["budget"]["consumed"][unit]
        vals = [row[unit] for row in train_rows(rd)]
        assert consumed == vals[-1] >= amount
        assert len(vals) == 1 or vals[-2] < amount, (unit, vals)


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _wait_step(run_dir: Path, min_step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until a training row of step >= min_step is logged (cheap to poll: the
    checkpoint of the evaluation point before it is then on disk)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"sweep ended (rc {proc.returncode}) before step {min_step}")
        rows = train_rows(run_dir)
        if rows and rows[-1]["step"] >= min_step:
            return
        time.sleep(0.02)
    pytest.fail(f"step {min_step} not reached within {timeout}s")


def _checkpoint_step(run_dir: Path) -> int:
    return torch.load(run_dir / "checkpoint" / "state.pt", weights_only=False)["counters"]["step"]


def _comparable(rows: list[dict]) -> list[dict]:
    """Metrics rows without wall-clock quantities."""
    drop = ("time", "seconds")
    return [{k: v for k, v in r.items() if k not in drop and not k.startswith("perf/") and not k.endswith("/seconds")}
            for r in rows]


def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path, warm_cache):
    path = write_sweep(tmp_path / "resume.yaml", "resume", warm_cache, {"algorithm": ["grpo"]},
                       {"unit": "samples", "amount": 512, "eval_points": 16})   # a checkpoint every 2 steps
    ref_out, out = tmp_path / "ref", tmp_path / "killed"
    rc, text = inproc(path, ref_out)                   # uninterrupted (and warms the cache up)
    assert rc == 0, text
    ref_dir = load_sweep(path, output_dir=str(ref_out)).runs[0].run_dir
    run = load_sweep(path, output_dir=str(out)).runs[0]
    assert run.run_id == ref_dir.name                  # output_dir is not part of the run id

    cmd = [sys.executable, "-m", "harness.cli.main", "sweep", str(path), "--output-dir", str(out), "--no-progress"]
    # 1) SIGKILL the worker after its first checkpoint: the launcher records the death
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
    try:
        _wait_step(run.run_dir, 3, proc)
        workers = [c for c in _children(proc.pid) if "harness.sweep.launchers" in " ".join(c.cmdline())]
        assert len(workers) == 1
        workers[0].send_signal(signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stdout
    s = read_json(run.run_dir / "summary.json")
    assert s["status"] == "failed" and "SIGKILL" in s["error"]
    assert "SIGKILL" in (run.run_dir / "error.txt").read_text()
    assert max(r["step"] for r in train_rows(run.run_dir)) < 32        # killed mid-run
    at = _checkpoint_step(run.run_dir)
    assert at >= 2

    # 2) re-launch; this time SIGKILL the launcher itself after a later checkpoint: its
    #    worker dies with it (PR_SET_PDEATHSIG) and the summary is left saying 'running'
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
    try:
        _wait_step(run.run_dir, at + 5, proc)
        worker_pids = [c.pid for c in _children(proc.pid)]
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        deadline = time.time() + 30
        while time.time() < deadline and any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                                             for pid in worker_pids):
            time.sleep(0.1)
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in worker_pids)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert read_json(run.run_dir / "summary.json")["status"] == "running"
    assert max(r["step"] for r in train_rows(run.run_dir)) < 32
    at2 = _checkpoint_step(run.run_dir)
    assert at2 >= at + 4

    # 3) re-launch to the end
    rc, text = inproc(path, out)
    assert rc == 0, text
    s, ref = read_json(run.run_dir / "summary.json"), read_json(ref_dir / "summary.json")
    assert s["status"] == "finished" and s["resumed_from_step"] == at2
    assert not (run.run_dir / "error.txt").exists() and (run.run_dir / "error.previous.txt").exists()
    for key in ("final_eval", "initial_eval"):
        assert _comparable([s[key]]) == _comparable([ref[key]]) and "eval/arith/acc" in s[key]
    for unit in ("samples", "tokens", "steps"):
        assert s["budget"]["consumed"][unit] == ref["budget"]["consumed"][unit]
    got, want = _comparable(read_jsonl(run.run_dir / "metrics.jsonl")), _comparable(read_jsonl(ref_dir / "metrics.jsonl"))
    assert [r["step"] for r in got] == [r["step"] for r in want]
    assert got == want                                  # every logged value, bit for bit
    moved = {r["train/grad_norm"] for r in train_rows(ref_dir)}
    assert len(moved) > 1 and max(moved) > 0            # the policy really trained
