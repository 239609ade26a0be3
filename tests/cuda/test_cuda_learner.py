"""The learner and the trainer's stage on CUDA (issue 27.6): a float32 learner step's gradients on the
device equal the CPU's (GRPO and PPO, critic included); a bfloat16 stage (harness.train.stage.build_models
+ run_stage, as the trainer and bench/gpu.py run it) gives a finite loss and finite, non-zero
gradients, with its peak CUDA memory (PerfTracker's per-phase ``torch.cuda.max_memory_allocated``)
at least the weights and under ``STAGE_PEAK_MIB``; PerfTracker's CUDA path measures what a phase
allocates and waits for the GPU's queued work.

Written on a machine without a GPU: run there only with GRPO_HARNESS_CUDA_TESTS_DEVICE=cpu (the
device-agnostic test, CPU against CPU; the others skip), none yet on CUDA.
"""
from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from evals.catalog import get_task
from harness.config.schema import ModelConfig, load_config
from harness.engine.learner import Learner
from harness.engine.models import build_char_tokenizer, build_tiny_model, param_bytes
from harness.engine.perf import PerfTracker
from harness.engine.sampling import sample
from harness.train.stage import build_models, run_stage, stage_problems

pytestmark = pytest.mark.cuda

GRAD_RTOL = 1e-3  # of the largest entry of each parameter's CPU gradient (float32, TF32 off)
# A bfloat16 stage of a 0.8M-parameter model on 16 rows of <= 16 tokens needs a few MiB (weights,
# reference, Adam state, activations) plus cuBLAS / attention workspaces; a leak or a buffer of the
# wrong size (e.g. max_length x vocab per row kept) would pass it.
STAGE_PEAK_MIB = 256
SMALL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
PHASES = {"generate", "score", "reference", "old_logprobs", "policy_forward", "backward", "optimizer"}


def _capture_grads(learner) -> list:
    """Every optimizer step's gradients, as the optimizer sees them (freed right after the step)."""
    out = []
    for opt in (learner.opt, learner.critic_opt):
        if opt is None:
            continue
        step = opt.step

        def wrapped(step=step, opt=opt):
            out.append([p.grad.detach().float().cpu().clone() for g in opt.param_groups for p in g["params"]
                        if p.grad is not None])
            return step()
        opt.step = wrapped
    return out


def _to(ro, device):
    return dataclasses.replace(ro, **{f.name: getattr(ro, f.name).to(device) for f in dataclasses.fields(ro)
                                      if isinstance(getattr(ro, f.name), torch.Tensor)})


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_learner_step_gradients_on_device_match_cpu(algorithm, device):
    tok = build_char_tokenizer()
    policy = build_tiny_model(SMALL, tok, seed=1)
    ro = sample(policy, tok, ["Q:1+2\nA:", "Q:3*4-1\nA:"], n=4, max_new_tokens=10, seed=3)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    runs = []
    for dev in (torch.device("cpu"), device):
        cfg = load_config(None, [f"algorithm.name={algorithm}", "train.micro_batch_size=3", "train.max_grad_norm=0",
                                 "sampling.max_new_tokens=10", "sampling.samples_per_prompt=4"])
        models = build_models(copy.deepcopy(policy).to(dev), cfg.algo, dev)
        learner = Learner(models.policy, cfg.algo, cfg, dev, PerfTracker(dev), reference=models.reference,
                          critic=models.critic)
        grads = _capture_grads(learner)
        torch.manual_seed(0)
        runs.append((grads, learner.step(_to(ro, dev), rewards, [], 0)))
    (g_cpu, m_cpu), (g_dev, m_dev) = runs
    assert len(g_cpu) == len(g_dev) == (2 if algorithm == "ppo" else 1)  # policy (and critic) steps
    for step_cpu, step_dev in zip(g_cpu, g_dev):
        assert max(g.abs().max().item() for g in step_cpu) > 1e-5
        for a, b in zip(step_dev, step_cpu):
            assert (a - b).abs().max().item() <= GRAD_RTOL * b.abs().max().item() + 1e-8
    assert math.isclose(m_dev["train/loss"], m_cpu["train/loss"], rel_tol=1e-4, abs_tol=1e-6)


def _alternating(task, problems_rep, rollouts, prm=None):
    """Rewards 1, 0, 1, 0, ... within every group: a learning signal whatever the untrained model writes."""
    return torch.tensor([float(i % 2) for i in range(rollouts.num_sequences)]), []


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_bf16_stage_on_cuda_has_finite_loss_and_gradients_and_bounded_peak_memory(algorithm, cuda_only):
    dev = cuda_only
    cfg = load_config(None, ["device=cuda", "model.dtype=bfloat16", f"algorithm.name={algorithm}",
                             "sampling.samples_per_prompt=4", "train.prompts_per_step=4", "sampling.max_new_tokens=16",
                             "train.micro_batch_size=8", "sampling.temperature=0.8"])
    tok = build_char_tokenizer()
    policy = build_tiny_model(cfg.model, tok, seed=1).to(dev, torch.bfloat16)
    models = build_models(policy, cfg.algo, dev)
    perf = PerfTracker(dev)
    learner = Learner(models.policy, cfg.algo, cfg, dev, perf, reference=models.reference, critic=models.critic)
    grads = _capture_grads(learner)
    task = get_task(cfg.task)
    task.bind_tokenizer(tok)  # (returns None for the built-in tasks)
    st = run_stage(learner, cfg, task, tok, 0, stage_problems(task, cfg.seed, 0, cfg.train.prompts_per_step),
                   _alternating, perf=perf)
    assert st.rollouts.completion_ids.device.type == "cuda" and st.rollouts.num_tokens > 0
    assert math.isfinite(st.metrics["train/loss"]) and math.isfinite(st.metrics["train/grad_norm"])
    assert st.metrics["train/grad_norm"] > 0
    assert all(p.dtype == torch.bfloat16 for p in learner.policy.parameters())
    assert grads and all(torch.isfinite(g).all() for step in grads for g in step)
    assert max(g.abs().max().item() for g in grads[0]) > 0
    phases = PHASES | ({"critic_forward", "critic_backward", "critic_optimizer"} if algorithm == "ppo" else set())
    assert phases <= set(perf.peak_cuda), sorted(perf.peak_cuda)
    weights_mib = param_bytes(learner.policy) / 2**20
    for name in phases:  # the weights are on the GPU through every phase
        assert perf.peak_cuda[name] >= weights_mib, (name, perf.peak_cuda[name], weights_mib)
    peak = max(perf.peak_cuda.values())
    assert peak < STAGE_PEAK_MIB, dict(perf.peak_cuda)
    assert perf.summary()["perf/peak_cuda_mb"] == peak


def test_perf_tracker_cuda_phases_measure_allocations_and_wait_for_the_gpu(cuda_only):
    dev = cuda_only
    perf = PerfTracker(dev)
    assert perf.cuda
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_allocated(dev) / 2**20
    with perf.phase("alloc"):
        x = torch.ones(64 * 2**20, dtype=torch.uint8, device=dev)
        del x  # freed inside the phase: its peak still holds it
    with perf.phase("idle"):
        pass
    assert perf.peak_cuda["alloc"] >= before + 64
    assert perf.peak_cuda["idle"] <= before + 1  # peaks are reset at each phase's start
    if hasattr(torch.cuda, "_sleep"):
        with perf.phase("sleep"):
            torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time at 2 GHz, queued: the phase synchronises
        assert perf.seconds["sleep"] > 0.01
    s = perf.summary()
    assert s["perf/peak_cuda_mb"] == max(perf.peak_cuda.values()) and s["perf/peak_cuda_mb/alloc"] >= 64
