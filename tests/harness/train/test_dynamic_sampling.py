"""DAPO's dynamic sampling at the stage and in a real (tiny) run: zero-variance groups dropped, further
prompts drawn while the batch is short, and every sample drawn charged to the budget (arXiv 2503.14476 §3.2;
the matched-budget rule of docs/sweeps.md)."""
from __future__ import annotations

import torch

from algorithms.advantages import overlong_penalty
from algorithms.filters import informative_groups, zero_variance_share
from evals.arith import ArithTask
from harness.config.schema import ModelConfig, load_config
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.perf import PerfTracker
from harness.rundir.layout import read_json, read_jsonl
from harness.train.loop import run_dir, train
from harness.train.stage import resample_problems, run_stage, stage_problems

TINY = [
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "task.min_ops=1", "task.max_ops=1", "task.eval_size=4", "warmup.steps=0",
    "sampling.samples_per_prompt=2", "sampling.max_new_tokens=4", "train.prompts_per_step=2",
    "train.threads=1", "train.save_final_model=false", "eval.greedy=true", "eval.n=0",
]


def test_shaping_by_hand():
    # DAPO eq. 13, L_max 40, L_cache 8: no penalty to 32 tokens, then linear to -1 at 40
    got = overlong_penalty(torch.tensor([10, 32, 34, 36, 40]), 40, 8)
    assert got.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(torch.tensor([40]), 40, 8, factor=0.5).tolist() == [-0.5]
    assert overlong_penalty(torch.tensor([40]), 40, 0).tolist() == [0.0]
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.25])
    assert informative_groups(r, 2).tolist() == [True, False, False, True]
    assert zero_variance_share(r, 2) == 0.5


class FakeLearner:
    """What run_stage needs of a learner: a policy to sample with, and a step that records its batch."""

    def __init__(self, policy):
        self.policy, self.seen = policy, []

    def step(self, rollouts, rewards, step_rewards, k, valid=None, progress=0.0):
        self.seen.append((rollouts, rewards.clone()))
        return {"train/loss": 0.0}


def scripted(per_draw):
    """A scorer that gives draw i the rewards ``per_draw[i]`` (one list per draw, a reward per sample)."""
    calls = []

    def score(task, reps, ro, prm=None):
        r = torch.tensor(per_draw[len(calls)], dtype=torch.float32)
        calls.append(list(reps))
        assert len(r) == ro.num_sequences
        return r, []
    return score, calls


def _stage(tmp_path, per_draw, more=None, *extra):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "algorithm=dapo", *extra])
    tok = build_char_tokenizer()
    task = ArithTask(cfg.task)
    task.bind_tokenizer(tok)
    learner = FakeLearner(build_tiny_model(ModelConfig(hidden_size=16, num_layers=1, num_heads=2,
                                                       intermediate_size=32), tok))
    score, calls = scripted(per_draw)
    problems = stage_problems(task, cfg.seed, 0, 2)
    st = run_stage(learner, cfg, task, tok, 0, problems, score, perf=PerfTracker(), more_prompts=more)
    return st, learner, calls, task, cfg


def test_dynamic_sampling_fills_the_batch_with_informative_groups(tmp_path):
    # draw 0: group 0 informative, group 1 all 0; draw 1: group 0 all 1, group 1 informative -> full (2 groups)
    st, learner, calls, task, cfg = _stage(tmp_path, [[1, 0, 0, 0], [1, 1, 0, 1]])
    assert len(calls) == 2 and len(learner.seen) == 1
    ro, rewards = learner.seen[0]
    assert rewards.tolist() == [1.0, 0.0, 0.0, 1.0]  # draw 0's group 0, then draw 1's group 1
    assert calls[0][:2] == st.problems_rep[:2] and calls[1][2:] == st.problems_rep[2:]
    assert calls[1] == [p for p in resample_problems(task, cfg.seed, 0, 1, 2) for _ in range(2)]
    assert ro.num_sequences == 4 and st.all_drawn.samples == 8  # 8 drawn, 4 used
    assert st.all_drawn.rewards.tolist() == [1, 0, 0, 0, 1, 1, 0, 1]
    assert ro.completion_mask.shape[0] == ro.prompt_ids.shape[0] == len(ro.completions) == 4


def test_dynamic_sampling_stops_at_its_bound_and_at_the_budget(tmp_path):
    # every group uninformative: 1 + max_resample (2) draws, nothing learned
    st, learner, calls, *_ = _stage(tmp_path / "a", [[0, 0, 1, 1]] * 3)
    assert len(calls) == 3 and learner.seen == [] and st.metrics == {"train/skipped": 1.0}
    assert st.all_drawn.samples == 12 and st.rollouts.num_sequences == 0
    # the caller's budget allows one more prompt, then none: 2 + 1 prompts drawn
    asked = []
    st, learner, calls, *_ = _stage(tmp_path / "b", [[0, 0, 1, 1], [1, 0]],
                                    lambda r, drawn: asked.append((r, drawn)) or (1 if r == 1 else 0))
    assert asked == [(1, 4), (2, 6)] and len(calls) == 2
    assert learner.seen[0][1].tolist() == [1.0, 0.0] and st.all_drawn.samples == 6
    # max_resample 0: the zero-variance groups are dropped, nothing more drawn
    st, learner, calls, *_ = _stage(tmp_path / "c", [[0, 1, 1, 1]], None, "algorithm.max_resample=0")
    assert len(calls) == 1 and learner.seen[0][1].tolist() == [0.0, 1.0] and st.all_drawn.samples == 4


def _run(tmp_path, *extra):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", f"warmup.cache_dir={tmp_path / 'wc'}", "algorithm=dapo",
                                    "budget.eval_points=1", *extra])
    train(cfg, progress=False)
    rows = [r for r in read_jsonl(run_dir(cfg) / "metrics.jsonl") if "rollout/samples_drawn" in r]
    return read_json(run_dir(cfg) / "summary.json"), rows


def test_every_sample_drawn_is_charged_to_the_budget(tmp_path):
    """An untrained policy scores 0 on (nearly) every sample: dynamic sampling drops those groups and draws
    again; the samples counter, the budget and summary.json count what was drawn, not what was used."""
    s, rows = _run(tmp_path / "steps", "budget.unit=steps", "budget.amount=2")
    drawn = sum(r["rollout/samples_drawn"] for r in rows)
    used = sum(r["rollout/samples_used"] for r in rows)
    assert used < drawn  # some groups were dropped: what the budget must still pay for
    assert rows[-1]["samples"] == s["budget"]["consumed"]["samples"] == s["budget"]["samples_drawn"] == drawn
    assert s["budget"]["samples_used"] == used
    assert all(r["rollout/samples_drawn"] in (4, 8, 12) for r in rows)  # 1 to 3 draws of 2 prompts x 2
    # a samples budget: the last draws are cut to land on it, the dropped ones counted
    s, rows = _run(tmp_path / "samples", "budget.unit=samples", "budget.amount=10")
    assert s["budget"]["consumed"]["samples"] == 10 == sum(r["rollout/samples_drawn"] for r in rows)
    assert s["budget"]["overshoot"]["amount"] == 0
    assert s["budget"]["samples_used"] == sum(r["rollout/samples_used"] for r in rows) < 10
