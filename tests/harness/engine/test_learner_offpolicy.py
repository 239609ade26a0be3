"""The learner keeps the behaviour policy (the sampler's log-probs) apart from the proximal one (its own at the
weights the update starts from) for off-policy rollouts (issue 46 item 2), and its offpolicy/* metrics say what
it measured. The rollouts' log-probs are lowered by DELTA on every token, as a sampler that disagrees with the
learner by a known amount: rho_t = pi_prox / pi_behav = e^DELTA on every token, up to float rounding."""
import math

import pytest
import torch

from algorithms.presets import resolve
from harness.config.schema import ModelConfig, load_config
from harness.engine.learner import Learner
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.perf import PerfTracker
from harness.engine.sampling import sample

SMALL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
DELTA = 0.3


def _step(sets, staleness):
    tok = build_char_tokenizer()
    policy = build_tiny_model(SMALL, tok, seed=1)
    cfg = load_config(None, sets)
    ro = sample(policy, tok, ["Q:1+2\nA:", "Q:3*4-1\nA:"], n=4, max_new_tokens=10, seed=3)
    ro.logprobs = (ro.logprobs - DELTA) * ro.completion_mask
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    return Learner(policy, resolve(cfg.algorithm), cfg, "cpu", PerfTracker()).step(ro, rewards, [], 0,
                                                                                   staleness=staleness)


@pytest.mark.parametrize("epochs", [1, 2], ids=["one step: the update's own forward", "two: a no-grad forward"])
def test_proximal_log_probs_are_the_learners_not_the_samplers(epochs):
    m = _step([f"train.inner_epochs={epochs}", "algorithm.correction=token_tis", "algorithm.correction_cap=1.2"], 1)
    assert m["offpolicy/staleness"] == 1
    assert m["offpolicy/logp_abs_diff"] == pytest.approx(DELTA, abs=1e-5)
    assert m["offpolicy/mismatch_kl"] == pytest.approx(math.exp(DELTA) - 1 - DELTA, abs=1e-5)
    for q in ("p10", "p50", "p90"):
        assert m[f"offpolicy/ratio_{q}"] == pytest.approx(math.exp(DELTA), abs=1e-4)
    assert m["offpolicy/truncated_frac"] == 1.0 and m["offpolicy/masked_frac"] == 0.0  # e^0.3 = 1.35 > C = 1.2
    masked = _step([f"train.inner_epochs={epochs}", "algorithm.correction=seq_mask", "algorithm.correction_cap=1.2"],
                   1)
    assert masked["offpolicy/masked_frac"] == 1.0 and masked["offpolicy/truncated_frac"] == 0.0


def test_on_policy_rows_carry_no_offpolicy_metrics():
    assert not any(k.startswith("offpolicy/") for k in _step([], None))
    row = _step(["algorithm.correction=token_mask", "algorithm.correction_cap=1.2"], None)  # a correction alone measures what it corrects
    assert row["offpolicy/masked_frac"] == 1.0 and "offpolicy/staleness" not in row
