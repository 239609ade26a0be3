"""A real (tiny) run: evaluation rows sit at the budget thresholds and record them; summary.json
records the overshoot, bounded by one stage."""
from __future__ import annotations

from evals.arith import ArithTask
from harness.config.schema import load_config
from harness.rundir.layout import read_json, read_jsonl
from harness.train.loop import run_dir, train

TINY = [
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "task.min_ops=1", "task.max_ops=1", "task.eval_size=4", "warmup.steps=0",
    "sampling.samples_per_prompt=2", "sampling.max_new_tokens=4", "train.prompts_per_step=2",
    "train.threads=1", "train.save_final_model=false", "eval.greedy=true", "eval.n=0", "algorithm=grpo",
]


def _run(tmp_path, *extra):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", f"warmup.cache_dir={tmp_path / 'wc'}", *extra])
    train(cfg, progress=False)
    rows = read_jsonl(run_dir(cfg) / "metrics.jsonl")
    evals = [r for r in rows if "budget/threshold" in r]
    return read_json(run_dir(cfg) / "summary.json"), evals


def test_samples_budget_evaluates_on_stage_multiples(tmp_path):
    # 4 samples a stage; 10 / 2 = 5 a point -> nearest stage multiple 4, then 10 (last stage cut to 2)
    s, evals = _run(tmp_path, "budget.unit=samples", "budget.amount=10", "budget.eval_points=2")
    assert [(r["samples"], r["budget/threshold"]) for r in evals] == [(4, 4.0), (10, 10)]
    assert [r["step"] for r in evals] == [1, 3]
    assert s["budget"]["consumed"]["samples"] == 10
    assert s["budget"]["overshoot"] == {"amount": 0, "fraction": 0.0, "bound": 0}


def test_tokens_budget_records_overshoot_below_one_stage(tmp_path):
    s, evals = _run(tmp_path, "budget.unit=tokens", "budget.amount=20", "budget.eval_points=2")
    assert [r["budget/threshold"] for r in evals] == [10.0, 20.0]
    assert all(r["tokens"] >= r["budget/threshold"] for r in evals)
    used = s["budget"]["consumed"]["tokens"]
    o = s["budget"]["overshoot"]
    assert o["bound"] == 2 * 2 * 4  # one stage: 4 samples at max_new_tokens 4
    assert o["amount"] == used - 20 and 0 <= o["amount"] < o["bound"]
    assert o["fraction"] == o["amount"] / 20


def test_final_validation_eval_in_summary(tmp_path):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", f"warmup.cache_dir={tmp_path / 'wc'}",
                                    "budget.unit=steps", "budget.amount=1", "budget.eval_points=1",
                                    "eval.validation=true"])
    s = train(cfg, progress=False)
    rows = read_jsonl(run_dir(cfg) / "eval" / "arith_validation.jsonl")
    task = ArithTask(cfg.task)
    assert [r["id"] for r in rows] == [p.id for p in task.validation_problems()] == ["1-5", "6+3", "1+1", "3*9"]
    assert not {p.id for p in task.validation_problems()} & {p.id for p in task.eval_problems()}
    assert s["final_val_eval"]["eval/arith/acc"] == sum(bool(r["greedy"]["correct"]) for r in rows) / 4
    assert "final_val_eval" not in _run(tmp_path / "b", "budget.unit=steps", "budget.amount=1",
                                        "budget.eval_points=1")[0]
