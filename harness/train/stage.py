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

With ``algorithm.drop_zero_variance`` a stage is DAPO's dynamic sampling (arXiv 2503.14476 §3.2): the
groups whose rewards are all equal are dropped and further prompts drawn (:func:`run_stage`);
:func:`take_groups` and :func:`cat_rollouts` put the kept groups of several draws into one batch, and
the :class:`Stage` keeps every draw (``drawn``), which the budget is charged with.
"""
from __future__ import annotations

import contextlib
import copy
import math
import random
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from algorithms.filters import informative_groups
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
class Draw:
    """Samples one stage drew: rollouts, each sequence's problem, outcome and process rewards."""
    rollouts: Rollouts
    problems_rep: list
    rewards: torch.Tensor
    step_rewards: list

    @property
    def samples(self) -> int:
        return self.rollouts.num_sequences


@dataclass
class Stage:
    """What one stage produced: what the learner trained on, and everything drawn (``drawn``: the
    same, unless groups were dropped; the budget is charged with it)."""
    rollouts: Rollouts
    problems_rep: list  # the problem of every sequence (each prompt's repeated G times)
    rewards: torch.Tensor  # [B] outcome rewards
    step_rewards: list  # per sequence, (step reward, token index) pairs (with a process reward model)
    metrics: dict  # the learner's train/* metrics
    drawn: Optional[Draw] = None

    @property
    def used(self) -> Draw:
        return Draw(self.rollouts, self.problems_rep, self.rewards, self.step_rewards)

    @property
    def all_drawn(self) -> Draw:
        return self.drawn if self.drawn is not None else self.used


def take_groups(ro: Rollouts, groups: list[int]) -> Rollouts:
    """The rows of ``groups`` (indices of groups of ``ro.n`` consecutive rows), in that order."""
    rows = [g * ro.n + j for g in groups for j in range(ro.n)]
    idx = torch.tensor(rows, dtype=torch.long)
    pick = lambda xs: [xs[i] for i in rows]  # noqa: E731
    return replace(ro, prompts=pick(ro.prompts), completions=pick(ro.completions), finished=pick(ro.finished),
                   prompt_ids=ro.prompt_ids[idx], prompt_mask=ro.prompt_mask[idx],
                   completion_ids=ro.completion_ids[idx], completion_mask=ro.completion_mask[idx],
                   logprobs=ro.logprobs[idx], token_offsets=pick(ro.token_offsets) if ro.token_offsets else [])


def cat_rollouts(parts: list[Rollouts], pad_id: int) -> Rollouts:
    """``parts`` (the same group size) as one Rollouts: prompts left-padded with ``pad_id`` (mask 0) and
    completions right-padded (mask 0, log-prob 0) to the widest. One part: itself."""
    if len(parts) == 1:
        return parts[0]
    P = max(p.prompt_ids.shape[1] for p in parts)
    T = max(p.completion_ids.shape[1] for p in parts)
    left = lambda x, v: F.pad(x, (P - x.shape[1], 0), value=v)  # noqa: E731
    right = lambda x, v: F.pad(x, (0, T - x.shape[1]), value=v)  # noqa: E731
    offsets = [o for p in parts for o in p.token_offsets] if all(p.token_offsets for p in parts) else []
    return Rollouts(prompts=[x for p in parts for x in p.prompts], completions=[x for p in parts for x in p.completions],
                    finished=[x for p in parts for x in p.finished],
                    prompt_ids=torch.cat([left(p.prompt_ids, pad_id) for p in parts]),
                    prompt_mask=torch.cat([left(p.prompt_mask, 0) for p in parts]),
                    completion_ids=torch.cat([right(p.completion_ids, pad_id) for p in parts]),
                    completion_mask=torch.cat([right(p.completion_mask, 0) for p in parts]),
                    logprobs=torch.cat([right(p.logprobs, 0.0) for p in parts]), n=parts[0].n,
                    token_offsets=offsets)


def stage_prompt_count(cfg, samples_before: int) -> int:
    """Prompts of a stage that starts with ``samples_before`` samples drawn: ``train.prompts_per_step``; with a
    samples budget cut to land exactly on it (at least 1)."""
    G, P = cfg.sampling.samples_per_prompt, cfg.train.prompts_per_step
    if cfg.budget.unit != "samples":
        return P
    return max(1, min(P, math.ceil((cfg.budget.amount - samples_before) / G)))


RESAMPLE_SEED_STRIDE = 7_368_787  # draw r > 0 of stage k: prompts and sampling seeded stage_seed(seed, k) + r * stride


def resample_problems(task, seed: int, step: int, draw: int, n: int) -> list:
    """The ``n`` training problems of draw ``draw`` (> 0) of stage ``step``: dynamic sampling's further
    prompts, a function of (seed, step, draw) so a resumed run replays them."""
    return task.sample_train(random.Random(stage_seed(seed, step) + RESAMPLE_SEED_STRIDE * draw), n)


def _draw(learner, cfg, task, tok, k: int, r: int, problems: list, score: Callable, perf, dist, prm,
          sampler_tok) -> Draw:
    """Draw ``r`` of stage ``k``: sample ``cfg.sampling.samples_per_prompt`` completions of every problem
    (phase ``generate``; under several processes with the gathered weights and a rank-dependent seed)
    and score them (phase ``score``)."""
    G, sc = cfg.sampling.samples_per_prompt, cfg.sampling
    rank = dist.rank if dist is not None else 0
    with perf.phase("generate"):
        with (dist.gathered(learner.policy) if dist is not None else contextlib.nullcontext(learner.policy)) as m:
            ro = sample(m, tok if sampler_tok is None else sampler_tok, [task.format_prompt(p) for p in problems], n=G,
                        max_new_tokens=sc.max_new_tokens, temperature=sc.temperature, top_p=sc.top_p,
                        seed=stage_seed(cfg.seed, k) + RANK_SEED_STRIDE * rank + RESAMPLE_SEED_STRIDE * r,
                        offsets=prm is not None, backend=sc.backend)
    reps = [p for p in problems for _ in range(G)]
    with perf.phase("score"):
        rewards, step_rewards = score(task, reps, ro, prm)
    return Draw(ro, reps, rewards, step_rewards)


def run_stage(learner, cfg, task, tok, k: int, problems: list, score: Callable, *, perf, dist=None, prm=None,
              valid: Optional[torch.Tensor] = None, progress: float = 0.0, sampler_tok=None,
              more_prompts: Optional[Callable[[int, int], int]] = None, drawn: Optional[Draw] = None,
              staleness: Optional[int] = None) -> Stage:
    """Stage ``k``: draw and score ``problems`` (:func:`_draw`), then one learner step seeded by the
    stage, with ``progress`` the fraction of the budget consumed before it. ``valid``: the shard's
    real (unpadded) rows. ``sampler_tok``: the tokenizer the sampler sees (benchmarks force
    full-length rows with one whose EOS is no token).

    With ``algorithm.drop_zero_variance`` the groups whose rewards are all equal are dropped and, up
    to ``algorithm.max_resample`` times, further prompts drawn (:func:`resample_problems`) until the
    stage holds ``len(problems)`` informative groups (DAPO's dynamic sampling; the first ones found
    are kept, extra ones dropped). ``more_prompts(draw, samples_drawn)``: how many prompts draw
    ``draw`` may take, given the samples the stage drew so far (the caller's budget; 0 stops);
    None: as many as ``problems``. A stage left with no informative group learns nothing
    (``train/skipped``).

    ``drawn``: the stage's draw, already sampled and scored elsewhere (the pipelined sampler,
    :mod:`harness.train.pipeline`, with the weights ``staleness`` updates old); None: drawn here."""
    first = drawn if drawn is not None else _draw(learner, cfg, task, tok, k, 0, problems, score, perf, dist, prm,
                                                  sampler_tok)
    if not cfg.algo.drop_zero_variance:
        torch.manual_seed(stage_seed(cfg.seed, k))
        metrics = learner.step(first.rollouts, first.rewards, first.step_rewards, k, valid=valid, progress=progress,
                               **({} if staleness is None else {"staleness": staleness}))
        return Stage(first.rollouts, first.problems_rep, first.rewards, first.step_rewards, metrics)
    if dist is not None and dist.is_distributed:
        raise RuntimeError("algorithm.drop_zero_variance (dynamic sampling) runs in one process only")
    draws, picked = _dynamic_draws(learner, cfg, task, tok, k, first, len(problems), score, perf, prm,
                                   sampler_tok, more_prompts)
    drawn = _join(draws, [list(range(d.samples // first.rollouts.n)) for d in draws], tok)
    used = _join(draws, picked, tok)
    torch.manual_seed(stage_seed(cfg.seed, k))
    if used.samples == 0:
        metrics = {"train/skipped": 1.0}
    else:
        metrics = learner.step(used.rollouts, used.rewards, used.step_rewards, k, progress=progress)
    return Stage(used.rollouts, used.problems_rep, used.rewards, used.step_rewards, metrics, drawn)


def _dynamic_draws(learner, cfg, task, tok, k, first: Draw, target: int, score, perf, prm, sampler_tok,
                   more_prompts) -> tuple[list, list]:
    """DAPO's dynamic sampling: (the draws, per draw the indices of its groups kept), drawing again while
    fewer than ``target`` informative groups are kept and ``algorithm.max_resample`` allows."""
    G = cfg.sampling.samples_per_prompt
    draws, picked, kept = [first], [], 0
    for r in range(cfg.algo.max_resample + 1):
        if r > 0:
            drawn = sum(d.samples for d in draws)
            n = more_prompts(r, drawn) if more_prompts is not None else target
            if n <= 0:
                break
            draws.append(_draw(learner, cfg, task, tok, k, r, resample_problems(task, cfg.seed, k, r, n), score,
                               perf, None, prm, sampler_tok))
        good = informative_groups(draws[-1].rewards, G).nonzero().squeeze(-1).tolist()[: target - kept]
        picked.append(good)
        kept += len(good)
        if kept >= target:
            break
    return draws, picked


def _join(draws: list, groups: list, tok) -> Draw:
    """The groups ``groups[i]`` of each draw ``draws[i]``, as one :class:`Draw`."""
    n = draws[0].rollouts.n
    rows = [[g * n + j for g in gs for j in range(n)] for gs in groups]
    parts = [take_groups(d.rollouts, gs) for d, gs in zip(draws, groups)]
    return Draw(cat_rollouts(parts, tok.pad_token_id), [d.problems_rep[i] for d, rs in zip(draws, rows) for i in rs],
                torch.cat([torch.as_tensor(d.rewards, dtype=torch.float32).reshape(-1)[rs] for d, rs in zip(draws, rows)]),
                [d.step_rewards[i] for d, rs in zip(draws, rows) for i in rs] if all(d.step_rewards for d in draws)
                else [])
