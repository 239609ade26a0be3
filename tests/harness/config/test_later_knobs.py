"""Knobs that came later (task.disjoint_validation, warmup.long_share / long_ops) are left out of
config.yaml, run ids and cache keys at their defaults, enter them when set, and are refused where
they cannot apply, before any work."""
import dataclasses
import random
import re

import pytest

from evals.arith import ArithTask, parse_expr
from harness.config.schema import load_config, warmup_long_spec
from harness.foundation.base import ConfigError, to_dict
from harness.rundir.ids import run_id
from harness.train.evalpoints import initial_eval_key
from harness.train.warmup import _warmup_examples, warmup_key

QS = "harness/configs/quickstart.yaml"


def test_at_their_defaults_the_later_knobs_change_no_id_or_key():
    cfg = load_config(QS)
    d = cfg.effective_dict()
    assert "disjoint_validation" not in d["task"]
    assert "long_share" not in d["warmup"] and "long_ops" not in d["warmup"]
    # the quickstart's ids as they were before the knobs existed (b521267)
    assert run_id(cfg) == "grpo-s0-22f487ed"
    assert warmup_key(cfg) == "0c88570608aa"
    # set explicitly to their defaults: the same run
    same = load_config(QS, ["task.disjoint_validation=false", "warmup.long_share=0.0", "warmup.long_ops=4"])
    assert run_id(same) == run_id(cfg) and warmup_key(same) == warmup_key(cfg)


def test_set_they_enter_the_run_id_and_the_keys_they_change():
    cfg = load_config(QS)
    split = load_config(QS, ["task.disjoint_validation=true"])
    assert to_dict(split.task)["disjoint_validation"] is True
    assert run_id(split) != run_id(cfg)
    assert initial_eval_key(split) != initial_eval_key(cfg)  # another test set
    long = load_config(QS, ["warmup.long_share=0.1"])
    assert run_id(long) != run_id(cfg) and warmup_key(long) != warmup_key(cfg)
    assert warmup_key(load_config(QS, ["warmup.long_share=0.1", "warmup.long_ops=5"])) != warmup_key(long)


@pytest.mark.parametrize("sets, field", [
    (["warmup.long_share=1.5"], "warmup.long_share"),
    (["warmup.long_share=-0.1"], "warmup.long_share"),
    (["warmup.long_share=0.1", "warmup.long_ops=0"], "warmup.long_ops"),
    (["task.name=gsm8k", "task.min_ops=1", "task.disjoint_validation=true"], "task.disjoint_validation"),
    (["task.name=gsm8k", "warmup.long_share=0.1"], "warmup.long_share"),
    # a long spec with nothing to train on: its one expression, 1+1, is held out (the task's 1+1+1 is not)
    (["warmup.long_share=0.1", "warmup.long_ops=1", "task.min_ops=1", "task.max_ops=2", "task.min_operand=1",
      "task.max_operand=1", "task.operators=+", "task.eval_size=1"], "warmup.long_ops"),
])
def test_refused_where_they_cannot_apply(sets, field):
    with pytest.raises(ConfigError) as e:
        load_config(QS, sets)
    assert field in str(e.value)


def test_warmup_examples_with_a_long_share():
    cfg = load_config(QS, ["warmup.long_share=0.25", "warmup.examples_per_step=400"])
    task, long_task = ArithTask(cfg.task), ArithTask(warmup_long_spec(cfg))
    rng = random.Random(7)
    probs = _warmup_examples(task, long_task, rng, cfg.warmup)
    steps = [len(parse_expr(p.question)[1]) for p in probs]
    n_long = sum(s == 4 for s in steps)
    # each example is long with probability 0.25: 100 expected, sd 8.7
    assert len(probs) == 400 and 70 <= n_long <= 130
    assert all(s in (2, 3) for s in steps[:400 - n_long]) and all(s == 4 for s in steps[400 - n_long:])
    # the task's demonstration errors apply to the long ones too (demo_error_rate 0.5)
    assert 0.3 < sum(p.meta.get("demo_error", False) for p in probs[400 - n_long:]) / n_long < 0.7
    # off: the generator draws exactly what it always did
    off = dataclasses.replace(cfg.warmup, long_share=0.0)
    a = _warmup_examples(task, None, random.Random(3), off)
    b = task.sample_train(random.Random(3), 400)
    assert [p.question for p in a] == [p.question for p in b]


def test_eval_batch_size_default_is_todays_and_set_it_is_another_run():
    """eval.batch_size: 256 (what every evaluation decoded before the knob) is left out of config.yaml, the run id and
    the start evaluation's key; another value enters all three (a sampled evaluation's seeds go by chunk)."""
    cfg = load_config(QS)
    assert cfg.eval.batch_size == 256 and "batch_size" not in cfg.effective_dict()["eval"]
    assert run_id(load_config(QS, ["eval.batch_size=256"])) == run_id(cfg) == "grpo-s0-22f487ed"
    small = load_config(QS, ["eval.batch_size=64"])
    assert run_id(small) != run_id(cfg) and initial_eval_key(small) != initial_eval_key(cfg)
    for bad in ("0", "5000", "1.5"):
        with pytest.raises(ConfigError, match="eval.batch_size"):
            load_config(QS, [f"eval.batch_size={bad}"])


def test_eval_batch_size_reaches_the_evaluations(monkeypatch, tmp_path):
    """Every evaluation point decodes eval.batch_size sequences at once (greedy and sampled passes alike)."""
    from harness.train import evalpoints

    seen = []
    monkeypatch.setattr(evalpoints, "run_evaluation",
                        lambda *a, **kw: seen.append(kw["batch_size"]) or {"eval/arith/seconds": 0.0,
                                                                             "eval/arith/num_problems": 1})
    cfg = load_config(QS, ["eval.batch_size=48", "eval.sample_problems=4"])
    task = type("T", (), {"name": "arith", "eval_problems": lambda self: list(range(10))})()
    evalpoints.evaluate_point(None, None, task, cfg, 0, tmp_path, final=True, seed=0)
    assert seen == [48, 48]


@pytest.mark.parametrize("bad, why", [("-1", "must be >= 0"), ("1.5", "expected an integer"),
                                      ("true", "expected an integer"), ("abc", "expected an integer"),
                                      ("99999999", "must be <= 32768 (glibc's largest mmap threshold)")])
def test_heap_threshold_refuses_what_glibc_cannot_take(bad, why):
    """train.heap_mmap_threshold_kib: a whole number of KiB from 0 (off) to glibc's largest threshold, 32 MiB."""
    with pytest.raises(ConfigError, match=f"train.heap_mmap_threshold_kib.*{re.escape(why)}"):
        load_config(QS, [f"train.heap_mmap_threshold_kib={bad}"])
    assert load_config(QS, ["train.heap_mmap_threshold_kib=64"]).train.heap_mmap_threshold_kib == 64
