"""Checkpoints on a time interval (``train.checkpoint_minutes``), not only at evaluation points:
a run interrupted after a time checkpoint resumes from it and ends with exactly the metrics
rows and final result of an uninterrupted run."""
from __future__ import annotations

import pytest
import torch

from harness.config.schema import load_config
from harness.rundir.ids import run_id
from harness.rundir.layout import read_json, read_jsonl
from harness.train import loop
from harness.train.checkpoint import checkpoint_path
from harness.train.loop import run_dir, train

TINY = [
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "task.min_ops=1", "task.max_ops=1", "task.eval_size=4", "warmup.steps=0",
    "sampling.samples_per_prompt=2", "sampling.max_new_tokens=4", "train.prompts_per_step=2",
    "train.threads=1", "budget.unit=steps", "budget.amount=6", "budget.eval_points=2",
    "train.save_final_model=false", "eval.greedy=true", "eval.n=0", "train.lr=1e-2",
]


def _alternating_rewards(task, problems_rep, rollouts, prm=None):
    """A random tiny policy earns no reward (nothing would be updated): reward every other sample."""
    return torch.tensor([float(i % 2) for i in range(len(problems_rep))]), []


def _comparable(rows: list[dict]) -> list[dict]:
    """Rows without wall-clock quantities."""
    return [{k: v for k, v in r.items() if k not in ("time", "seconds") and not k.startswith("perf/")
             and not k.endswith("/seconds")} for r in rows]


def test_checkpoint_minutes_does_not_change_the_run_id():
    assert run_id(load_config(None, TINY)) == run_id(load_config(None, TINY + ["train.checkpoint_minutes=0"]))


def test_time_checkpoint_due():
    cfg = load_config(None, TINY + ["train.checkpoint_minutes=0.5"])
    assert not loop._time_checkpoint_due(cfg, 29.9) and loop._time_checkpoint_due(cfg, 30.0)
    off = load_config(None, TINY + ["train.checkpoint_minutes=0"])
    assert not loop._time_checkpoint_due(off, 1e9)


def test_resume_from_a_time_checkpoint_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "score", _alternating_rewards)
    common = TINY + [f"warmup.cache_dir={tmp_path / 'wc'}"]
    ref_cfg = load_config(None, common + [f"output_dir={tmp_path / 'ref'}", "train.checkpoint_minutes=0"])
    ref = train(ref_cfg, progress=False)
    # every stage ends past a 1e-9-minute interval: a resume point after every stage, not only
    # at the evaluation points (steps 3 and 6)
    cfg = load_config(None, common + [f"output_dir={tmp_path / 'cut'}", "train.checkpoint_minutes=1e-9"])
    saved, real_stage, real_save = [], loop._stage, loop.save_checkpoint

    def stage(run, k):
        if k == 4:                                      # after step 4's time checkpoint
            raise KeyboardInterrupt("injected stop")
        return real_stage(run, k)

    def save(ckpt, dist, learner, c, state):
        saved.append(state["counters"]["step"])
        return real_save(ckpt, dist, learner, c, state)

    monkeypatch.setattr(loop, "_stage", stage)
    monkeypatch.setattr(loop, "save_checkpoint", save)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False)
    out = run_dir(cfg)
    assert saved == [1, 2, 3, 4]                        # 3 is the evaluation point's, 1, 2, 4 time ones
    assert read_json(out / "summary.json")["status"] == "interrupted"
    assert torch.load(checkpoint_path(out), weights_only=True)["counters"]["step"] == 4

    monkeypatch.setattr(loop, "_stage", real_stage)
    s = train(cfg, progress=False)
    assert s["status"] == "finished" and s["resumed_from_step"] == 4
    assert saved == [1, 2, 3, 4, 5]                     # step 6 is the end: no resume point
    for key in ("initial_eval", "final_eval"):
        assert _comparable([s[key]]) == _comparable([ref[key]])
    for unit in ("samples", "tokens", "steps"):
        assert s["budget"]["consumed"][unit] == ref["budget"]["consumed"][unit]
    got, want = read_jsonl(out / "metrics.jsonl"), read_jsonl(run_dir(ref_cfg) / "metrics.jsonl")
    assert [r["step"] for r in got] == [r["step"] for r in want]
    assert _comparable(got) == _comparable(want)        # every logged value, bit for bit
    assert len({r["train/grad_norm"] for r in got if "train/grad_norm" in r}) > 1   # it really trained
