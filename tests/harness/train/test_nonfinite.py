"""Non-finite training state fails the run with a message naming the step, for every
algorithm (an infinite learning rate used to let online RFT "finish" with NaN weights);
config validation refuses non-finite numbers up front."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from harness.config.schema import load_config
from harness.foundation.base import ConfigError
from harness.rundir.layout import read_json, read_jsonl
from harness.train import loop
from harness.train.loop import run_dir, train

TINY = [
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "task.min_ops=1", "task.max_ops=1", "task.eval_size=4", "warmup.steps=0",
    "sampling.samples_per_prompt=2", "sampling.max_new_tokens=4", "train.prompts_per_step=2",
    "train.threads=1", "budget.unit=steps", "budget.amount=3", "budget.eval_points=1",
    "train.save_final_model=false", "eval.greedy=true", "eval.n=0",
]


@pytest.mark.parametrize("lr", [".inf", "-.inf", ".nan", "inf", "nan"])
def test_config_refuses_non_finite_lr(lr):
    with pytest.raises(ConfigError, match=r"train\.lr"):
        load_config(None, TINY + [f"train.lr={lr}"])


def _alternating_rewards(task, problems_rep, rollouts, prm=None):
    """A random tiny policy earns no reward (so nothing is updated): reward every other sample."""
    return torch.tensor([float(i % 2) for i in range(len(problems_rep))]), []


@pytest.mark.parametrize("algorithm", ["rft", "grpo", "ppo"])
def test_infinite_lr_fails_the_run_naming_the_step(algorithm, tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "score", _alternating_rewards)
    cfg = load_config(None, TINY + [f"algorithm={algorithm}", f"output_dir={tmp_path}",
                                    f"warmup.cache_dir={tmp_path / 'wc'}"])
    # bypass validation (a config built in code, or a schedule that overflows): the loop must catch it
    cfg = cfg.replace(train=dataclasses.replace(cfg.train, lr=math.inf))
    with pytest.raises(FloatingPointError, match=r"after step 1\b") as ei:
        train(cfg, progress=False)
    assert "non-finite" in str(ei.value) and "weight" in str(ei.value)
    s = read_json(run_dir(cfg) / "summary.json")
    assert s["status"] == "failed" and "after step 1" in s["error"]
    rows = read_jsonl(run_dir(cfg) / "metrics.jsonl")
    assert rows and not any("train/loss" in r for r in rows)  # the poisoned step was never logged
    assert not (run_dir(cfg) / "final_model").exists()


def test_check_finite_names_loss_and_grad_norm(tmp_path):
    class L:
        policy = torch.nn.Linear(2, 2)
        critic = None

    class D:
        is_distributed = False

    run = type("R", (), {"learner": L(), "dist": D(), "cfg": load_config(None, TINY)})()
    loop._check_finite(run, {"train/loss": 0.5, "train/grad_norm": 1.0, "rollout/x": float("nan")}, 4)
    with pytest.raises(FloatingPointError, match=r"after step 5: train/loss=nan, train/grad_norm=inf"):
        loop._check_finite(run, {"train/loss": float("nan"), "train/grad_norm": float("inf")}, 4)
    with torch.no_grad():
        L.policy.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"1 non-finite policy weight"):
        loop._check_finite(run, {"train/loss": 0.5}, 0)
