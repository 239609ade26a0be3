"""Off-policy machinery on the device (issue 46 items 3 and 6): the pipelined sampler (harness.train.pipeline)
hands the learner the behaviour policy's log-probs (a bfloat16 sampler copy; vLLM's engine where it imports), and a
learner step keeps them apart from its own, corrects for them and logs the mismatch (offpolicy/*).

Written on a machine without a GPU: the bfloat16 test has run there only with GRPO_HARNESS_CUDA_TESTS_DEVICE=cpu;
the vLLM test (skipped where vllm does not import) has never run: the first GPU run (``python bench/gpu.py
--all``, its ``tests`` stage) is where it does. Bounds: a float32 engine's log-probs within ``VLLM_F32_MEAN`` of
the learner's on average (other kernels, same precision); a bfloat16 sampler's mean |delta log p| above
``BF16_FLOOR`` (there is a mismatch to correct) and below ``BF16_MEAN`` (test_cuda_engine.py's bound).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from algorithms.presets import resolve
from evals.catalog import get_task
from harness.config.schema import load_config
from harness.engine import sampling, vllm_sampler
from harness.engine.learner import Learner, make_batch, token_logprobs
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.perf import PerfTracker
from harness.train.pipeline import Pipeline

pytestmark = pytest.mark.cuda

VLLM_F32_MEAN = 1e-2
BF16_FLOOR, BF16_MEAN = 1e-5, 1e-2
SETS = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.intermediate_size=128",
        "sampling.max_new_tokens=16", "train.prompts_per_step=4", "sampling.samples_per_prompt=4", "task.min_ops=1",
        "task.max_ops=2", "algorithm.correction=token_tis", "train.micro_batch_size=16"]


def _draw(cfg, device):
    """Stage 0 drawn by a pipeline on ``device``: (policy, rollouts, rewards)."""
    tok = build_char_tokenizer()
    task = get_task(cfg.task)
    task.bind_tokenizer(tok)
    policy = build_tiny_model(cfg.model, tok, seed=1).to(device)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0] * cfg.train.prompts_per_step)
    pipe = Pipeline(cfg, task, tok, policy, lambda t, reps, ro, prm: (rewards, []))
    try:
        pipe.start(0, policy, 0)
        ro = pipe.take(0).draw.rollouts
    finally:
        pipe.close()
    return policy, ro, rewards


def _step_mismatch(cfg, policy, ro, rewards, device) -> tuple[float, dict]:
    mask = ro.completion_mask.to(device).bool()
    with torch.no_grad():
        gap = (token_logprobs(policy, make_batch(ro, device)) - ro.logprobs.to(device))[mask]
    m = Learner(policy, resolve(cfg.algorithm), cfg, device, PerfTracker(device)).step(ro, rewards, [], 0, staleness=0)
    return gap.abs().mean().item(), m


def test_bf16_sampler_behaviour_logprobs_on_device(device, tmp_path):
    cfg = load_config(None, SETS + ["sampling.dtype=bfloat16", f"output_dir={tmp_path}",
                                    f"device={device.type}"])
    policy, ro, rewards = _draw(cfg, device)
    gap, m = _step_mismatch(cfg, policy, ro, rewards, device)
    print(f"bf16 sampler vs float32 learner on {device}: mean |dlogp| {gap:.3g}, KL {m['offpolicy/mismatch_kl']:.3g}")
    assert BF16_FLOOR < gap < BF16_MEAN
    assert m["offpolicy/logp_abs_diff"] == pytest.approx(gap, rel=1e-3)


def test_vllm_engine_behaviour_logprobs_through_the_pipeline(cuda_only, tmp_path):
    if not vllm_sampler.available():
        pytest.skip(vllm_sampler.unavailable_reason())
    cfg = load_config(None, SETS + ["train.staleness=1", f"output_dir={tmp_path}", "device=cuda"])
    cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, backend="vllm"))
    assert sampling.get_sampler("vllm") is sampling.sample_vllm
    policy, ro, rewards = _draw(cfg, cuda_only)
    gap, m = _step_mismatch(cfg, policy, ro, rewards, cuda_only)
    print(f"vLLM {getattr(vllm_sampler.vllm, '__version__', '?')} float32 engine vs learner: mean |dlogp| {gap:.3g}, "
          f"KL {m['offpolicy/mismatch_kl']:.3g}, ratio p90 {m['offpolicy/ratio_p90']:.4f}")
    assert gap < VLLM_F32_MEAN
    assert m["offpolicy/logp_abs_diff"] == pytest.approx(gap, rel=1e-3)
    assert all(m[k] == m[k] for k in m)  # finite metrics (no NaN)
