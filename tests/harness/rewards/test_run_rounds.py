"""Iterative RL in the real training loop (DeepSeekMath §4.2): the round schedule (how many retrainings and
reference resets over a run), the exact replay counts, the reward model's weights changing from round to
round, its work charged to the budget (samples and seconds) and reported apart, and a resume that ends with
the metrics of an uninterrupted run."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.config.schema import load_config
from harness.engine.learner import Learner
from harness.rewards import run as rm_run
from harness.rewards.learned import TaggedRM
from harness.rundir.layout import read_jsonl
from harness.train import loop
from harness.train.loop import run_dir, train

TINY = [
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "task.min_ops=1", "task.max_ops=1", "task.eval_size=4", "warmup.steps=0",
    "sampling.samples_per_prompt=2", "sampling.max_new_tokens=4", "train.prompts_per_step=2",
    "train.threads=1", "budget.eval_points=2", "train.save_final_model=false", "eval.greedy=true", "eval.n=0",
    "train.lr=1e-2", "reward_model.samples_per_round=8", "reward_model.epochs=1", "reward_model.lr=1e-2",
    "reward_model.micro_batch_size=4",
]


def _alternating_rewards(task, problems_rep, rollouts, prm=None):
    """A random tiny policy earns no reward: reward every other sample, so the learner has a signal."""
    return torch.tensor([float(i % 2) for i in range(len(problems_rep))]), []


def _cfg(tmp_path, *extra):
    return load_config(None, TINY + list(extra) + [f"output_dir={tmp_path / 'runs'}",
                                                   f"warmup.cache_dir={tmp_path / 'wc'}"])


@pytest.mark.parametrize("unit,amount,rounds,want", [
    ("steps", 6, 1, []), ("steps", 6, 2, [3.0]), ("steps", 6, 3, [2.0, 4.0]), ("steps", 10, 3, [3.0, 7.0]),
    ("samples", 32, 2, [16.0]), ("samples", 32, 4, [8.0, 16.0, 24.0]), ("samples", 30, 2, [16.0])])
def test_round_thresholds(unit, amount, rounds, want):
    """R rounds end at R - 1 budget points, placed on stage boundaries as the evaluation points are
    (4 samples a stage: 15 rounds to 16)."""
    assert rm_run.round_thresholds(SimpleNamespace(unit=unit, amount=amount), rounds, 4) == want


@pytest.mark.parametrize("rounds", [2, 3])
def test_rounds_retrain_the_reward_model_and_reset_the_reference_on_schedule(tmp_path, monkeypatch, rounds):
    """6 steps in R rounds: R trainings of the reward model (round 0 before RL) and R - 1 reference resets,
    each right after the stage that ends a round; the weights change in every training, and each
    round continues from the last one's weights; replay is 25% of the earlier examples, exactly."""
    monkeypatch.setattr(loop, "score", _alternating_rewards)
    resets, fits = [], []
    real_reset, real_fit = Learner.reset_reference, TaggedRM.fit

    def reset(self):
        resets.append(self.updates)  # the number of stages so far
        return real_reset(self)

    def fit(self, examples, epochs, seed=0):
        before = [p.detach().clone() for p in self.model.parameters()]
        out = real_fit(self, examples, epochs, seed)
        fits.append((before, [p.detach().clone() for p in self.model.parameters()], len(examples)))
        return out
    monkeypatch.setattr(Learner, "reset_reference", reset)
    monkeypatch.setattr(TaggedRM, "fit", fit)
    cfg = _cfg(tmp_path, "algorithm=grpo", "reward_model.type=orm", f"reward_model.rounds={rounds}",
               "reward_model.replay_fraction=0.25", "budget.unit=steps", "budget.amount=6")
    s = train(cfg, progress=False)
    assert s["status"] == "finished"
    assert resets == {2: [3], 3: [2, 4]}[rounds]
    assert len(fits) == rounds
    for before, after, _ in fits:  # every training moves the weights
        assert any(not torch.equal(a, b) for a, b in zip(before, after))
    for (_, end, _), (start, _, _) in zip(fits, fits[1:]):  # and the next round starts where it ended
        assert all(torch.equal(a, b) for a, b in zip(end, start))
    # 8 new examples a round; replay 25% of the 8, 16 earlier ones (rounded half up): 2, 4
    assert [n for _, _, n in fits] == [8, 8 + 2, 8 + 4][:rounds]
    rows = [r for r in read_jsonl(run_dir(cfg) / "metrics.jsonl") if "train/rm_round" in r]
    assert [r["train/rm_replayed"] for r in rows] == [0.0, 2.0, 4.0][:rounds]
    assert [r["step"] for r in rows] == {2: [0, 3], 3: [0, 2, 4]}[rounds]
    assert all("train/rm_fresh_outcome_acc" in r for r in rows[1:])  # the old model on the new samples
    rm = s["reward_model"]
    assert rm["type"] == "orm" and rm["trainings"] == rounds and rm["examples"] == 8 * rounds
    assert rm["cost"]["samples"] == 8 * rounds
    assert rm["params"] == s["params"]["policy"]  # a copy of the policy's model, held beside it


def test_reward_model_work_counts_against_the_budget(tmp_path, monkeypatch):
    """A budget of 48 samples with 2 rounds of 8 reward-model samples: 16 go to the reward model and 32 to RL
    (8 stages of 4); the seconds counter is the stages' time plus the rounds' time."""
    monkeypatch.setattr(loop, "score", _alternating_rewards)
    cfg = _cfg(tmp_path, "algorithm=grpo_ps", "reward_model.type=prm", "reward_model.rounds=2",
               "budget.unit=samples", "budget.amount=48")
    s = train(cfg, progress=False)
    rows = read_jsonl(run_dir(cfg) / "metrics.jsonl")
    stages = [r for r in rows if "train/loss" in r]
    assert s["budget"]["consumed"]["samples"] == 48 and s["reward_model"]["cost"]["samples"] == 16
    assert len(stages) == 8 and s["budget"]["consumed"]["steps"] == 8
    tokens = s["reward_model"]["cost"]["tokens"]
    assert 0 < tokens <= 16 * 4 and s["budget"]["consumed"]["tokens"] > tokens
    secs = sum(r["perf/step_seconds"] for r in stages) + s["reward_model"]["cost"]["seconds"]
    assert s["budget"]["consumed"]["seconds"] == pytest.approx(secs, rel=1e-9)
    assert s["reward_model"]["cost"]["seconds"] > 0 and s["reward_model"]["cost"]["seconds_in_stages"] > 0
    for r in stages:  # the learned PRM's scores beside the exact checker's
        assert 0.0 <= r["rollout/rm_step_acc"] <= 1.0 and "rollout/rm_step_reward_mean" in r
        assert "rollout/step_reward_mean" in r  # the exact step rewards, as without a reward model


def _comparable(rows):
    return [{k: v for k, v in r.items() if k not in ("time", "seconds") and not k.startswith("perf/")
             and "seconds" not in k} for r in rows]


@pytest.mark.parametrize("kind", ["orm", "implicit"])
def test_resume_with_a_reward_model_matches_an_uninterrupted_run(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(loop, "score", _alternating_rewards)
    common = ["budget.unit=steps", "budget.amount=6", f"reward_model.type={kind}"] + (
        ["algorithm=rloo", "reward_model.rounds=3"] if kind == "orm" else ["algorithm=prime"])
    ref_cfg = load_config(None, TINY + common + [f"output_dir={tmp_path / 'ref'}", f"warmup.cache_dir={tmp_path / 'wc'}"])
    ref = train(ref_cfg, progress=False)
    cfg = load_config(None, TINY + common + [f"output_dir={tmp_path / 'cut'}", f"warmup.cache_dir={tmp_path / 'wc'}"])
    real_stage = loop._stage

    def stage(run, k):
        if k == 4:  # after the evaluation point at step 3 (and, for orm, the round that ended at step 2)
            raise KeyboardInterrupt("injected stop")
        return real_stage(run, k)
    monkeypatch.setattr(loop, "_stage", stage)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False)
    monkeypatch.setattr(loop, "_stage", real_stage)
    s = train(cfg, progress=False)
    assert s["status"] == "finished" and s["resumed_from_step"] == 3
    got, want = read_jsonl(run_dir(cfg) / "metrics.jsonl"), read_jsonl(run_dir(ref_cfg) / "metrics.jsonl")
    assert _comparable(got) == _comparable(want)
    assert s["reward_model"]["trainings"] == ref["reward_model"]["trainings"]
    assert s["reward_model"]["cost"]["samples"] == ref["reward_model"]["cost"]["samples"]
    assert s["reward_model"]["params"] == (2 if kind == "implicit" else 1) * s["params"]["policy"]
    rows = [r for r in got if "train/loss" in r]
    if kind == "implicit":  # trained online on every batch, from the first
        assert s["reward_model"]["updates"] == 6 and all("train/prm_loss" in r for r in rows)
