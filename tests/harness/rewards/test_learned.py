"""Learned ORM / PRM on the tiny model: labels at their tags, training that moves the weights and the loss,
held-out quality against brute-force AUC, saving and loading (also as algorithm.prm)."""
import pytest
import torch

from evals.arith import ArithTask
from evals.prm import CausalLMPRM
from harness.config.schema import ModelConfig
from harness.engine.models import build_char_tokenizer, build_tiny_model, load_prm
from harness.rewards.data import label_exact
from harness.rewards.learned import TaggedRM, choose_tag

TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
COMPS = ["4*2=8;3+8=11;11-5=6;#6", "#6", "4*2=8;#6", "4*2=8;3+8=12;12-5=7;#7"]


def examples():
    task = ArithTask()
    p = task.make_problem("3+4*2-5")
    return label_exact(task, [p] * 4, COMPS, [True] * 4, with_steps=True)


def test_tags_and_targets():
    tok = build_char_tokenizer()
    assert choose_tag(tok) == "@"  # the character tokenizer has no Cyrillic: Math-Shepherd's " ки" is unknown
    prm = TaggedRM.from_policy(build_tiny_model(TINY, tok), tok, "prm")
    orm = TaggedRM.from_policy(build_tiny_model(TINY, tok), tok, "orm")
    ex = examples()
    assert [prm.targets(e)[2] for e in ex] == [[1, 1, 1, 1], [0], [1, 0], [1, 0, 1, 0]]
    assert [orm.targets(e)[2] for e in ex] == [[1.0], [0.0], [1.0], [0.0]]  # "4*2=8;#6" is a right outcome
    ids, pos, _ = orm.targets(ex[0])
    assert pos == [len(ids) - 1]
    with pytest.raises(ValueError, match="kind"):
        TaggedRM.from_policy(build_tiny_model(TINY, tok), tok, "implicit")


def test_fit_changes_the_weights_lowers_the_loss_and_is_seeded():
    tok = build_char_tokenizer()
    policy = build_tiny_model(TINY, tok, seed=1)
    a = TaggedRM.from_policy(policy, tok, "prm", lr=3e-3, micro_batch_size=2)
    before = [p.detach().clone() for p in a.model.parameters()]
    first = a.fit(examples(), epochs=1, seed=0)
    later = a.fit(examples(), epochs=20, seed=0)
    assert first["steps"] == 2 and later["steps"] == 40 and first["tags"] == 11  # 4 + 1 + 2 + 4 tags
    assert later["loss"] < first["loss"]
    assert any(not torch.equal(x, p) for x, p in zip(before, a.model.parameters()))
    assert all(torch.equal(x, p) for x, p in zip(before, policy.parameters()))  # the policy is not touched
    b = TaggedRM.from_policy(policy, tok, "prm", lr=3e-3, micro_batch_size=2)
    b.fit(examples(), epochs=1, seed=0)
    b.fit(examples(), epochs=20, seed=0)
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    q = a.quality(examples())
    assert q["steps"]["n"] == 11 and q["steps"]["positives"] == 7 and q["outcome"]["positives"] == 2
    assert q["steps"]["auc"] > 0.9  # it has fitted these 11 tags


def test_quality_auc_matches_its_scores():
    tok = build_char_tokenizer()
    rm = TaggedRM.from_policy(build_tiny_model(TINY, tok, seed=2), tok, "prm")
    ex = examples()
    probs = [torch.sigmoid(m).tolist() for m in rm.margins(ex)]
    flat = [x for p in probs for x in p]
    labels = [y for e in ex for y in rm.targets(e)[2]]
    pos = [s for s, y in zip(flat, labels) if y >= 0.5]
    neg = [s for s, y in zip(flat, labels) if y < 0.5]
    brute = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg) / (len(pos) * len(neg))
    assert rm.quality(ex)["steps"]["auc"] == pytest.approx(brute)
    # the outcome score of a PRM is its lowest step score (Math-Shepherd's verification rule)
    assert rm.quality(ex)["outcome"]["n"] == 4


def test_save_load_and_use_as_algorithm_prm(tmp_path):
    tok = build_char_tokenizer()
    rm = TaggedRM.from_policy(build_tiny_model(TINY, tok, seed=4), tok, "prm", lr=3e-3)
    rm.fit(examples(), epochs=3)
    rm.save(tmp_path / "rm", {"cost": {"samples": 4, "tokens": 60, "seconds": 1.5}})
    back = TaggedRM.load(tmp_path / "rm")
    assert back.kind == "prm" and back.spec["cost"]["samples"] == 4
    p = ArithTask().make_problem("3+4*2-5")
    want = rm.score_batch(COMPS, [p] * 4, [True] * 4)
    got = back.score_batch(COMPS, [p] * 4, [True] * 4)
    for x, y in zip(got, want):
        assert [s.reward for s in x] == pytest.approx([s.reward for s in y], abs=1e-6)
    frozen = load_prm(str(tmp_path / "rm"), ArithTask())  # algorithm.prm=<folder>: its tags from reward_model.json
    assert isinstance(frozen, CausalLMPRM) and frozen.step_tag == "@"
    assert [s.reward for s in frozen.step_rewards(COMPS[0], p)] == pytest.approx([s.reward for s in want[0]], abs=1e-6)
    orm = TaggedRM.from_policy(build_tiny_model(TINY, tok), tok, "orm")
    orm.save(tmp_path / "orm")
    with pytest.raises(Exception, match="outcome reward model"):
        load_prm(str(tmp_path / "orm"), ArithTask())
    with pytest.raises(FileNotFoundError, match="reward_model.json"):
        TaggedRM.load(tmp_path / "missing")
