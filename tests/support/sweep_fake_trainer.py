"""A fast stand-in for ``harness.train.loop.train`` used by the sweep tests (imported by
worker processes by name: ``sweep_fake_trainer:train``).

It follows the trainer contract (docs/architecture.md) closely enough for the launcher:
run directory ``<output_dir>/<name>/<run_id>/``, ``metrics.jsonl`` rows with the budget
counters, ``summary.json`` (running -> finished | failed + error.txt), a resumable
``checkpoint/state.json``, and returns the summary of an already finished run without
training. No torch import: a run takes a fraction of a second.

Fault injection, keyed on the config so a grid can mix good and bad runs:
- ``train.lr == 0.0666``: raises RuntimeError (the trainer records the failure itself,
  like the real one);
- ``train.lr == 0.0777``: raises before writing anything (the worker records it);
- ``train.lr == 0.0999``: SIGKILLs its own process mid-run (the launcher records it).
``FAKE_STEP_SECONDS`` (env) slows every step down, for interrupt tests.
"""
from __future__ import annotations

import json
import os
import signal
import time
import traceback
from pathlib import Path

from harness.foundation.base import to_dict
from harness.foundation.budget import counter_key
from harness.foundation.files import write_json_atomic
from harness.rundir.ids import run_id
from harness.rundir.layout import MetricsWriter, read_json


def run_dir_of(cfg) -> Path:
    return Path(cfg.output_dir) / cfg.name / run_id(cfg)


def train(cfg, *, resume=True, progress=True):
    rd = run_dir_of(cfg)
    rd.mkdir(parents=True, exist_ok=True)
    with open(Path(cfg.output_dir) / "calls.log", "a") as f:
        f.write(f"{run_id(cfg)} {os.getpid()}\n")
    old = read_json(rd / "summary.json")
    if isinstance(old, dict) and old.get("status") == "finished":
        return old
    if cfg.train.lr == 0.0777:
        raise ValueError("injected failure before the run directory was written")
    t_start = time.time()
    ckpt = rd / "checkpoint" / "state.json"
    state = read_json(ckpt) if resume else None
    state = state or {"step": 0, "samples": 0, "tokens": 0, "seconds": 0.0, "resumed": 0}
    if state["step"] > 0:
        state["resumed"] += 1
    mw = MetricsWriter(rd / "metrics.jsonl")
    mw.truncate_after(state["step"])
    summary = {"run_id": run_id(cfg), "name": cfg.name, "algorithm": cfg.algorithm.name, "seed": cfg.seed,
               "status": "running", "budget": {"unit": cfg.budget.unit, "amount": cfg.budget.amount,
                                               "consumed": {}},
               "initial_eval": {}, "final_eval": {}, "peak": {"rss_mb": 1.0, "rss_above_base_mb": 0.5,
                                                              "cuda_mb": None},
               "params": {}, "wall_seconds": None, "error": None, "config": to_dict(cfg),
               "fake": {"pid": os.getpid(), "omp_threads": os.environ.get("OMP_NUM_THREADS"),
                        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "cwd": os.getcwd(),
                        "zero_stage": os.environ.get("HARNESS_ZERO_STAGE"),
                        "ds_config": os.environ.get("HARNESS_DEEPSPEED_CONFIG"),
                        "extra_env": os.environ.get("NCCL_DEBUG_SUBSYS")}}
    write_json_atomic(rd / "summary.json", summary)
    per_step = cfg.train.prompts_per_step * cfg.sampling.samples_per_prompt
    step_s = float(os.environ.get("FAKE_STEP_SECONDS", "0"))
    key = counter_key(cfg.budget.unit)
    try:
        if state["step"] == 0:
            mw.write({"step": 0, "samples": 0, "tokens": 0, "seconds": 0.0, f"eval/{cfg.task.name}/acc": 0.1})
        while state[key] < cfg.budget.amount:
            time.sleep(step_s)
            state["step"] += 1
            state["samples"] += per_step
            state["tokens"] += per_step * 3
            state["seconds"] += max(step_s, 0.01)
            reward = 0.1 + 0.01 * state["step"] + 0.001 * cfg.seed
            mw.write({"step": state["step"], "samples": state["samples"], "tokens": state["tokens"],
                      "seconds": state["seconds"], "rollout/reward_mean": reward})
            if cfg.train.lr == 0.0666 and state["step"] == 2:
                raise RuntimeError("injected failure at step 2")
            if cfg.train.lr == 0.0999 and state["step"] == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            write_json_atomic_mkdir(ckpt, state)
        acc = round(0.2 + 0.01 * state["step"], 4)
        mw.write({"step": state["step"], "samples": state["samples"], "tokens": state["tokens"],
                  "seconds": state["seconds"], f"eval/{cfg.task.name}/acc": acc})
    except Exception as e:
        summary.update(status="failed", error=f"{type(e).__name__}: {e}")
        write_json_atomic(rd / "summary.json", summary)
        (rd / "error.txt").write_text(traceback.format_exc())
        raise
    finally:
        mw.close()
    summary.update(status="finished", wall_seconds=time.time() - t_start,
                   final_eval={f"eval/{cfg.task.name}/acc": acc},
                   budget={"unit": cfg.budget.unit, "amount": cfg.budget.amount,
                           "consumed": {"samples": state["samples"], "tokens": state["tokens"],
                                        "steps": state["step"], "seconds": state["seconds"]}})
    summary["fake"]["resumed"] = state["resumed"]
    write_json_atomic(rd / "summary.json", summary)
    return summary


def write_json_atomic_mkdir(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, obj)


def train_distributed(cfg, *, resume=True, progress=True):
    """Under torchrun: every rank records what it saw; rank 0 writes the run."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rd = run_dir_of(cfg)
    rd.mkdir(parents=True, exist_ok=True)
    (rd / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world": world,
                                                     "local_rank": os.environ.get("LOCAL_RANK")}))
    if rank == 0:
        return train(cfg, resume=resume, progress=progress)
    return {}
