"""The training loop every algorithm shares.

    task --prompts--> sampler --rollouts--> scorer --rewards--> learner --> policy'
      ^                                                                    |
      +---------------- evaluator at budget checkpoints <------------------+

Budgets: the run stops when the consumed amount in ``budget.unit`` (samples, tokens,
steps, seconds) reaches ``budget.amount``; with unit ``samples`` the last stage is cut to
land exactly on it. Evaluation happens before training and at ``budget.eval_points``
evenly spaced checkpoints in the same unit, so curves of different algorithms line up.

Determinism and resume: the prompts and the sampling seed of stage ``k`` are functions of
(seed, k) alone, so a run resumed from its last checkpoint (policy, critic, optimizers,
RNG states and counters are saved at every evaluation checkpoint) replays exactly the
stages an uninterrupted run would have run.
"""
from __future__ import annotations

import copy
import json
import math
import os
import random
import time
import traceback
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from algorithms.presets import resolve
from evals.prm import make_prm
from evals.tasks import get_task
from harness.config import Config, run_id, save_config
from harness.configbase import to_dict
from harness.learner import Learner, ValueModel
from harness.models import num_params, param_bytes, resolve_device, save_policy
from harness.perf import PerfTracker
from harness.run_io import CONFIG, METRICS, SUMMARY, MetricsWriter, read_json, write_json_atomic
from harness.sampling import char_to_token_index, sample
from harness.trackers import open_trackers
from harness.warmup import starting_checkpoint

COUNTERS = ("step", "samples", "tokens", "seconds")
UNIT_COUNTER = {"steps": "step", "samples": "samples", "tokens": "tokens", "seconds": "seconds"}


def consumed(c: dict, unit: str) -> float:
    """Budget consumed so far in ``unit`` (counters use 'step' for the steps unit)."""
    return c[UNIT_COUNTER[unit]]


def run_dir(cfg: Config) -> Path:
    return Path(cfg.output_dir) / cfg.name / run_id(cfg)


def stage_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7919 + 17) % (2**31 - 1)


def eval_thresholds(cfg: Config) -> list[float]:
    b = cfg.budget
    return [b.amount * k / b.eval_points for k in range(1, b.eval_points + 1)]


def budget_reached(cfg: Config, c: dict) -> bool:
    return consumed(c, cfg.budget.unit) >= cfg.budget.amount - 1e-9


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def score(task, problems_rep, rollouts, prm=None):
    """Outcome rewards [B]; with a process reward model, also each sequence's
    (step reward, token index where the step ends) list."""
    rewards = torch.tensor([task.reward(c, p, f) for c, p, f in
                            zip(rollouts.completions, problems_rep, rollouts.finished)], dtype=torch.float32)
    steps = []
    if prm is not None:
        for c, p, f, offs in zip(rollouts.completions, problems_rep, rollouts.finished, rollouts.token_offsets):
            steps.append([(s.reward, char_to_token_index(offs, s.end)) for s in prm.step_rewards(c, p, f)])
    return rewards, steps


def evaluate(model, tok, task, cfg: Config, step: int, out_dir: Path, final: bool, perf: PerfTracker) -> dict:
    """Greedy accuracy (and pass@k / maj@k when eval.n > 0) on the held-out problems."""
    from evals.runner import evaluate as run_eval

    ec = cfg.eval
    n = ec.n if (final or not ec.final_only_samples) else 0
    max_new = ec.max_new_tokens or cfg.sampling.max_new_tokens
    with perf.phase("eval"):
        return run_eval(model, tok, task, task.eval_problems(), greedy=ec.greedy, n=n, temperature=ec.temperature,
                        max_new_tokens=max_new, seed=stage_seed(cfg.seed, 10**6 + step), batch_size=256,
                        out_path=out_dir / "eval" / f"{task.name}_{step}.jsonl")


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])


def train(cfg: Config, *, resume: bool = True, progress: bool = True) -> dict:
    """Run (or resume, or skip if finished) one training run; returns its summary."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RuntimeError("this trainer runs one process per run; multi-rank runs (WORLD_SIZE > 1, "
                           "launcher.procs > 1) need harness.distributed in the learner, which is not wired yet")
    out = run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    prev = read_json(out / SUMMARY)
    if resume and prev and prev.get("status") == "finished":
        return prev
    save_config(cfg, out / CONFIG)
    rid = run_id(cfg)
    summary = {"run_id": rid, "name": cfg.name, "algorithm": cfg.algorithm.name, "seed": cfg.seed,
               "status": "running", "error": None, "config": to_dict(cfg), "started": time.time(),
               "budget": {"unit": cfg.budget.unit, "amount": cfg.budget.amount}}
    write_json_atomic(out / SUMMARY, summary)
    trackers = open_trackers(cfg, out, rid, sweep=cfg.name)
    writer = None
    try:
        writer = MetricsWriter(out / METRICS)
        trackers.start(flatten(to_dict(cfg)), {"algorithm": cfg.algorithm.name, "sweep": cfg.name,
                                               "seed": str(cfg.seed), "run_id": rid})
        summary = _train(cfg, out, summary, writer, trackers, resume, progress)
        summary["status"] = "finished"
        write_json_atomic(out / SUMMARY, summary)
        for name in (CONFIG, SUMMARY):
            trackers.log_artifact(out / name)
        for f in sorted((out / "eval").glob("*.jsonl")):
            trackers.log_artifact(f)
        trackers.finish(summary, "finished")
        return summary
    except BaseException as e:
        interrupted = isinstance(e, KeyboardInterrupt)
        summary["status"] = "interrupted" if interrupted else "failed"
        summary["error"] = f"{type(e).__name__}: {e}"
        write_json_atomic(out / SUMMARY, summary)
        if not interrupted:
            (out / "error.txt").write_text(traceback.format_exc())
        trackers.finish(summary, summary["status"])
        raise
    finally:
        if writer is not None:
            writer.close()


def _train(cfg: Config, out: Path, summary: dict, writer: MetricsWriter, trackers, resume: bool,
           progress: bool) -> dict:
    from tqdm.auto import tqdm

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    device = resolve_device(cfg.device)
    perf = PerfTracker(device)
    algo = resolve(cfg.algorithm)
    task = get_task(cfg.task)
    prm = make_prm(cfg.algorithm.prm, task, str(device)) if algo.reward == "process" else None
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)

    with perf.phase("load"):
        policy, tok, start_info = starting_checkpoint(cfg, task, device, progress)
        task.bind_tokenizer(tok)
        reference = copy.deepcopy(policy).eval().requires_grad_(False) if algo.uses_reference else None
        critic = ValueModel(policy).to(device) if algo.critic else None
    learner = Learner(policy, algo, cfg, device, perf, reference=reference, critic=critic)
    if cfg.train.reuse_warmup_optimizer and start_info.get("optimizer_state"):
        learner.init_optimizer_from(start_info["optimizer_state"])
    params = {"policy": num_params(policy), "reference": num_params(reference) if reference is not None else 0,
              "critic": num_params(critic) if critic is not None else 0}
    summary.update(params=params, start=start_info,
                   param_mb={k: (param_bytes(m) / 2**20 if m is not None else 0.0)
                             for k, m in (("policy", policy), ("reference", reference), ("critic", critic))})

    counters = {"step": 0, "samples": 0, "tokens": 0, "seconds": 0.0}
    ckpt = out / "checkpoint" / "state.pt"
    passed = 0  # eval thresholds already evaluated
    if resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        learner.load_state_dict(state["learner"])
        counters = state["counters"]
        passed = state["passed"]
        summary["initial_eval"] = state.get("initial_eval")
        _set_rng_state(state["rng"])
        writer.truncate_after(counters["step"])
        summary["resumed_from_step"] = counters["step"]
    else:
        writer.truncate_after(-1)

    def log(row: dict) -> None:
        row = {**{k: counters[k] for k in COUNTERS}, **row}
        writer.write(row)
        trackers.log(row, consumed(counters, cfg.budget.unit))

    if summary.get("initial_eval") is None:
        ev = evaluate(policy, tok, task, cfg, 0, out, final=True, perf=perf)
        summary["initial_eval"] = ev
        log(ev)
    thresholds = eval_thresholds(cfg)
    G, P = cfg.sampling.samples_per_prompt, cfg.train.prompts_per_step
    unit, amount = cfg.budget.unit, cfg.budget.amount
    bar = tqdm(total=amount, initial=min(consumed(counters, unit), amount), desc=f"{cfg.algorithm.name} [{unit}]",
               disable=not progress, dynamic_ncols=True)
    need_steps = prm is not None
    last_eval: dict = {}
    step_times = []
    while not budget_reached(cfg, counters):
        k = counters["step"]
        t_stage = time.perf_counter()
        n_prompts = P
        if unit == "samples":  # land exactly on the budget
            n_prompts = max(1, min(P, math.ceil((amount - counters["samples"]) / G)))
        problems = task.sample_train(random.Random(stage_seed(cfg.seed, k)), n_prompts)
        with perf.phase("generate"):
            ro = sample(policy, tok, [task.format_prompt(p) for p in problems], n=G,
                        max_new_tokens=cfg.sampling.max_new_tokens, temperature=cfg.sampling.temperature,
                        top_p=cfg.sampling.top_p, seed=stage_seed(cfg.seed, k), offsets=need_steps)
        reps = [p for p in problems for _ in range(G)]
        with perf.phase("score"):
            rewards, step_rewards = score(task, reps, ro, prm)
        torch.manual_seed(stage_seed(cfg.seed, k))
        learner.progress = consumed(counters, unit) / amount
        tm = learner.step(ro, rewards, step_rewards, k)
        if cfg.algorithm.ref_reset_every and (k + 1) % cfg.algorithm.ref_reset_every == 0:
            learner.reset_reference()
        dt = time.perf_counter() - t_stage
        step_times.append(dt)
        counters["step"] += 1
        counters["samples"] += ro.num_sequences
        counters["tokens"] += ro.num_tokens
        counters["seconds"] += dt
        secs = perf.pop_seconds()
        lens = ro.lengths.float()
        row = {**tm,
               "rollout/reward_mean": rewards.mean().item(),
               "rollout/reward_std": rewards.std(unbiased=False).item(),
               "rollout/solve_rate_any": rewards.view(-1, G).max(1).values.mean().item(),
               "rollout/len_mean": lens.mean().item(),
               "rollout/truncated_frac": 1.0 - float(np.mean(ro.finished)),
               "perf/step_seconds": dt,
               "perf/gen_tokens_per_s": ro.num_tokens / max(secs.get("generate", 1e-9), 1e-9)}
        row.update({f"perf/{k2}_seconds": v for k2, v in secs.items()})
        if need_steps:
            allr = [r for s in step_rewards for r, _ in s]
            row["rollout/step_reward_mean"] = float(np.mean(allr)) if allr else 0.0
        log(row)
        bar.update(min(consumed(counters, unit), amount) - bar.n)
        bar.set_postfix(reward=f"{row['rollout/reward_mean']:.2f}", acc=last_eval.get(f"eval/{task.name}/acc", ""))
        crossed = passed
        while crossed < len(thresholds) and consumed(counters, unit) >= thresholds[crossed] - 1e-9:
            crossed += 1
        if crossed > passed or budget_reached(cfg, counters):
            passed = max(crossed, passed)
            final = budget_reached(cfg, counters)
            last_eval = evaluate(policy, tok, task, cfg, counters["step"], out, final=final, perf=perf)
            log(last_eval)
            if not final:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"learner": learner.state_dict(), "counters": dict(counters), "passed": passed,
                            "initial_eval": summary["initial_eval"], "rng": _rng_state()}, tmp)
                os.replace(tmp, ckpt)
    bar.close()
    warm = step_times[:1]
    perf_summary = perf.summary()
    perf_summary["perf/warmup_step_seconds"] = warm[0] if warm else 0.0
    perf_summary["perf/step_seconds_mean"] = float(np.mean(step_times[1:] or step_times or [0.0]))
    log(perf_summary)
    summary["final_eval"] = last_eval
    summary["budget"]["consumed"] = {u: consumed(counters, u) for u in UNIT_COUNTER}
    summary["peak"] = {"rss_mb": perf_summary["perf/peak_rss_mb"],
                       "rss_above_base_mb": perf_summary["perf/peak_rss_above_base_mb"],
                       "cuda_mb": perf_summary.get("perf/peak_cuda_mb")}
    summary["perf"] = perf_summary
    summary["wall_seconds"] = time.time() - summary["started"]
    if cfg.train.save_final_model:
        save_policy(policy, tok, out / "final_model")
        summary["final_model"] = str(out / "final_model")
    if ckpt.exists():  # a finished run needs no resume state; its summary is the record
        ckpt.unlink()
    return summary
