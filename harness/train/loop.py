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
RNG states and counters are saved at every evaluation checkpoint, and after the stage that
ends every ``train.checkpoint_minutes`` of training) replays exactly the stages an
uninterrupted run would have run.

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
``checkpoint/state.pt`` (counters, RNG, evaluation so far) names it
(:mod:`harness.train.checkpoint`). The Adam hand-over from the warm-up
(``train.reuse_warmup_optimizer``) is single-process only.

The budget vocabulary (units, row counters, thresholds) is :mod:`harness.foundation.budget`;
summary.json is written through :mod:`harness.rundir.summary`.
"""
from __future__ import annotations

import logging
import math
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from evals.catalog import get_task
from harness.admission import gate
from harness.admission.gate import Admitted
from harness.config.schema import Config, save_config
from harness.engine import heap
from harness.engine.distributed import Distributed
from harness.engine.evaluate import evaluate as run_evaluation
from harness.engine.learner import Learner
from harness.engine.lora import apply_lora, trainable_count
from harness.engine.models import build_tiny_model, load_prm, load_policy, resolve_device, save_policy
from harness.engine.perf import PerfTracker
from harness.engine.sampling import char_to_token_index
from algorithms.filters import zero_variance_share
from harness.foundation.base import ConfigError, flatten
from harness.foundation.budget import (STEP, budget_reached, consumed, eval_thresholds, new_counters, overshoot,
                                       row_counters, stage_samples, threshold_warning, thresholds_passed)
from harness.foundation.files import writing
from harness.rundir import provenance
from harness.rundir.ids import run_id
from harness.rundir.layout import (CONFIG, ERROR_TXT, METRICS, SUMMARY, MetricsWriter, RunFileError, make_run_dir,
                                   nonregular, remove_temp_files)
from harness.rundir.lock import RunBusy, lock_run_dir
from harness.rundir.outputs import staged
from harness.rundir.read import finished_problem
from harness.rundir.summary import new_summary, read_summary, record_end, record_exception, set_phase, write_summary
from harness.tracking.base import TrackerSet
from harness.tracking.mirrors import open_trackers
from harness.train import pipeline
from harness.train.evalpoints import (EVAL_SEED_OFFSET, VALIDATION_START, cached_initial_eval, evaluate_point,
                                      ood_task)
from harness.train.flops import drawn_stage_flops
from harness.train.checkpoint import checkpoint_path, load_checkpoint, remove_checkpoint, save_checkpoint
from harness.train.stage import build_models, run_stage, stage_problems, stage_prompt_count, stage_seed
from harness.config.paths import uses_warmup_cache
from harness.train.warmup import WARMUP_SEED, ensure_warmup, starting_checkpoint
from harness.rewards.run import for_run as reward_model_for_run

log_ = logging.getLogger(__name__)


def run_dir(cfg: Config) -> Path:
    return Path(cfg.output_dir) / cfg.name / run_id(cfg)


def ref_reset_due(step: int, every: int) -> bool:
    """Is the reference reset to the current policy after stage ``step`` (0-based)? Every
    ``every`` stages (``algorithm.ref_reset_every``): after stages every-1, 2*every-1, ...; 0 = never.
    So k stages reset it k // every times."""
    return every > 0 and (step + 1) % every == 0


def short_outputs(task, problems_rep, rollouts) -> list:
    """Per sequence, did it write fewer steps than its problem needs (``Task.short_output``)?
    Empty where the task does not know (it answers None)."""
    flags = [task.short_output(c, p, f) for c, p, f in zip(rollouts.completions, problems_rep, rollouts.finished)]
    return [] if any(x is None for x in flags) else [bool(x) for x in flags]


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


def evaluate(model, tok, task, cfg: Config, step: int, out_dir: Path, final: bool, perf: PerfTracker,
             ood=None) -> dict:
    """Greedy accuracy (and pass@k / maj@k, and the out-of-domain set, at the start and the
    end) on the held-out problems: :mod:`harness.train.evalpoints`."""
    with perf.phase("eval"):
        return evaluate_point(model, tok, task, cfg, step, out_dir, final,
                              seed=stage_seed(cfg.seed, EVAL_SEED_OFFSET + step), ood=ood,
                              progress=step == 0 and sys.stderr.isatty())  # the long start evaluation


def _own_params(model) -> set:
    return {id(p) for p in model.parameters()}


def _numel(model, shared: Optional[set] = None) -> int:
    """Parameter count, less the parameters in ``shared`` (ids); the full count for ZeRO-3 partitioned
    parameters (``ds_numel``)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if id(p) not in (shared or ()))


def _nbytes(model, shared: Optional[set] = None) -> int:
    return sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in model.parameters()
               if id(p) not in (shared or ()))


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
    if cfg.model.name_or_path != "tiny" and not uses_warmup_cache(cfg):  # warmup.pretrained: its checkpoint
        model, _ = load_policy(cfg.model.name_or_path, cfg.model.gguf_file, cfg.model.dtype)
    else:
        model, _ = load_policy(src)
    return model.to(device)


def _warmup_on_main(cfg: Config, task, device, progress: bool, dist: Distributed) -> None:
    """Several processes: the main rank trains the warm-up checkpoint if it is not cached
    yet, while the others wait (transformers writes model files on rank 0 only, and loading
    under ZeRO-3 is collective, so every rank loads only once it exists)."""
    if uses_warmup_cache(cfg) and dist.is_main:
        ensure_warmup(cfg, task, device, progress)
    dist.barrier()


# --------------------------------------------------------------------------- one training attempt


@dataclass
class _Run:
    """What one training attempt holds: where it writes, the models and the budget counters."""
    cfg: Config
    out: Path
    dist: Distributed
    summary: dict
    writer: Optional[MetricsWriter]  # None on every rank but the main one
    trackers: TrackerSet
    device: Any = None
    perf: Optional[PerfTracker] = None
    task: Any = None
    ood: Any = None  # the out-of-domain task (eval.ood), or None
    start_info: dict = field(default_factory=dict)
    prm: Any = None
    rm: Any = None  # a learned reward model (reward_model.type; harness.rewards.run), or None
    tok: Any = None
    learner: Optional[Learner] = None
    counters: dict = field(default_factory=new_counters)
    passed: int = 0  # evaluation thresholds already evaluated
    t_start: float = field(default_factory=time.monotonic)  # the attempt's start (durations: monotonic clock)
    setup_only: bool = False  # `prepare`: stop after the start evaluation
    pipeline: Any = None  # the pipelined sampler (train.staleness, sampling.dtype; harness.train.pipeline), or None
    resumed_pipeline: Optional[dict] = None  # its state in the checkpoint resumed from

    @property
    def ckpt(self) -> Path:
        return checkpoint_path(self.out)

    def log(self, row: dict) -> None:
        """Write a metrics row (the counters first) and mirror it (main rank only)."""
        if self.writer is None:
            return
        row = {**row_counters(self.counters), **row}
        self.writer.write(row)
        self.trackers.log(row, consumed(self.counters, self.cfg.budget.unit))

    def evaluate(self, at_step: int, final: bool) -> dict:
        """Every rank enters (ZeRO-3 gathering is collective); the main rank evaluates."""
        dist = self.dist
        with dist.gathered(self.learner.policy) as m:
            ev = (evaluate(m, self.tok, self.task, self.cfg, at_step, self.out, final=final, perf=self.perf,
                           ood=self.ood) if dist.is_main else None)
            dist.barrier()
        return dist.broadcast_object(ev)


def train(cfg: Config | Admitted, *, resume: bool = True, progress: bool = True, setup_only: bool = False) -> dict:
    """Run (or resume, or skip if finished) one training run; returns its summary. ``cfg``: a run the admission
    gate let in (`harness.admission.gate.admit`: the CLI's), or a config, which is taken through the gate here (the
    library entry point, a sweep worker).
    Under torchrun every rank calls this; only the main rank writes the run directory, and
    holds its lock (`harness.rundir.lock.lock_run_dir`) for the whole run: a second trainer
    on the same run raises `RunBusy` naming the holder before writing anything.
    ``setup_only``: stop after the start evaluation (see `prepare`)."""
    admitted = gate.admitted(cfg)
    cfg = admitted.cfg
    nstate = admitted.enter()  # numerics first: the pins must be in force before torch runs a kernel here
    heap.limit_heap_retention(cfg.train.heap_mmap_threshold_kib)
    dist = make_distributed(cfg)  # before any model is loaded (ZeRO-3: partitioned loading)
    out = make_run_dir(run_dir(cfg))
    lock, busy = None, None
    if dist.is_main:
        try:
            lock = lock_run_dir(out)
        except RunBusy as e:
            busy = str(e)
    busy = dist.broadcast_object(busy)
    if busy:
        raise RunBusy(busy)
    try:
        return _train_run(cfg, dist, out, resume, progress, nstate, setup_only)
    finally:
        if lock is not None:
            lock.release()


def prepare(cfg: Config, *, resume: bool = True, progress: bool = False) -> dict:
    """A sweep's setup job (`harness.sweep.run`): build ``cfg``'s warm-up checkpoint and its start
    evaluation into their caches, in a process of their own, and stop before training. The
    runs that share them then only read the caches, so none of them carries the setup's work
    in its wall-clock or the setup's heap in its peak memory (a process that evaluated n = 256
    samples on 600 problems keeps ~170 MiB more resident for the rest of its life). The
    "run" is a throwaway folder (the config's ``output_dir``); ``resume`` is ignored: a setup
    job always checks the caches anew."""
    return train(cfg, resume=False, progress=progress, setup_only=True)


def _train_run(cfg: Config, dist: Distributed, out: Path, resume: bool, progress: bool, nstate: dict,
               setup_only: bool = False) -> dict:
    """`train` with the run directory locked (``nstate``: the numerics in force)."""
    main = dist.is_main
    bad = dist.broadcast_object(_nonregular_run_file(out) if main else None)
    if bad:
        raise RunFileError(*bad)
    prev = dist.broadcast_object(_finished_summary(cfg, out, resume) if main else None)
    if prev:
        return prev
    if main:
        save_config(cfg, out / CONFIG)
    rid = run_id(cfg)
    summary = new_summary(cfg, rid, {"mode": dist.mode, "world_size": dist.world_size}
                          if dist.is_distributed else None)
    summary["provenance"] = provenance.collect(cfg.numerics, results_root=cfg.output_dir, numerics_state=nstate)
    t_start = time.monotonic()  # with `started`: durations on the monotonic clock, stamps on the unix one
    summary["provenance"] = _resume_provenance(out, resume, summary["provenance"], dist)
    if main:
        write_summary(out, summary)
    trackers = open_trackers(cfg, out, rid, sweep=cfg.name) if main else TrackerSet([])
    writer = None
    try:
        writer = MetricsWriter(out / METRICS) if main else None
        trackers.start(flatten(cfg.effective_dict()), {"algorithm": cfg.algo.name, "sweep": cfg.name,
                                                       "seed": str(cfg.seed), "run_id": rid,
                                                       **provenance.tags(summary["provenance"])})
        summary = _train(_Run(cfg, out, dist, summary, writer, trackers, t_start=t_start, setup_only=setup_only),
                         resume, progress)
        summary["status"] = "finished"
        if main:
            _publish_finished(out, summary, trackers)
        return dist.broadcast_object(summary)
    except BaseException as e:
        if not main:  # the main rank records the failure (the launcher records a dead group)
            raise
        remove_temp_files(out)  # e.g. a checkpoint/state.tmp a full disk cut short
        status = record_exception(out, summary, e, traceback.format_exc())  # best effort
        trackers.finish(summary, status)
        raise
    finally:
        if writer is not None:
            writer.close()


def _nonregular_run_file(out: Path) -> Optional[tuple]:
    """(path, problem, what to do) for the first run file that exists but is not a regular file
    (a FIFO would block the trainer's open forever, a device never ends), else None."""
    for name in (CONFIG, SUMMARY, METRICS, ERROR_TXT):
        kind = nonregular(out / name)
        if kind:
            return (str(out / name), f"is {kind}, not a regular file", "delete it and re-run")
    return None


def _resume_provenance(out: Path, resume: bool, now: dict, dist: Distributed) -> dict:
    """This attempt's provenance ``now``, checked against the last attempt's when the run resumes from a
    checkpoint: another numerics mode, thread count or product source cannot resume bit for bit
    (:func:`harness.rundir.provenance.resume_problem`): a `RunFileError` (one line, exit 2) before anything is
    written. Returns ``now`` with the earlier attempts' code (``earlier``) when the user let new code resume."""
    before = None
    if dist.is_main and resume and checkpoint_path(out).exists():
        before = (read_summary(out) or {}).get("provenance")
    allow = os.environ.get(provenance.ENV_RESUME_NEW_CODE, "").strip() == "1"
    why = dist.broadcast_object(provenance.resume_problem(before, now, allow) if dist.is_main else None)
    if why:
        raise RunFileError(out, f"its checkpoint cannot resume bit for bit here: {why}",
                           "or start the run over (harness train --restart, or remove its folder)")
    return provenance.carry_earlier(before, now)


def _finished_summary(cfg: Config, out: Path, resume: bool) -> Optional[dict]:
    """Main rank: the summary of a finished run to return without training, when resuming and
    its files bear it out (:func:`harness.rundir.read.finished_problem`). A summary that says
    finished but is not borne out (forged, hand-edited, from a run stopped part-way) is not
    trusted: a warning says why, the old summary.json and metrics.jsonl are kept under
    ``superseded/``, and the run resumes from its checkpoint (or starts over without one)."""
    prev = read_summary(out)
    if not (resume and prev and prev.get("status") == "finished"):
        return None
    why = finished_problem(out, prev, cfg.budget, task=cfg.task.name)
    if why is None:
        return prev
    kept = _keep_superseded(out)
    where = ("resumes from its checkpoint" if checkpoint_path(out).exists()
             else "has no checkpoint and starts over")
    log_.warning("%s says the run finished, but %s: not trusted; the run %s%s", out / SUMMARY, why, where,
                 f" (the old summary.json and metrics.jsonl are kept in {kept})" if kept else "")
    return None


def _keep_superseded(out: Path) -> Optional[Path]:
    """Copy summary.json and metrics.jsonl into ``superseded/unverified-<time>/`` (best effort;
    readers skip ``superseded``). Returns the folder, or None when nothing could be kept."""
    import shutil

    dest = out / "superseded" / f"unverified-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6:06d}"
    try:
        for name in (SUMMARY, METRICS):
            if (out / name).is_file():
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(out / name, dest / name)
    except OSError as e:
        log_.warning("could not keep the unverified summary of %s: %s", out, e.strerror or e)
        return None
    return dest if dest.exists() else None


def _publish_finished(out: Path, summary: dict, trackers: TrackerSet) -> None:
    """Main rank: the finished summary on disk, then the run's files and status to the mirrors."""
    write_summary(out, summary)
    for name in (CONFIG, SUMMARY):
        trackers.log_artifact(out / name)
    for f in sorted((out / "eval").glob("*.jsonl")):
        trackers.log_artifact(f)
    trackers.finish(summary, "finished")


def _train(run: _Run, resume: bool, progress: bool) -> dict:
    """Set up, resume, evaluate the start, train to the budget, record the end."""
    _setup(run, progress)
    _restore(run, resume)
    _evaluate_start(run)
    if run.setup_only:
        return run.summary
    if run.rm is not None and not run.rm.started:  # round 0: the reward model before RL (its cost is charged)
        run.log(run.rm.start(run.learner.policy, run.counters))
    if run.pipeline is not None:  # the first k + 1 stages queued (from the checkpoint's versions on a resume)
        run.pipeline.start(run.counters[STEP], run.learner.policy, run.counters["samples"], run.resumed_pipeline)
    try:
        last_eval, step_times = _train_to_budget(run, progress)
    finally:
        if run.pipeline is not None:
            run.pipeline.close()
    _finalize(run, last_eval, step_times)
    return run.summary


def _evaluate_start(run: _Run) -> None:
    """The start evaluation (``initial_eval``; with ``eval.validation`` also the start's validation scores,
    ``initial_val_eval``), each read from the warm-up's cache when it holds it; what a resume point already holds is
    not done again. ``setup_seconds.initial_eval`` is the time of what was done here."""
    need_test = run.summary.get("initial_eval") is None
    need_val = run.cfg.eval.validation and run.summary.get("initial_val_eval") is None
    if need_val and run.summary.get("resumed_from_step") is not None:
        # a resume point written before runs recorded it: the policy has trained since, so scoring it now would
        # call a trained policy the start
        log_.warning("the start's validation score is not in the resume point (written by an older harness) and "
                     "is not computed now that the policy has trained: this run's summary has no initial_val_eval")
        need_val = False
    if not (need_test or need_val):
        return
    t0 = time.monotonic()
    if run.writer is not None:
        set_phase(run.out, run.summary, "initial evaluation")  # the sweep's live table shows it

    def cached(compute: Callable[[], dict], part: str) -> dict:
        if run.dist.is_distributed:  # no shared cache across ranks: computed (collectively)
            return compute()
        return cached_initial_eval(run.cfg, run.start_info, run.out, compute, part)
    if need_test:
        run.summary["initial_eval"] = ev = cached(lambda: run.evaluate(0, final=True), "test")
        run.log(ev)
    if need_val:
        run.summary["initial_val_eval"] = cached(lambda: _validation_eval(run, start=True), "validation")
    run.summary["setup_seconds"]["initial_eval"] = time.monotonic() - t0
    if run.writer is not None:
        set_phase(run.out, run.summary, None)


def _setup(run: _Run, progress: bool) -> None:
    """Threads, device, task, reward model, seeds, the models and the learner."""
    cfg, dist = run.cfg, run.dist  # threads: set with the numerics (`train`)
    run.device = dist.device if dist.is_distributed else resolve_device(cfg.device)
    run.perf = PerfTracker(run.device)
    algo = cfg.algo
    if dist.is_distributed and algo.drop_zero_variance:
        raise ConfigError(f"algorithm.drop_zero_variance=true is invalid with {dist.world_size} processes: dynamic "
                          f"sampling runs in one process only (set it to false, or run one process)")
    run.task = get_task(cfg.task)
    run.ood = ood_task(cfg)
    # the exact step rewards (or algorithm.prm); with a learned reward model they are its labels and statistics
    run.prm = (load_prm(algo.prm, run.task, str(run.device)) if algo.reward == "process" and
               (cfg.reward_model.type is None or run.task.has_process_rewards) else None)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)
    with run.perf.phase("load"):
        policy, run.tok, start_info, reference, critic = _load_models(cfg, algo, run.task, run.device,
                                                                      progress, dist)
    models = (("policy", policy), ("reference", reference), ("critic", critic))
    own = _own_params(policy)  # the reference and the critic count only weights they do not share with it (LoRA)
    params = {k: (_numel(m, own if k != "policy" else None) if m is not None else 0) for k, m in models}
    param_mb = {k: (_nbytes(m, own if k != "policy" else None) / 2**20 if m is not None else 0.0) for k, m in models}
    if cfg.model.lora.enabled:
        params["policy_trainable"] = trainable_count(policy)
    run.learner = Learner(policy, algo, cfg, run.device, run.perf, reference=reference, critic=critic, dist=dist)
    run.rm = reward_model_for_run(cfg, run.task, run.learner.policy, run.tok, run.device, run.perf,
                                  dist.is_distributed)
    run.pipeline = pipeline.for_run(cfg, dist, run.task, run.tok, run.learner.policy, score, run.prm)
    if cfg.train.reuse_warmup_optimizer and start_info.get("optimizer_state"):
        if dist.is_distributed:
            if dist.is_main:
                log_.warning("train.reuse_warmup_optimizer: the Adam hand-over is single-process only; "
                             "skipped (%s, %d processes)", dist.mode, dist.world_size)
        else:
            run.learner.init_optimizer_from(start_info["optimizer_state"])
    run.start_info = start_info
    run.summary.update(params=params, start=start_info, param_mb=param_mb)
    # the shared warm-up (waiting for its lock, building it) and the shared start evaluation
    # are not the algorithm's cost: their own phase, outside the run's wall-clock
    run.summary["setup_seconds"] = {"warmup_wait": start_info.get("wait_seconds", 0.0),
                                    "warmup_build": start_info.get("build_seconds", 0.0)}
    if dist.is_main and cfg.sampling.backend == "vllm":
        log_.warning("sampling.backend=vllm is UNVERIFIED (it has not run on a GPU in this project yet): "
                     "run tests/harness/engine/test_sampler_contract.py on this machine before relying on results")
    if dist.is_main and "cached" in start_info:
        log_.info("starting checkpoint: %s (%s)", start_info.get("source"),
                  "cached warm-up" if start_info["cached"] else
                  f"warm-up trained now in {start_info.get('build_seconds', 0.0):.0f} s")


def _load_models(cfg: Config, algo, task, device, progress: bool, dist: Distributed):
    """(policy, tokenizer, start info, reference or None, critic or None)."""
    if dist.is_distributed:
        _warmup_on_main(cfg, task, device, progress, dist)
    policy, tok, start_info = starting_checkpoint(cfg, task, device, progress and dist.is_main)
    task.bind_tokenizer(tok)
    if cfg.model.lora.enabled:
        if dist.is_distributed:
            raise ConfigError(f"model.lora.rank={cfg.model.lora.rank}: LoRA runs in one process for now "
                              f"({dist.mode}, {dist.world_size} processes)")
        policy = apply_lora(policy, cfg.model.lora)
    # ZeRO-3: partitioned parameters cannot be deep-copied; the reference and critic load other instances
    models = build_models(policy, algo, device, load_copy=(lambda: _fresh_copy(cfg, start_info, tok, device))
                          if dist.zero3 else None)
    return models.policy, tok, start_info, models.reference, models.critic


def _restore(run: _Run, resume: bool) -> None:
    """Resume from the checkpoint (counters, thresholds passed, initial evaluation; metrics
    rows after its step are dropped), or start metrics.jsonl afresh."""
    state = load_checkpoint(run.ckpt, run.dist, run.learner, run.cfg, resume)
    if state is None:
        if run.writer is not None:
            run.writer.truncate_after(-1)
        return
    run.counters = state["counters"]
    run.counters["samples_used"] = int(state.get("samples_used", run.counters["samples"]))  # older: all used
    run.passed = state["passed"]
    run.summary["initial_eval"] = state.get("initial_eval")
    if state.get("initial_val_eval") is not None:
        run.summary["initial_val_eval"] = state["initial_val_eval"]
    if run.writer is not None:
        run.writer.truncate_after(run.counters[STEP])
    run.summary["resumed_from_step"] = run.counters[STEP]
    if run.rm is not None and state.get("reward_model") is not None:
        run.rm.load_state_dict(state["reward_model"])
    run.resumed_pipeline = state.get("pipeline")


def _train_to_budget(run: _Run, progress: bool) -> tuple[dict, list]:
    """Training stages until the budget is reached, evaluating (and checkpointing) at every
    threshold crossed. Returns the last evaluation and the stage times."""
    cfg, counters = run.cfg, run.counters
    unit, amount = cfg.budget.unit, cfg.budget.amount
    per_stage = stage_samples(cfg.train.prompts_per_step, cfg.sampling.samples_per_prompt)
    thresholds = eval_thresholds(cfg.budget, per_stage)
    warning = threshold_warning(cfg.budget, per_stage)
    if warning and run.dist.is_main and run.passed == 0:
        log_.warning(warning)
    bar = tqdm(total=amount, initial=min(consumed(counters, unit), amount), desc=f"{cfg.algo.name} [{unit}]",
               disable=not progress or not run.dist.is_main, dynamic_ncols=True)
    last_eval: dict = {}
    step_times = []
    saved_at = counters["seconds"]  # training seconds at the last resume point (time checkpoints)
    while not budget_reached(cfg.budget, counters):
        row, stats = _stage(run, counters[STEP])
        step_times.append(stats.dt)
        counters[STEP] += 1
        counters["samples"] += stats.n_seqs  # every sample drawn, those dynamic sampling dropped too
        counters["samples_used"] = counters.get("samples_used", counters["samples"] - stats.n_seqs) + (
            stats.n_seqs if stats.n_used is None else stats.n_used)
        counters["tokens"] += stats.n_tokens
        counters["seconds"] += stats.dt
        if run.rm is not None:  # iterative RL: the end of a round retrains the reward model (charged here)
            row.update(run.rm.after_stage(run.learner, counters))
        run.log(row)
        bar.update(min(consumed(counters, unit), amount) - bar.n)
        bar.set_postfix(reward=f"{row['rollout/reward_mean']:.2f}", acc=last_eval.get(f"eval/{run.task.name}/acc", ""))
        crossed = thresholds_passed(thresholds, run.passed, consumed(counters, unit))
        done = budget_reached(cfg.budget, counters)
        if crossed > run.passed or done:
            run.passed = max(crossed, run.passed)
            # say what the bar (full at the end) and the sweep's live table wait on meanwhile
            phase = "final evaluation" if done else "evaluation"
            bar.set_postfix_str(f"{phase}...", refresh=True)
            if run.writer is not None:
                set_phase(run.out, run.summary, phase)
            last_eval = _evaluate_and_checkpoint(run, thresholds[max(run.passed, 1) - 1])
            if run.writer is not None and phase == "evaluation":
                set_phase(run.out, run.summary, None)
            saved_at = counters["seconds"]
        elif _time_checkpoint_due(cfg, counters["seconds"] - saved_at):
            _save_resume_point(run)
            saved_at = counters["seconds"]
    bar.close()
    return last_eval, step_times


def _evaluate_and_checkpoint(run: _Run, threshold: Optional[float] = None) -> dict:
    """Evaluate at the current step; before the end, save the resume point after it. The
    row records the threshold evaluated for (``budget/threshold``) next to the counters."""
    final = budget_reached(run.cfg.budget, run.counters)
    ev = run.evaluate(run.counters[STEP], final)
    run.log(ev if threshold is None else {**ev, "budget/threshold": threshold})
    if not final:
        _save_resume_point(run)
    return ev


def _time_checkpoint_due(cfg: Config, seconds_since: float) -> bool:
    """``train.checkpoint_minutes`` of training (the budget's ``seconds`` counter: the same on
    every rank, so every rank decides alike) have passed since the last resume point (0 = off)."""
    minutes = cfg.train.checkpoint_minutes
    return minutes > 0 and seconds_since >= 60.0 * minutes


def _save_resume_point(run: _Run) -> None:
    """Every rank: the resume point after the current stage (counters, thresholds passed,
    initial evaluation, learner, RNG); resuming from it replays what an uninterrupted run does."""
    state = {"counters": dict(run.counters), "passed": run.passed, "initial_eval": run.summary["initial_eval"],
             "initial_val_eval": run.summary.get("initial_val_eval"),
             "samples_used": run.counters.get("samples_used", run.counters["samples"])}
    if run.rm is not None:
        state["reward_model"] = run.rm.state_dict()
    if run.pipeline is not None:
        state["pipeline"] = run.pipeline.state_dict()
    save_checkpoint(run.ckpt, run.dist, run.learner, run.cfg, state)


@dataclass
class _StageStats:
    """Rollout statistics of one stage, over every rank (padding excluded)."""
    rewards: torch.Tensor
    lens: torch.Tensor
    finished: list
    n_seqs: int
    n_tokens: int
    dt: float  # stage seconds (the slowest rank's)
    gen_seconds: float
    step_rewards: list  # flat process rewards (with a PRM)
    short: list = field(default_factory=list)  # per sequence: fewer steps than needed (tasks that know)
    logprob_sum: float = 0.0  # sampled tokens' log-probs under the sampling distribution, summed
    flops: Optional[float] = None  # the stage's model FLOPs (harness.train.flops), None where not counted
    n_used: Optional[int] = None  # samples the learner trained on (n_seqs but for groups dynamic sampling dropped)


def _stage_prompts(run: _Run, k: int):
    """Stage ``k``'s prompts (a function of seed and k; with a samples budget the last stage
    is cut to land on it), this rank's shard of them and the mask of real (unpadded) samples."""
    cfg, dist = run.cfg, run.dist
    G = cfg.sampling.samples_per_prompt
    problems = stage_problems(run.task, cfg.seed, k, stage_prompt_count(cfg, run.counters["samples"]))
    valid = None
    if dist.is_distributed:  # whole prompts (groups) per rank; equal shard sizes, padding flagged
        n_mine = len(problems[dist.rank::dist.world_size])
        problems = dist.shard(problems, pad=True)
        valid = torch.arange(len(problems) * G) < n_mine * G
    return problems, valid


def _stage(run: _Run, k: int) -> tuple[dict, _StageStats]:
    """One training stage (:func:`harness.train.stage.run_stage`: sample, score, learn), then the
    non-finite check and the reference reset when due. Returns its metrics row and statistics, which
    describe every sample drawn (those dynamic sampling dropped too: the budget is charged for them)."""
    cfg, task = run.cfg, run.task
    t_stage = time.perf_counter()
    problems, valid = _stage_prompts(run, k)
    scorer = score if run.rm is None else run.rm.scorer(score)  # a reward model: what the learner is given
    ahead = run.pipeline.take(k) if run.pipeline is not None else None  # sampled min(k, staleness) updates ago
    st = run_stage(run.learner, cfg, task, run.tok, k, problems, scorer, perf=run.perf, dist=run.dist, prm=run.prm,
                   valid=valid, progress=consumed(run.counters, cfg.budget.unit) / cfg.budget.amount,
                   more_prompts=lambda r, drawn: _more_prompts(run, drawn),
                   drawn=ahead.draw if ahead is not None else None,
                   staleness=k - ahead.version if ahead is not None else None)
    _check_finite(run, st.metrics, k)
    if ref_reset_due(k, cfg.algo.ref_reset_every):
        run.learner.reset_reference()
    if ahead is not None:  # version k + 1 to the sampler, the next stage queued
        run.pipeline.handover(k + 1, run.learner.policy)
    dt = time.perf_counter() - t_stage
    secs = run.perf.pop_seconds()
    if ahead is not None:  # the sampler's seconds on this stage (in its thread) and the learner's wait for them
        secs.update(generate=ahead.seconds, sample_wait=run.pipeline.wait_seconds)
    drawn = st.all_drawn
    rewards, steps, rm_row = (drawn.rewards, drawn.step_rewards, {}) if run.rm is None else run.rm.take_exact()
    kept = float(st.metrics.get("train/kept_fraction", 1.0))
    flops = drawn_stage_flops(cfg, run.learner, st.rollouts, st.drawn.rollouts if st.drawn else None, kept)
    stats = _stage_stats(run, drawn.rollouts, rewards, steps, valid, dt, secs,
                         short_outputs(task, drawn.problems_rep, drawn.rollouts), flops)
    stats.n_used = stats.n_seqs if st.drawn is None else st.rollouts.num_sequences
    return {**_stage_row(st.metrics, stats, secs, cfg.sampling.samples_per_prompt, run.prm is not None), **rm_row}, stats


def _more_prompts(run: _Run, drawn: int) -> int:
    """Prompts a further draw of dynamic sampling may take once the stage drew ``drawn`` samples: a full
    stage's, cut (with a samples budget) to what the budget has left, as :func:`_stage_prompts` cuts."""
    cfg = run.cfg
    G, P = cfg.sampling.samples_per_prompt, cfg.train.prompts_per_step
    if cfg.budget.unit != "samples":
        return P
    left = cfg.budget.amount - run.counters["samples"] - drawn
    return min(P, math.ceil(left / G)) if left > 0 else 0


def _check_finite(run: _Run, tm: dict, k: int) -> None:
    """Fail the run (FloatingPointError naming the step) at the first non-finite loss,
    gradient norm or weight after a stage, whatever the algorithm: a run that "finishes" with
    NaN weights is worse than one that stops. Under several processes the main rank's
    verdict is every rank's (they raise together)."""
    bad = [f"{key}={v}" for key, v in tm.items()
           if ("loss" in key or "grad_norm" in key) and isinstance(v, float) and not math.isfinite(v)]
    for name in ("policy", "critic"):
        model = getattr(run.learner, name, None)
        if isinstance(model, torch.nn.Module):
            counts = [(~torch.isfinite(p.detach())).sum() for p in model.parameters()
                      if p.is_floating_point() and p.numel()]
            n = int(torch.stack(counts).sum()) if counts else 0  # one device sync per model
            if n:
                bad.append(f"{n} non-finite {name} weight(s)")
    if run.dist.is_distributed:
        bad = run.dist.broadcast_object(bad)
    if bad:
        raise FloatingPointError(f"non-finite training state after step {k + 1}: {', '.join(bad)} "
                                 f"(train.lr={run.cfg.train.lr}); try a lower train.lr or check the rewards")


def _stage_stats(run: _Run, ro, rewards, step_rewards, valid, dt: float, secs: dict,
                 short: list = (), flops: Optional[float] = None) -> _StageStats:
    """This stage's rollout statistics; under several processes gathered from every rank."""
    need_steps = run.prm is not None
    if not run.dist.is_distributed:
        return _StageStats(rewards, ro.lengths.float(), ro.finished, ro.num_sequences, ro.num_tokens, dt,
                           secs.get("generate", 1e-9),
                           [r for s in step_rewards for r, _ in s] if need_steps else [], list(short),
                           float((ro.logprobs * ro.completion_mask).sum().item()), flops)
    nv = int(valid.sum().item())
    parts = run.dist.gather_objects({
        "rewards": rewards[:nv].tolist(), "lens": ro.lengths.float()[:nv].tolist(),
        "finished": list(ro.finished[:nv]), "tokens": int(ro.completion_mask[:nv].sum().item()), "dt": dt,
        "gen": secs.get("generate", 0.0),
        "step_rewards": [r for s in step_rewards[:nv] for r, _ in s] if need_steps else [],
        "short": list(short)[:nv], "logprob_sum": float((ro.logprobs * ro.completion_mask)[:nv].sum().item()),
        "flops": flops})
    finished = [x for p in parts for x in p["finished"]]
    return _StageStats(rewards=torch.tensor([x for p in parts for x in p["rewards"]], dtype=torch.float32),
                       lens=torch.tensor([x for p in parts for x in p["lens"]], dtype=torch.float32),
                       finished=finished, n_seqs=len(finished), n_tokens=sum(p["tokens"] for p in parts),
                       dt=max(p["dt"] for p in parts),  # the same on every rank: budgets in seconds agree
                       gen_seconds=max(p["gen"] for p in parts),
                       step_rewards=[x for p in parts for x in p["step_rewards"]],
                       short=[x for p in parts for x in p["short"]], logprob_sum=sum(p["logprob_sum"] for p in parts),
                       flops=None if any(p["flops"] is None for p in parts) else sum(p["flops"] for p in parts))


def _stage_row(tm: dict, stats: _StageStats, secs: dict, G: int, need_steps: bool) -> dict:
    """The metrics row of a stage (the counters are prepended when it is logged)."""
    rewards = stats.rewards
    row = {**tm,
           "rollout/reward_mean": rewards.mean().item(),
           "rollout/reward_std": rewards.std(unbiased=False).item(),
           "rollout/solve_rate_any": rewards.view(-1, G).max(1).values.mean().item(),
           "rollout/len_mean": stats.lens.mean().item(),
           "rollout/truncated_frac": 1.0 - float(np.mean(stats.finished)),
           "rollout/zero_variance_frac": zero_variance_share(rewards, G),
           "rollout/samples_drawn": stats.n_seqs,
           "rollout/samples_used": stats.n_seqs if stats.n_used is None else stats.n_used,
           "perf/step_seconds": stats.dt,
           "perf/gen_tokens_per_s": stats.n_tokens / max(stats.gen_seconds, 1e-9)}
    if stats.flops is not None:
        row["perf/flops"] = stats.flops
    row.update({f"perf/{k2}_seconds": v for k2, v in secs.items()})
    if need_steps:
        row["rollout/step_reward_mean"] = float(np.mean(stats.step_rewards)) if stats.step_rewards else 0.0
    if stats.short:  # tasks that know how many steps a problem needs (arith)
        row["rollout/short_frac"] = float(np.mean(stats.short))
    # an estimate, not the exact entropy: mean -log pi(token) over the sampled tokens (EOS included)
    # under the sampling distribution (logits / T, before any top-p cut)
    row["rollout/entropy_est"] = -stats.logprob_sum / max(stats.n_tokens, 1)
    return row


def _validation_eval(run: _Run, start: bool = False) -> dict:
    """Greedy scores of the policy on the task's validation split (collective, like :meth:`_Run.evaluate`); keys as
    an evaluation row's (``eval/<task>/acc``). Records: ``<task>_validation.jsonl`` at the end,
    ``<task>_validation_start.jsonl`` at the ``start``."""
    cfg, dist = run.cfg, run.dist
    with dist.gathered(run.learner.policy) as m:
        ev = None
        if dist.is_main:
            with run.perf.phase("eval"):
                ev = run_evaluation(m, run.tok, run.task, run.task.validation_problems(), greedy=True, n=0,
                                    max_new_tokens=cfg.eval.max_new_tokens or cfg.sampling.max_new_tokens,
                                    seed=stage_seed(cfg.seed, 2 * 10**6), batch_size=cfg.eval.batch_size,
                                    out_path=run.out / "eval" / (run.task.name + (VALIDATION_START if start
                                                                                  else "_validation.jsonl")))
        dist.barrier()
    return dist.broadcast_object(ev)


def _finalize(run: _Run, last_eval: dict, step_times: list) -> None:
    """Log the performance summary, record the end in the summary, save the final model,
    drop the resume state."""
    dist, out = run.dist, run.out
    if run.cfg.eval.validation:
        run.summary["final_val_eval"] = _validation_eval(run)
    perf_summary = run.perf.summary()
    perf_summary["perf/warmup_step_seconds"] = step_times[0] if step_times else 0.0
    perf_summary["perf/step_seconds_mean"] = float(np.mean(step_times[1:] or step_times or [0.0]))
    run.log(perf_summary)
    record_end(run.summary, run.counters, last_eval, perf_summary, elapsed=time.monotonic() - run.t_start)
    if run.rm is not None:  # its work apart from RL's (already in the budget counters)
        run.summary["reward_model"] = run.rm.report()
    cfg = run.cfg  # overshoot bound: one stage (tokens: every sample at max_new_tokens)
    bound = {"tokens": stage_samples(cfg.train.prompts_per_step, cfg.sampling.samples_per_prompt)
             * cfg.sampling.max_new_tokens, "seconds": max(step_times, default=None)}.get(cfg.budget.unit)
    if cfg.algo.drop_zero_variance:  # a stage may draw 1 + max_resample batches
        bound = bound * (1 + cfg.algo.max_resample) if cfg.budget.unit == "tokens" else bound
    run.summary["budget"]["overshoot"] = overshoot(cfg.budget, run.counters, bound)
    run.summary["budget"]["samples_drawn"] = run.counters["samples"]  # what the budget was charged
    run.summary["budget"]["samples_used"] = run.counters.get("samples_used", run.counters["samples"])
    if run.cfg.train.save_final_model:
        with dist.gathered(run.learner.policy) as m:  # collective under ZeRO-3; the main rank writes
            if dist.is_main:
                # safetensors reports a full disk as SafetensorError; staged: the folder appears only whole (a
                # merged model without its adapter, or weights without a tokenizer, would load as the policy)
                with writing(out / "final_model"), staged(out / "final_model") as stage:
                    save_policy(m, run.tok, stage)
            dist.barrier()
        run.summary["final_model"] = str(out / "final_model")
    dist.barrier()
    remove_checkpoint(run.ckpt, dist)
