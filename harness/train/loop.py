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

Several processes (``torchrun``, e.g. the sweep's ``launcher.procs > 1``; ZeRO stage from
``HARNESS_ZERO_STAGE``): a :class:`harness.engine.distributed.Distributed` is created before any
model is loaded (ZeRO-3 then loads ``from_pretrained`` models partitioned, and the
reference / critic are loaded afresh rather than deep-copied). Every rank draws the same
prompts for a stage (a function of seed and step), takes its shard of them (whole groups:
the G samples of a prompt stay on one rank; shards are padded to equal size with
zero-weight copies) and samples with the gathered weights and a rank-dependent seed. The
budget counters are global: samples and tokens are summed over ranks (padding excluded),
a step is one stage of all ranks, seconds the slowest rank's. Only the main rank writes
files (config, metrics, summary, evaluation records, final model) and talks to trackers;
it evaluates with the gathered weights while the others wait. Checkpoints: every rank
writes ``dist.save_state`` into ``checkpoint/dist_<step>/`` and the main rank's
``checkpoint/state.pt`` (counters, RNG, evaluation so far) names it. The Adam hand-over
from the warm-up (``train.reuse_warmup_optimizer``) is single-process only.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import os
import random
import shutil
import time
import traceback
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from algorithms.presets import resolve
from evals.catalog import get_task
from harness.config.schema import Config, run_id, save_config
from harness.config.base import flatten, to_dict
from harness.engine.distributed import Distributed
from harness.engine.learner import Learner, ValueModel
from harness.engine.models import build_tiny_model, load_prm, load_policy, resolve_device, save_policy
from harness.engine.perf import PerfTracker
from harness.rundir.layout import CONFIG, METRICS, SUMMARY, MetricsWriter, read_json, write_json_atomic
from harness.engine.sampling import char_to_token_index, sample
from harness.tracking.base import TrackerSet
from harness.tracking.mirrors import open_trackers
from harness.train.warmup import WARMUP_SEED, _locked, starting_checkpoint, train_warmup, warmup_dir

log_ = logging.getLogger(__name__)

COUNTERS = ("step", "samples", "tokens", "seconds")
RANK_SEED_STRIDE = 1_000_000_007  # rank r samples stage k with stage_seed(seed, k) + r * stride
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
    from harness.engine.evaluate import evaluate as run_eval

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


def _numel(model) -> int:
    """Parameter count; the full count for ZeRO-3 partitioned parameters (``ds_numel``)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def _nbytes(model) -> int:
    return sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in model.parameters())


def make_distributed(cfg: Config) -> Distributed:
    """This process's :class:`Distributed` (plain torch in a single process)."""
    return Distributed.from_env(micro_batch_size=cfg.train.micro_batch_size, max_grad_norm=cfg.train.max_grad_norm,
                                dtype=cfg.model.dtype, cpu=resolve_device(cfg.device).type == "cpu")


def _fresh_copy(cfg: Config, start_info: dict, tok, device):
    """Another instance of the starting policy, loaded rather than deep-copied (ZeRO-3:
    ``from_pretrained`` partitions it as it loads)."""
    src = start_info.get("source")
    if src == "tiny-untrained":
        return build_tiny_model(cfg.model, tok, seed=WARMUP_SEED).to(device)
    if cfg.model.name_or_path != "tiny":
        model, _ = load_policy(cfg.model.name_or_path, cfg.model.gguf_file, cfg.model.dtype)
    else:
        model, _ = load_policy(src)
    return model.to(device)


def _warmup_on_main(cfg: Config, task, device, progress: bool, dist: Distributed) -> None:
    """Several processes: the main rank trains the warm-up checkpoint if it is not cached
    yet, while the others wait (transformers writes model files on rank 0 only, and loading
    under ZeRO-3 is collective, so every rank loads only once it exists)."""
    if cfg.model.name_or_path == "tiny" and cfg.warmup.enabled and dist.is_main:
        out = warmup_dir(cfg)
        with _locked(out.with_name(out.name + ".lock")):
            if not (out / "warmup.json").exists():
                train_warmup(cfg, task, out, device, progress)
    dist.barrier()


def train(cfg: Config, *, resume: bool = True, progress: bool = True) -> dict:
    """Run (or resume, or skip if finished) one training run; returns its summary.
    Under torchrun every rank calls this; only the main rank writes the run directory."""
    dist = make_distributed(cfg)  # before any model is loaded (ZeRO-3: partitioned loading)
    main = dist.is_main
    out = run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    prev = dist.broadcast_object(read_json(out / SUMMARY) if main else None)
    if resume and prev and prev.get("status") == "finished":
        return prev
    if main:
        save_config(cfg, out / CONFIG)
    rid = run_id(cfg)
    summary = {"run_id": rid, "name": cfg.name, "algorithm": cfg.algorithm.name, "seed": cfg.seed,
               "status": "running", "error": None, "config": to_dict(cfg), "started": time.time(),
               "budget": {"unit": cfg.budget.unit, "amount": cfg.budget.amount}}
    if dist.is_distributed:
        summary["distributed"] = {"mode": dist.mode, "world_size": dist.world_size}
    if main:
        write_json_atomic(out / SUMMARY, summary)
    trackers = open_trackers(cfg, out, rid, sweep=cfg.name) if main else TrackerSet([])
    writer = None
    try:
        writer = MetricsWriter(out / METRICS) if main else None
        trackers.start(flatten(to_dict(cfg)), {"algorithm": cfg.algorithm.name, "sweep": cfg.name,
                                               "seed": str(cfg.seed), "run_id": rid})
        summary = _train(cfg, out, summary, writer, trackers, resume, progress, dist)
        summary["status"] = "finished"
        if main:
            write_json_atomic(out / SUMMARY, summary)
            for name in (CONFIG, SUMMARY):
                trackers.log_artifact(out / name)
            for f in sorted((out / "eval").glob("*.jsonl")):
                trackers.log_artifact(f)
            trackers.finish(summary, "finished")
        return dist.broadcast_object(summary)
    except BaseException as e:
        if not main:  # the main rank records the failure (the launcher records a dead group)
            raise
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


def _train(cfg: Config, out: Path, summary: dict, writer: Optional[MetricsWriter], trackers, resume: bool,
           progress: bool, dist: Distributed) -> dict:
    from tqdm.auto import tqdm

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    distributed, main = dist.is_distributed, dist.is_main
    device = dist.device if distributed else resolve_device(cfg.device)
    perf = PerfTracker(device)
    algo = resolve(cfg.algorithm)
    task = get_task(cfg.task)
    prm = load_prm(cfg.algorithm.prm, task, str(device)) if algo.reward == "process" else None
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)

    with perf.phase("load"):
        if distributed:
            _warmup_on_main(cfg, task, device, progress, dist)
        policy, tok, start_info = starting_checkpoint(cfg, task, device, progress and main)
        task.bind_tokenizer(tok)
        if dist.zero3:  # partitioned parameters cannot be deep-copied: load other instances
            reference = _fresh_copy(cfg, start_info, tok, device) if algo.uses_reference else None
            critic = (ValueModel(_fresh_copy(cfg, start_info, tok, device), copy_backbone=False).to(device)
                      if algo.critic else None)
        else:
            reference = copy.deepcopy(policy).eval().requires_grad_(False) if algo.uses_reference else None
            critic = ValueModel(policy).to(device) if algo.critic else None
    params = {"policy": _numel(policy), "reference": _numel(reference) if reference is not None else 0,
              "critic": _numel(critic) if critic is not None else 0}
    param_mb = {k: (_nbytes(m) / 2**20 if m is not None else 0.0)
                for k, m in (("policy", policy), ("reference", reference), ("critic", critic))}
    learner = Learner(policy, algo, cfg, device, perf, reference=reference, critic=critic, dist=dist)
    if cfg.train.reuse_warmup_optimizer and start_info.get("optimizer_state"):
        if distributed:
            if main:
                log_.warning("train.reuse_warmup_optimizer: the Adam hand-over is single-process only; "
                             "skipped (%s, %d processes)", dist.mode, dist.world_size)
        else:
            learner.init_optimizer_from(start_info["optimizer_state"])
    summary.update(params=params, start=start_info, param_mb=param_mb)

    counters = {"step": 0, "samples": 0, "tokens": 0, "seconds": 0.0}
    ckpt = out / "checkpoint" / "state.pt"
    passed = 0  # eval thresholds already evaluated
    if distributed:
        state = _load_dist_checkpoint(ckpt, dist, learner, cfg) if resume else None
    elif resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        learner.load_state_dict(state["learner"])
        _set_rng_state(state["rng"])
    else:
        state = None
    if state is not None:
        counters = state["counters"]
        passed = state["passed"]
        summary["initial_eval"] = state.get("initial_eval")
        if writer is not None:
            writer.truncate_after(counters["step"])
        summary["resumed_from_step"] = counters["step"]
    elif writer is not None:
        writer.truncate_after(-1)

    def log(row: dict) -> None:
        if writer is None:  # not the main rank
            return
        row = {**{k: counters[k] for k in COUNTERS}, **row}
        writer.write(row)
        trackers.log(row, consumed(counters, cfg.budget.unit))

    def run_eval(at_step: int, final: bool) -> dict:
        # ZeRO-3: gathering is collective, so every rank enters; the main rank evaluates
        with dist.gathered(learner.policy) as m:
            ev = evaluate(m, tok, task, cfg, at_step, out, final=final, perf=perf) if main else None
            dist.barrier()
        return dist.broadcast_object(ev)

    if summary.get("initial_eval") is None:
        ev = run_eval(0, final=True)
        summary["initial_eval"] = ev
        log(ev)
    thresholds = eval_thresholds(cfg)
    G, P = cfg.sampling.samples_per_prompt, cfg.train.prompts_per_step
    unit, amount = cfg.budget.unit, cfg.budget.amount
    bar = tqdm(total=amount, initial=min(consumed(counters, unit), amount), desc=f"{cfg.algorithm.name} [{unit}]",
               disable=not progress or not main, dynamic_ncols=True)
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
        valid = None
        if distributed:  # whole prompts (groups) per rank; equal shard sizes, padding flagged
            n_mine = len(problems[dist.rank::dist.world_size])
            problems = dist.shard(problems, pad=True)
            valid = torch.arange(len(problems) * G) < n_mine * G
        with perf.phase("generate"):
            with dist.gathered(learner.policy) as m:
                ro = sample(m, tok, [task.format_prompt(p) for p in problems], n=G,
                            max_new_tokens=cfg.sampling.max_new_tokens, temperature=cfg.sampling.temperature,
                            top_p=cfg.sampling.top_p, seed=stage_seed(cfg.seed, k) + RANK_SEED_STRIDE * dist.rank,
                            offsets=need_steps)
        reps = [p for p in problems for _ in range(G)]
        with perf.phase("score"):
            rewards, step_rewards = score(task, reps, ro, prm)
        torch.manual_seed(stage_seed(cfg.seed, k))
        learner.progress = consumed(counters, unit) / amount
        tm = learner.step(ro, rewards, step_rewards, k, valid=valid)
        if cfg.algorithm.ref_reset_every and (k + 1) % cfg.algorithm.ref_reset_every == 0:
            learner.reset_reference()
        dt = time.perf_counter() - t_stage
        secs = perf.pop_seconds()
        lens = ro.lengths.float()
        if distributed:  # global rollout statistics (padding excluded)
            nv = int(valid.sum().item())
            parts = dist.gather_objects({
                "rewards": rewards[:nv].tolist(), "lens": lens[:nv].tolist(), "finished": list(ro.finished[:nv]),
                "tokens": int(ro.completion_mask[:nv].sum().item()), "dt": dt, "gen": secs.get("generate", 0.0),
                "step_rewards": [r for s in step_rewards[:nv] for r, _ in s] if need_steps else []})
            rewards = torch.tensor([x for p in parts for x in p["rewards"]], dtype=torch.float32)
            lens = torch.tensor([x for p in parts for x in p["lens"]], dtype=torch.float32)
            finished = [x for p in parts for x in p["finished"]]
            n_seqs, n_tokens = len(finished), sum(p["tokens"] for p in parts)
            dt = max(p["dt"] for p in parts)  # the same on every rank: budgets in seconds agree
            gen_seconds = max(p["gen"] for p in parts)
            allr = [x for p in parts for x in p["step_rewards"]]
        else:
            finished, n_seqs, n_tokens = ro.finished, ro.num_sequences, ro.num_tokens
            gen_seconds = secs.get("generate", 1e-9)
            allr = [r for s in step_rewards for r, _ in s] if need_steps else []
        step_times.append(dt)
        counters["step"] += 1
        counters["samples"] += n_seqs
        counters["tokens"] += n_tokens
        counters["seconds"] += dt
        row = {**tm,
               "rollout/reward_mean": rewards.mean().item(),
               "rollout/reward_std": rewards.std(unbiased=False).item(),
               "rollout/solve_rate_any": rewards.view(-1, G).max(1).values.mean().item(),
               "rollout/len_mean": lens.mean().item(),
               "rollout/truncated_frac": 1.0 - float(np.mean(finished)),
               "perf/step_seconds": dt,
               "perf/gen_tokens_per_s": n_tokens / max(gen_seconds, 1e-9)}
        row.update({f"perf/{k2}_seconds": v for k2, v in secs.items()})
        if need_steps:
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
            last_eval = run_eval(counters["step"], final)
            log(last_eval)
            if not final:
                state = {"counters": dict(counters), "passed": passed, "initial_eval": summary["initial_eval"]}
                if distributed:
                    _save_dist_checkpoint(ckpt, dist, learner, cfg, state)
                else:
                    ckpt.parent.mkdir(parents=True, exist_ok=True)
                    tmp = ckpt.with_suffix(".tmp")
                    torch.save({"learner": learner.state_dict(), **state, "rng": _rng_state()}, tmp)
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
        with dist.gathered(learner.policy) as m:  # collective under ZeRO-3; the main rank writes
            if main:
                save_policy(m, tok, out / "final_model")
            dist.barrier()
        summary["final_model"] = str(out / "final_model")
    dist.barrier()
    if main:
        if ckpt.exists():  # a finished run needs no resume state; its summary is the record
            ckpt.unlink()
        for d in ckpt.parent.glob("dist_*"):
            shutil.rmtree(d, ignore_errors=True)
    return summary


# --------------------------------------------------------------------------- multi-process checkpoints

DIST_REFERENCE = "reference.pt"


def _save_dist_checkpoint(ckpt: Path, dist: Distributed, learner: Learner, cfg: Config, state: dict) -> None:
    """Every rank: ``dist.save_state`` into ``checkpoint/dist_<step>/`` (engines, optimizers,
    per-rank RNG); the reference's weights when the run resets it; then the main rank
    points ``state.pt`` at that folder (atomically) and removes older ones."""
    tag = f"dist_{state['counters']['step']}"
    folder = ckpt.parent / tag
    folder.mkdir(parents=True, exist_ok=True)
    dist.save_state(folder)
    ref = learner.reference_state() if cfg.algorithm.ref_reset_every else None
    if dist.is_main and ref is not None:
        torch.save(ref, folder / DIST_REFERENCE)
    dist.barrier()  # every rank's shard is on disk before state.pt names the folder
    if dist.is_main:
        tmp = ckpt.with_suffix(".tmp")
        torch.save({**state, "dist_state": tag, "mode": dist.mode, "world_size": dist.world_size,
                    "updates": learner.updates, "rng": _rng_state()}, tmp)
        os.replace(tmp, ckpt)
        for old in ckpt.parent.glob("dist_*"):
            if old.name != tag:
                shutil.rmtree(old, ignore_errors=True)


def _load_dist_checkpoint(ckpt: Path, dist: Distributed, learner: Learner, cfg: Config) -> Optional[dict]:
    """Every rank: the checkpoint's state (None when there is none), after loading it."""
    meta = None
    if dist.is_main and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        if "dist_state" not in state:
            meta = {"error": f"{ckpt} was written by a single-process run; it cannot resume with "
                             f"{dist.world_size} processes ({dist.mode}); remove it to start over"}
        elif (state["mode"], state["world_size"]) != (dist.mode, dist.world_size):
            meta = {"error": f"{ckpt} was written by {state['world_size']} processes ({state['mode']}); "
                             f"this run has {dist.world_size} ({dist.mode}); remove it to start over"}
        else:
            meta = {k: v for k, v in state.items() if k != "rng"}
    meta = dist.broadcast_object(meta)
    if meta is None:
        return None
    if "error" in meta:
        raise RuntimeError(meta["error"])
    folder = ckpt.parent / meta["dist_state"]
    dist.load_state(folder)  # weights, optimizers, RNG of every rank
    if cfg.algorithm.ref_reset_every and learner.reference is not None:
        ref = None
        if dist.is_main or not dist.zero3:
            ref = torch.load(folder / DIST_REFERENCE, weights_only=False)
        learner.load_reference_state(ref)
    learner.updates = meta.get("updates", 0)
    return meta
