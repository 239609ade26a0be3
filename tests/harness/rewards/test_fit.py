"""`harness rm train`'s work: Monte-Carlo step labels (Math-Shepherd) against brute force over the
continuations drawn, and a whole tiny training that writes a folder a run and algorithm.prm can load."""
from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from evals.arith import ArithTask
from evals.catalog import get_task
from harness.config.schema import TaskConfig, load_config
from harness.engine.models import load_prm
from harness.rewards import fit
from harness.rewards.data import label_exact, load_examples
from harness.rewards.learned import TaggedRM
from harness.train.loop import train
from harness.train.warmup import starting_checkpoint

TINY = ["model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
        "task.min_ops=1", "task.max_ops=2", "warmup.steps=0", "sampling.samples_per_prompt=2",
        "sampling.max_new_tokens=8", "train.threads=1", "reward_model.samples_per_round=16",
        "reward_model.epochs=1", "reward_model.micro_batch_size=8"]


def test_mc_step_labels_by_brute_force(monkeypatch):
    """Each step before the last is good when any of its continuations completes a right answer; the
    continuations here are fixed, so the labels are known by hand."""
    task = ArithTask()
    p = task.make_problem("3+4*2-5")
    comps = ["4*2=8;3+8=12;12-5=7;#7", "4*2=9;#6"]
    ex = label_exact(task, [p, p], comps, [True, True], with_steps=False)
    conts = {  # prefix (after the prompt) -> its 2 continuations
        "4*2=8;": ["3+8=11;11-5=6;#6", "#1"],     # one of them right: good
        "4*2=8;3+8=12;": ["12-5=7;#7", "#0"],     # neither: bad
        "4*2=8;3+8=12;12-5=7;": ["#6", "#7"],     # '#6' after the written steps is a right (well-formed) answer
        "4*2=9;": ["#5", "#4"],                   # bad
    }
    seen = []

    def fake_sample(model, tok, prompts, n, **kw):
        seen.extend(prompts)
        outs = [c for pr in prompts for c in conts[pr[len(task.format_prompt(p)):]]]
        return SimpleNamespace(completions=outs, finished=[True] * len(outs), num_sequences=len(outs), num_tokens=7)
    monkeypatch.setattr(fit, "sample", fake_sample)
    cfg = load_config(None, TINY)
    got, n_samples, n_tokens = fit.mc_step_labels(None, None, task, ex, [p, p], 2, cfg)
    assert [s[0] for s in got[0].steps] == [1.0, 0.0, 1.0, 0.0]  # last step: the outcome (#7 is wrong)
    assert [s[1] for s in got[0].steps] == [6, 13, 20, 22]
    assert got[1].steps == [[0.0, 6], [1.0, 8]]                   # outcome 1: '#6' is right
    assert n_samples == 8 and n_tokens == 7 and len(seen) == 4


def test_train_reward_model_needs_a_policy_folder_or_a_start_loader(tmp_path):
    """harness.rewards sits below harness.train: the caller says how the starting checkpoint loads
    (`harness rm train` passes harness.train.warmup.starting_checkpoint); neither given is refused
    before anything is loaded or written."""
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", f"warmup.cache_dir={tmp_path / 'wc'}"])
    with pytest.raises(TypeError, match="policy_dir .* or load_start"):
        fit.train_reward_model(cfg, "prm", out=str(tmp_path / "prm"), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_train_reward_model_writes_a_loadable_folder(tmp_path):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", f"warmup.cache_dir={tmp_path / 'wc'}"])
    res = fit.train_reward_model(cfg, "prm", load_start=starting_checkpoint, out=str(tmp_path / "prm"),
                                 progress=False)
    folder = tmp_path / "prm"
    spec = json.loads((folder / "reward_model.json").read_text())
    assert spec["kind"] == "prm" and spec["step_tag"] == "@" and spec["cost"]["samples"] == 16
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["examples"]["train"] + metrics["examples"]["heldout"] == 16
    assert metrics["cost"]["tokens"] > 0 and metrics["cost"]["seconds"] > 0 and res["out"] == str(folder)
    assert set(metrics["heldout"]) <= {"outcome", "steps"} and "steps" in metrics["train"]
    kept = load_examples(folder)
    assert len(kept) == metrics["examples"]["train"] and all(e.steps for e in kept)
    rm = TaggedRM.load(folder)
    assert rm.kind == "prm"
    assert load_prm(str(folder), ArithTask()).step_tag == "@"
    # a run starting from it charges its cost and replays its training examples
    run_cfg = load_config(None, TINY + ["algorithm=grpo_ps", "reward_model.type=prm", f"reward_model.init={folder}",
                                        "task.eval_size=4", "train.prompts_per_step=2", "budget.unit=samples",
                                        "budget.amount=24", "budget.eval_points=1", "eval.n=0",
                                        "train.save_final_model=false", f"output_dir={tmp_path / 'runs'}",
                                        f"warmup.cache_dir={tmp_path / 'wc'}"])
    s = train(run_cfg, progress=False)
    assert s["reward_model"]["init_cost"]["samples"] == 16 and s["budget"]["consumed"]["samples"] == 24
    assert s["budget"]["consumed"]["steps"] == 2  # 24 - 16 charged = 8 samples of RL: two stages of 4


def test_default_folder_names_kind_seed_and_settings(tmp_path):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}"])
    a = fit.default_out(cfg, "orm", {"samples": 16})
    assert a.parent == tmp_path / "reward_models" and a.name.startswith("orm-s0-")
    assert fit.default_out(cfg, "orm", {"samples": 32}) != a
    assert fit.default_out(load_config(None, TINY + [f"output_dir={tmp_path}", "name=x"]), "orm", {"samples": 16}) == a


def test_a_data_set_gets_outcomes_from_its_grader_and_steps_by_monte_carlo(data_dir, monkeypatch):
    """GSM8K has no step checker: the grader labels outcomes, Monte-Carlo completion labels the steps
    (newline-separated), with fixed continuations so the labels are known by hand."""
    task = get_task(TaskConfig(name="gsm8k", data_path=str(data_dir / "gsm8k"), eval_size=3))
    p = task.sample_train(random.Random(0), 1)[0]
    bad = str(int(float(p.answer)) + 1000)  # a number that is not the answer
    comps = [f"Half of it.\nThen add.\n#### {p.answer}", f"Half of it.\n#### {bad}"]
    ex = label_exact(task, [p, p], comps, [True, True], with_steps=False)
    assert [e.outcome for e in ex] == [1.0, 0.0]
    conts = {"Half of it.\n": [f"#### {bad}", f"#### {p.answer}"],   # one right continuation: good
             "Half of it.\nThen add.\n": [f"#### {bad}", f"#### {bad}"]}  # none: bad (the written answer is right)

    def fake_sample(model, tok, prompts, n, **kw):
        outs = [c for pr in prompts for c in conts[pr[len(task.format_prompt(p)):]]]
        return SimpleNamespace(completions=outs, finished=[True] * len(outs), num_sequences=len(outs), num_tokens=3)
    monkeypatch.setattr(fit, "sample", fake_sample)
    got, n_samples, _ = fit.mc_step_labels(None, None, task, ex, [p, p], 2, load_config(None, TINY))
    assert [s[0] for s in got[0].steps] == [1.0, 0.0, 1.0] and [s[0] for s in got[1].steps] == [1.0, 0.0]
    assert n_samples == 6  # 2 continuations after each step but the last: 2 steps + 1 step
