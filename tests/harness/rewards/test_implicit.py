"""PRIME's implicit PRM on the tiny model: token rewards are beta * log(pi_rm / pi_ref) read before the update,
the update is the cross-entropy of sigmoid(beta * sum) on the outcome labels (against an independent forward),
and the outcome logits move toward the labels."""
import copy

import pytest
import torch

from harness.config.schema import ModelConfig
from harness.engine.learner import make_batch
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.sampling import sample
from harness.rewards.implicit import ImplicitPRM

TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def rollouts(tok, policy):
    return sample(policy, tok, ["Q:1+2\nA:", "Q:3*4\nA:"], n=2, max_new_tokens=6, seed=5)


def seq_logps(model, ro, i):
    """log pi(y_t | prompt, y_<t), one unpadded sequence through the plain transformers forward."""
    p = ro.prompt_ids[i][ro.prompt_mask[i].bool()].tolist()
    c = ro.completion_ids[i][ro.completion_mask[i].bool()].tolist()
    logits = model(input_ids=torch.tensor([p + c])).logits[0].float()
    return torch.log_softmax(logits[len(p) - 1:len(p) + len(c) - 1], -1).gather(-1, torch.tensor(c)[:, None])[:, 0]


def test_rewards_are_zero_at_the_start_and_the_update_is_prime_cross_entropy():
    tok = build_char_tokenizer()
    policy = build_tiny_model(TINY, tok, seed=1)
    prm = ImplicitPRM(policy, beta=0.5, lr=1e-2, micro_batch_size=3, device="cpu")
    ro = rollouts(tok, policy)
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])
    start = copy.deepcopy(prm.model)
    rewards, m = prm.score_and_update(ro, labels)
    assert rewards.abs().max().item() < 1e-6  # pi_rm = pi_ref before the first update
    assert m["train/prm_loss"] == pytest.approx(torch.log(torch.tensor(2.0)).item(), abs=1e-5)  # sigmoid(0) = 1/2
    assert any(not torch.equal(a, b) for a, b in zip(start.parameters(), prm.model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(prm.ref.parameters(), policy.parameters()))  # the reference stays
    # second batch: rewards are beta * (log pi_rm - log pi_ref), from the model before this update
    before = copy.deepcopy(prm.model)
    rewards2, m2 = prm.score_and_update(ro, labels)
    mask = ro.completion_mask
    for i in range(4):
        L = int(mask[i].sum())
        want = 0.5 * (seq_logps(before, ro, i) - seq_logps(policy, ro, i))
        assert rewards2[i, :L].tolist() == pytest.approx(want.tolist(), abs=1e-5)
        assert rewards2[i, L:].abs().sum() == 0
    z = torch.stack([0.5 * (seq_logps(before, ro, i) - seq_logps(policy, ro, i)).sum() for i in range(4)])
    want_loss = torch.nn.functional.binary_cross_entropy_with_logits(z, labels).item()
    assert m2["train/prm_loss"] == pytest.approx(want_loss, abs=1e-5)
    assert m2["train/prm_acc"] == pytest.approx(float(((z > 0) == (labels > 0.5)).float().mean()))
    steps = ImplicitPRM.as_steps(rewards2, mask)
    assert [len(s) for s in steps] == mask.sum(1).tolist() and steps[0][0] == (rewards2[0, 0].item(), 0)


def test_updates_move_the_outcome_logits_toward_the_labels():
    tok = build_char_tokenizer()
    policy = build_tiny_model(TINY, tok, seed=2)
    prm = ImplicitPRM(policy, beta=0.5, lr=3e-3, micro_batch_size=4, device="cpu")
    ro = rollouts(tok, policy)
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0])
    losses = [prm.score_and_update(ro, labels)[1]["train/prm_loss"] for _ in range(8)]
    assert losses[-1] < losses[0] - 0.05
    state = prm.state_dict()
    other = ImplicitPRM(policy, beta=0.5, lr=3e-3, micro_batch_size=4, device="cpu")
    other.load_state_dict(state)
    assert other.updates == 8
    b = make_batch(ro, "cpu")
    assert all(torch.equal(x, y) for x, y in zip(other.model.parameters(), prm.model.parameters())) and b.T > 0
