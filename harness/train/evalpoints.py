"""What a run evaluates at a budget point: the held-out set, the out-of-domain set, and the cached start.

At every evaluation point the policy is scored greedily on the task's held-out problems
(``eval/<task>/acc``). At the start and at the end (``final``) it also draws ``eval.n``
samples per problem for pass@k / maj@k (on the first ``eval.sample_problems`` problems
when set: ``eval/<task>/sample_problems`` says how many), and, with ``eval.ood.enabled``,
scores the out-of-domain set the same way under ``eval/<task>_ood/...``.

The start evaluation depends only on the starting checkpoint, the evaluation settings and
the seed, not on the algorithm: for a cached warm-up it is computed once and kept next
to the checkpoint (``<warm-up dir>/initial_eval/<key>/``, written atomically under a file
lock), so every algorithm of one seed reads the same numbers and per-problem records.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from evals.catalog import get_task
from harness.config.base import to_dict
from harness.config.schema import Config, config_hash, ood_task_spec
from harness.engine.evaluate import evaluate as run_evaluation
from harness.rundir.lock import file_lock

log_ = logging.getLogger(__name__)

OOD_SUFFIX = "_ood"
EVAL_SEED_OFFSET = 10**6  # evaluation at step s samples with stage_seed(seed, EVAL_SEED_OFFSET + s)


def ood_task(cfg: Config):
    """The out-of-domain task (named ``<task>_ood``), or None when ``eval.ood`` is off."""
    if not cfg.eval.ood.enabled:
        return None
    task = get_task(ood_task_spec(cfg))
    task.name = task.name + OOD_SUFFIX
    return task


def _score(model, tok, task, cfg: Config, seed: int, out_dir: Path, step: int, n: int, progress: bool) -> dict:
    """Greedy over every held-out problem; the n samples over the first eval.sample_problems."""
    ec = cfg.eval
    kw = dict(temperature=ec.temperature, max_new_tokens=ec.max_new_tokens or cfg.sampling.max_new_tokens,
              seed=seed, batch_size=256, progress=progress)
    problems = list(task.eval_problems())
    subset = problems[:ec.sample_problems] if ec.sample_problems else problems
    if not n or len(subset) == len(problems):
        return run_evaluation(model, tok, task, problems, greedy=ec.greedy, n=n,
                              out_path=out_dir / "eval" / f"{task.name}_{step}.jsonl", **kw)
    out = run_evaluation(model, tok, task, problems, greedy=ec.greedy, n=0,
                         out_path=out_dir / "eval" / f"{task.name}_{step}.jsonl", **kw) if ec.greedy else {}
    sampled = run_evaluation(model, tok, task, subset, greedy=False, n=n,
                             out_path=out_dir / "eval" / f"{task.name}_{step}_samples.jsonl", **kw)
    ns = f"eval/{task.name}"
    sampled[f"{ns}/sample_problems"] = sampled.pop(f"{ns}/num_problems")
    return {**sampled, **out}


def evaluate_point(model, tok, task, cfg: Config, step: int, out_dir: Path, final: bool, seed: int,
                   ood: Optional[object] = None, progress: bool = False) -> dict:
    """Metrics of one evaluation point (see the module doc); ``final`` marks the start and
    the end, where the n samples and the out-of-domain set are drawn."""
    ec = cfg.eval
    n = ec.n if (final or not ec.final_only_samples) else 0
    ev = _score(model, tok, task, cfg, seed, out_dir, step, n, progress)
    if ood is not None and final:
        ev.update(_score(model, tok, ood, cfg, seed + 1, out_dir, step, n, progress))
    return ev


# --------------------------------------------------------------------------- the shared start evaluation


def initial_eval_key(cfg: Config) -> str:
    """What the start evaluation depends on besides the checkpoint: the task, the evaluation
    settings, the completion limit, the seed (sampling seeds) and the numerics (mode, device,
    the thread count in force)."""
    return config_hash({"task": to_dict(cfg.task), "eval": to_dict(cfg.eval), "seed": cfg.seed,
                        "max_new_tokens": cfg.sampling.max_new_tokens, "device": cfg.device,
                        "threads": torch.get_num_threads(),
                        "numerics": cfg.numerics, "dtype": cfg.model.dtype, "v": 2}, 12)


def _cache_dir(cfg: Config, start_info: dict) -> Optional[Path]:
    """Where the start evaluation is cached: beside a cached warm-up checkpoint, else nowhere."""
    src = start_info.get("source")
    if cfg.model.name_or_path != "tiny" or not src or not (Path(src) / "warmup.json").exists():
        return None
    return Path(src) / "initial_eval" / initial_eval_key(cfg)


def cached_initial_eval(cfg: Config, start_info: dict, out_dir: Path, compute: Callable[[], dict]) -> dict:
    """The start evaluation: read from the warm-up's cache (its records copied into
    ``out_dir/eval``), or computed by ``compute()`` and stored there for the next run."""
    cache = _cache_dir(cfg, start_info)
    if cache is None:
        return compute()
    cache.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(cache.with_name(cache.name + ".lock")):
        if (cache / "metrics.json").exists():
            (out_dir / "eval").mkdir(parents=True, exist_ok=True)
            for f in sorted(cache.glob("*.jsonl")):
                shutil.copyfile(f, out_dir / "eval" / f.name)
            log_.info("start evaluation read from %s", cache)
            return json.loads((cache / "metrics.json").read_text())
        t0 = time.time()
        ev = compute()
        tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in sorted((out_dir / "eval").glob("*_0.jsonl")) + sorted((out_dir / "eval").glob("*_0_samples.jsonl")):
            shutil.copyfile(f, tmp / f.name)
        (tmp / "metrics.json").write_text(json.dumps(ev))
        (tmp / "source.json").write_text(json.dumps({"computed_by": str(out_dir), "seconds": time.time() - t0}))
        os.replace(tmp, cache)
        return ev
