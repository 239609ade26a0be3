"""One training stage, shared by the training loop and the benchmarks: the models an algorithm trains, a stage's seed and prompts, sample -> score -> learn.

The trainer (:func:`harness.train.loop._stage`) and every bench script that times a step call
:func:`build_models` and :func:`run_stage`, so what a benchmark measures is the trainer's stage:

    algo = cfg.algo                                          # the resolved algorithm, built on loading
    models = build_models(policy, algo, device)             # + reference, + critic, as algo says
    learner = Learner(models.policy, algo, cfg, device, perf, reference=models.reference,
                      critic=models.critic)
    for k in range(steps):
        st = run_stage(learner, cfg, task, tok, k, stage_problems(task, cfg.seed, k, n), score, perf=perf)

The loop adds what only a run needs around it: the budget cut and the shard of each stage's
prompts, the non-finite check, the reference reset and the metrics row.
"""
from __future__ import annotations

import contextlib
import copy
import random
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from harness.engine.learner import ValueModel
from harness.engine.lora import AdapterOffView, is_lora, shared_base_copy
from harness.engine.sampling import Rollouts, sample

RANK_SEED_STRIDE = 1_000_000_007  # rank r samples stage k with stage_seed(seed, k) + r * stride


def stage_seed(seed: int, step: int) -> int:
    """The seed of stage ``step`` of a run seeded ``seed``: its prompts, its sampling and the
    learner's torch RNG are functions of (seed, step) alone, so a resumed run replays them."""
    return (seed * 1_000_003 + step * 7919 + 17) % (2**31 - 1)


def stage_problems(task, seed: int, step: int, n: int) -> list:
    """The ``n`` training problems of stage ``step`` (the trainer's draw; every contender of a
    benchmark gets the same ones)."""
    return task.sample_train(random.Random(stage_seed(seed, step)), n)


@dataclass
class Models:
    """The models an algorithm trains with (None where it has none)."""
    policy: Any
    reference: Any = None  # a frozen copy of the starting policy (LoRA: the policy, adapters off): the KL anchor
    critic: Any = None  # a value model: a copy of the policy's backbone with a scalar head


def build_models(policy, algo, device, *, load_copy: Optional[Callable[[], Any]] = None) -> Models:
    """``policy`` with the reference (``algo.uses_reference``) and the critic (``algo.critic``) the
    algorithm needs, both starting from the policy's weights. ``load_copy``: a function that loads
    another instance of the starting policy; given (ZeRO-3: partitioned parameters cannot be
    deep-copied), the reference and the critic's backbone are loaded with it instead of copied.
    A LoRA policy (:func:`harness.engine.lora.apply_lora`) keeps one copy of the frozen base: the
    reference is the policy with its adapters off (:class:`~harness.engine.lora.AdapterOffView`) and the
    critic's backbone shares the base's weights, with adapters of its own."""
    if is_lora(policy):
        if load_copy is not None:
            raise ValueError("LoRA (model.lora.rank > 0) is single-process only for now")
        reference = AdapterOffView(policy) if algo.uses_reference else None
        critic = ValueModel(shared_base_copy(policy), copy_backbone=False).to(device) if algo.critic else None
    elif load_copy is not None:
        reference = load_copy() if algo.uses_reference else None
        critic = ValueModel(load_copy(), copy_backbone=False).to(device) if algo.critic else None
    else:
        reference = copy.deepcopy(policy).eval().requires_grad_(False) if algo.uses_reference else None
        critic = ValueModel(policy).to(device) if algo.critic else None
    return Models(policy, reference, critic)


@dataclass
class Stage:
    """What one stage produced."""
    rollouts: Rollouts
    problems_rep: list  # the problem of every sequence (each prompt's repeated G times)
    rewards: torch.Tensor  # [B] outcome rewards
    step_rewards: list  # per sequence, (step reward, token index) pairs (with a process reward model)
    metrics: dict  # the learner's train/* metrics


def run_stage(learner, cfg, task, tok, k: int, problems: list, score: Callable, *, perf, dist=None, prm=None,
              valid: Optional[torch.Tensor] = None, progress: float = 0.0, sampler_tok=None) -> Stage:
    """Stage ``k``: sample ``cfg.sampling.samples_per_prompt`` completions of every problem (phase
    ``generate``; under several processes with the gathered weights and a rank-dependent seed),
    score them with ``score(task, problems_rep, rollouts, prm) -> (rewards, step_rewards)`` (phase
    ``score``), then one learner step seeded by the stage, with ``progress`` the fraction of the
    budget consumed before it. ``valid``: the shard's real (unpadded) rows. ``sampler_tok``: the
    tokenizer the sampler sees (benchmarks force full-length rows with one whose EOS is no token)."""
    G, sc = cfg.sampling.samples_per_prompt, cfg.sampling
    rank = dist.rank if dist is not None else 0
    with perf.phase("generate"):
        with (dist.gathered(learner.policy) if dist is not None else contextlib.nullcontext(learner.policy)) as m:
            ro = sample(m, tok if sampler_tok is None else sampler_tok, [task.format_prompt(p) for p in problems], n=G,
                        max_new_tokens=sc.max_new_tokens, temperature=sc.temperature, top_p=sc.top_p,
                        seed=stage_seed(cfg.seed, k) + RANK_SEED_STRIDE * rank, offsets=prm is not None,
                        backend=sc.backend)
    reps = [p for p in problems for _ in range(G)]
    with perf.phase("score"):
        rewards, step_rewards = score(task, reps, ro, prm)
    torch.manual_seed(stage_seed(cfg.seed, k))
    metrics = learner.step(ro, rewards, step_rewards, k, valid=valid, progress=progress)
    return Stage(ro, reps, rewards, step_rewards, metrics)
