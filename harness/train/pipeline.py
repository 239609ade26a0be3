"""The pipelined sampler: the rollouts of step t drawn with the weights after step max(0, t - k), in a thread of its own while the learner trains.

``train.staleness`` = k >= 1 (or a sampler of another precision, ``sampling.dtype``): the sampler holds
a copy of the policy (in ``sampling.dtype`` where set) and a queue of stages. Weights version v are
the policy's after v updates (v = 0: the start). Stage s is sampled with version ``max(0, s - k)``
(its *actual staleness* ``min(s, k)``), from its own prompts and seed (:func:`stage_problems`,
:func:`stage_seed`, as the on-policy loop's), so what a stage draws is a function of (seed, s, the
weights of that version) alone: a run is the same whatever the timing of the two threads.

The hand-over: after update t the learner hands version t + 1 (a copy of its weights) over and stage
t + 1 + k is queued behind the ones already in flight; the learner then waits for stage t + 1, which
version max(0, t + 1 - k) sampled while it trained on the earlier ones. With k = 0 there is nothing
to overlap (sampling.dtype alone), and the ``paged`` backend samples from torch's global generator,
which the learner's thread seeds: both draw each stage in the learner's thread when it is taken,
from the same version.

Resume: the checkpoint holds the versions the stages not yet trained on need
(:meth:`Pipeline.state_dict`: the last k versions before the current policy, which is saved anyway);
a resumed run queues those stages again from them, so they draw exactly what they drew before.

Threads: the sampler thread runs torch on ``sampling.threads`` intra-op threads (its own OpenMP count, set for
that thread alone: :func:`own_threads`; 0: half the run's, at least 1), the learner keeps the run's. Scoring
runs in the sampler thread too. Both threads share one interpreter, so they overlap where torch releases the
GIL (inside kernels), not in the Python of the decode loop.
"""
from __future__ import annotations

import copy
import ctypes
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from harness.engine.sampling import sample
from harness.foundation.base import ConfigError
from harness.train.stage import Draw, stage_problems, stage_prompt_count, stage_seed

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def behaviour_version(stage: int, k: int) -> int:
    """The weights version (updates done) that samples stage ``stage`` under staleness ``k``."""
    return max(0, stage - k)


def sampler_threads(cfg) -> int:
    """The sampler thread's torch threads: ``sampling.threads``, or half the run's (at least 1)."""
    return cfg.sampling.threads or max(1, torch.get_num_threads() // 2)


@dataclass
class Drawn:
    """A stage the sampler drew: the draw, the weights version that drew it, and its seconds."""
    draw: Draw
    version: int
    seconds: float


class Pipeline:
    """Stages sampled ahead with stale weights (the module doc). ``score(task, problems_rep, rollouts,
    prm)``: the run's scorer. Call :meth:`start` at the first stage to run, :meth:`take` for each stage,
    :meth:`handover` after each update, :meth:`close` at the end."""

    def __init__(self, cfg, task, tok, policy, score: Callable, prm=None, concurrent: bool = True):
        self.cfg, self.task, self.tok, self.score, self.prm = cfg, task, tok, score, prm
        self.k = cfg.train.staleness
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)
        if cfg.sampling.dtype:
            self.model.to(_DTYPES[cfg.sampling.dtype])
        self.versions: dict[int, dict] = {}  # version -> weights (CPU copies), those a stage not yet trained needs
        self.jobs: dict = {}  # stage -> a Future of its Drawn (or a _Later without a sampler thread)
        self.samples_before: dict[int, float] = {}  # stage -> samples drawn before it (the budget's cut)
        self.next_stage = 0
        self.threads = sampler_threads(cfg)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="sampler") if concurrent else None
        if self.pool is not None:  # the sampler thread's own count (what took effect)
            self.threads = self.pool.submit(own_threads, self.threads).result()
        self.wait_seconds = 0.0

    # -- the queue ----------------------------------------------------------------------------------------------
    def start(self, step: int, policy, samples: float, saved: Optional[dict] = None) -> None:
        """Queue stages ``step`` .. ``step + k``: the current ``policy`` is version ``step``, the older versions
        come from ``saved`` (a resumed run's :meth:`state_dict`; a run at step 0 needs none)."""
        self.versions = {int(v): w for v, w in (saved or {}).get("versions", {}).items()}
        self.versions[step] = _copy(policy)
        need = {behaviour_version(s, self.k) for s in range(step, step + self.k + 1)}
        missing = sorted(need - set(self.versions))
        if missing:
            raise RuntimeError(f"the checkpoint lacks the sampler's weights of version(s) {missing} (train.staleness="
                               f"{self.k}): restart the run")
        self.next_stage, self.samples_before = step, {step: samples}
        for _ in range(self.k + 1):
            self._queue()

    def _queue(self) -> None:
        """Queue the next stage with its version, unless a samples budget is already spent before it."""
        s, cfg = self.next_stage, self.cfg
        before = self.samples_before[s]
        if cfg.budget.unit == "samples" and before >= cfg.budget.amount:
            return
        n = stage_prompt_count(cfg, before)
        self.samples_before[s + 1] = before + n * cfg.sampling.samples_per_prompt
        problems = stage_problems(self.task, cfg.seed, s, n)
        v = behaviour_version(s, self.k)
        weights = self.versions[v]
        self.jobs[s] = (self.pool.submit(self._draw, s, v, weights, problems) if self.pool is not None
                        else _Later(lambda: self._draw(s, v, weights, problems)))
        self.next_stage = s + 1

    def take(self, stage: int) -> Drawn:
        """Stage ``stage``'s draw, waiting for the sampler where it is not done yet."""
        t0 = time.perf_counter()
        drawn = self.jobs.pop(stage).result()
        self.wait_seconds = time.perf_counter() - t0
        return drawn

    def handover(self, step: int, policy) -> None:
        """After update ``step - 1``: ``policy`` is version ``step``; queue the next stage, drop the versions no
        stage to come needs."""
        self.versions[step] = _copy(policy)
        self._queue()
        keep = behaviour_version(step, self.k)
        self.versions = {v: w for v, w in self.versions.items() if v >= keep}

    def state_dict(self) -> dict:
        """What a resume needs besides the policy: the versions older than the current one that the stages not yet
        trained on are sampled with."""
        last = max(self.versions)
        return {"versions": {v: w for v, w in self.versions.items() if v != last}}

    def close(self) -> None:
        if self.pool is not None:
            for f in self.jobs.values():
                f.cancel()
            self.pool.shutdown(wait=True)
            self.pool = None
        self.jobs.clear()

    # -- the sampler thread -------------------------------------------------------------------------------------
    def _draw(self, stage: int, version: int, weights: dict, problems: list) -> Drawn:
        """Sample and score ``problems`` with weights ``version`` (the sampler thread)."""
        cfg, sc = self.cfg, self.cfg.sampling
        t0 = time.perf_counter()
        self.model.load_state_dict(weights)
        G = sc.samples_per_prompt
        ro = sample(self.model, self.tok, [self.task.format_prompt(p) for p in problems], n=G,
                    max_new_tokens=sc.max_new_tokens, temperature=sc.temperature, top_p=sc.top_p,
                    seed=stage_seed(cfg.seed, stage), offsets=self.prm is not None, backend=sc.backend)
        ro.logprobs = ro.logprobs.float()
        reps = [p for p in problems for _ in range(G)]
        rewards, step_rewards = self.score(self.task, reps, ro, self.prm)
        return Drawn(Draw(ro, reps, rewards, step_rewards), version, time.perf_counter() - t0)


def for_run(cfg, dist, task, tok, policy, score: Callable, prm=None) -> Optional[Pipeline]:
    """The run's pipelined sampler where ``train.staleness`` >= 1 or ``sampling.dtype`` is set (one process
    only); None for the on-policy loop."""
    if not (cfg.train.staleness or cfg.sampling.dtype):
        return None
    if dist is not None and dist.is_distributed:
        raise ConfigError(f"train.staleness={cfg.train.staleness} / sampling.dtype={cfg.sampling.dtype} is invalid "
                          f"with {dist.world_size} processes: the pipelined sampler runs in one process only")
    # the paged sampler draws from torch's global generator (saved and restored around its call), which the
    # learner's thread seeds every stage: it samples in the learner's thread, at take(), the same stages and weights
    return Pipeline(cfg, task, tok, policy, score, prm,
                    concurrent=cfg.train.staleness > 0 and cfg.sampling.backend != "paged")


def _openmp():
    """The OpenMP runtime torch runs on (its libgomp, found among this process's mapped libraries), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libgomp" in line or "libiomp" in line or "libomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def own_threads(n: int) -> int:
    """In the calling (sampler) thread: run torch's intra-op work on ``n`` OpenMP threads, leaving the other
    threads' count alone. ``torch.set_num_threads`` would not do: it also sets the process-wide count the learner
    reads. torch's per-thread initialisation runs first, then OpenMP's count of this thread alone
    (``omp_set_num_threads`` sets the calling thread's). Returns the count in force here (the process's where
    no OpenMP runtime is found)."""
    torch.get_num_threads()  # torch's lazy per-thread set-up (it would reset this thread's count afterwards)
    omp = _openmp()
    if omp is not None:
        omp.omp_set_num_threads(int(n))
    return torch.get_num_threads()


def _copy(policy) -> dict:
    """A CPU copy of ``policy``'s weights (the learner's optimizer steps change them in place)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}


class _Later:
    """A stage drawn when it is taken (no sampler thread): what a Future of it would give."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def result(self):
        return self.fn()

    def cancel(self) -> bool:
        return True
