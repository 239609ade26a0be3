"""Step labels of a learned PRM from the exact checker, the batched scoring of a tagged reward model, and the
reward-model spec file."""
import json

import pytest
import torch

from evals.arith import ArithTask
from evals.prm import (CausalLMPRM, read_spec, spec_kwargs, split_steps, step_labels, tag_margins, whole_completion)
from evals.tasks import StepReward
from harness.config.schema import ModelConfig
from harness.engine.models import build_char_tokenizer, build_tiny_model


def labels_of(completion, expr="3+4*2-5", finished=True):
    task = ArithTask()
    p = task.make_problem(expr)
    return step_labels(split_steps(completion), task.step_rewards(completion, p, finished))


def test_step_labels_from_the_arith_checker_by_hand():
    # every step right, and the final answer after a full reduction
    assert labels_of("4*2=8;3+8=11;11-5=6;#6") == [1, 1, 1, 1]
    # a wrong value: that step is 0; later steps are judged on what was written (carried forward)
    assert labels_of("4*2=8;3+8=12;12-5=7;#7") == [1, 0, 1, 0]
    # two reductions skipped: the checker's two zero steps and the final 0 fall inside "#6"
    assert labels_of("4*2=8;#6") == [1, 0]
    assert labels_of("#6") == [0]  # a bare answer
    assert labels_of("4*2=8;3+8=11;11-", finished=False) == [1, 1, 0]  # truncated
    # text after the final answer is one more (wrong) step
    assert labels_of("2*3=6;#6;x", expr="2*3") == [1, 0, 0]


def test_step_labels_fold_late_rewards_and_fill_steps_without_one():
    steps = [("a", 2), ("b", 5)]
    exact = [StepReward(1.0, 2), StepReward(1.0, 7), StepReward(0.0, 9)]  # the last two end after the last step
    assert step_labels(steps, exact) == [1.0, 0.0]
    # an outcome-only checker (one reward at the end): every step takes the next reward
    assert step_labels(steps, [StepReward(1.0, 5)]) == [1.0, 1.0]
    assert step_labels([("", 0)], []) == [0.0]


def test_batched_scores_equal_one_at_a_time():
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, seed=3)
    prm = CausalLMPRM(model, tok, step_tag="@")
    task = ArithTask()
    probs = [task.make_problem(e) for e in ("3+4*2-5", "2*3", "1+1")]
    comps, fin = ["4*2=8;3+8=11;11-5=6;#6", "#6", "1+1=2;#2"], [True, False, True]
    batched = prm.score_batch(comps, probs, fin, micro_batch_size=2)  # right-padded rows of different lengths
    for c, p, f, b in zip(comps, probs, fin, batched):
        one = prm.step_rewards(c, p, f)
        assert [s.end for s in one] == [s.end for s in b]
        assert [s.reward for s in one] == pytest.approx([s.reward for s in b], abs=1e-5)
    assert batched[1][-1].reward == 0.0  # truncated: no credit for its last step
    ids, pos, steps = prm.encode("1+1=2;#2", probs[2])
    assert tok.decode(ids, skip_special_tokens=True) == "1+1\n1+1=2@#2@" and [ids[i] for i in pos] == [prm.tag_ids[0]] * 2
    # margins are differentiable (training uses the same positions)
    m = tag_margins(model, [ids], [pos], prm.good, prm.bad)
    m.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_orm_reads_one_tag_after_the_completion_and_the_spec_file(tmp_path):
    assert whole_completion("4*2=8;#8") == [("4*2=8;#8", 8)]
    (tmp_path / "reward_model.json").write_text(json.dumps(
        {"kind": "orm", "good_token": "+", "bad_token": "-", "step_tag": "@", "splitter": "whole"}))
    spec = read_spec(tmp_path)
    assert spec_kwargs(spec)["splitter"] is whole_completion and spec_kwargs(None) == {}
    assert read_spec(tmp_path / "none") is None
    (tmp_path / "reward_model.json").write_text("[1]")
    with pytest.raises(ValueError, match="not a reward-model spec"):
        read_spec(tmp_path)
    tok = build_char_tokenizer()
    orm = CausalLMPRM(build_tiny_model(ModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32),
                                       tok), tok, **spec_kwargs(spec))
    out = orm.step_rewards("4*2=8;#8", ArithTask().make_problem("4*2"))
    assert len(out) == 1 and out[0].end == 8 and 0.0 < out[0].reward < 1.0
    assert torch.is_tensor(tag_margins(orm.model, [[1, 2, 3]], [[2]], orm.good, orm.bad))
