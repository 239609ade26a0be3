"""What a run evaluates at a budget point: the held-out set, the out-of-domain set, and the cached start.

At every evaluation point the policy is scored greedily on the task's held-out problems
(``eval/<task>/acc``). At the start and at the end (``final``) it also draws ``eval.n``
samples per problem for pass@k / maj@k (on the first ``eval.sample_problems`` problems
when set: ``eval/<task>/sample_problems`` says how many), and, with ``eval.ood.enabled``,
scores the out-of-domain set the same way under ``eval/<task>_ood/...``.

The start evaluation depends only on the starting checkpoint, the evaluation settings and
the seed, not on the algorithm: for a cached warm-up it is computed once and kept next
to the checkpoint (``<warm-up dir>/initial_eval/<key>/``, written atomically under a file
lock), so every algorithm of one seed reads the same numbers and per-problem records. A run with
``eval.validation`` also scores its start on the validation split (greedy), cached the same way in an entry of its
own (``<key>-validation/``).
The entry's ``source.json`` records the digest of the checkpoint it describes
(:func:`harness.train.warmup.checkpoint_digest`) and of each of its own files
(``metrics.json``, the records): an entry whose checkpoint or content no longer matches
(edited, or left from other weights) is recomputed, with a warning, never trusted. A write
of the entry that fails (a full disk) leaves no partial entry behind.
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
from harness.config.schema import Config, config_hash, ood_task_spec
from harness.engine.evaluate import evaluate as run_evaluation
from harness.foundation.base import to_dict
from harness.foundation.files import file_sha256, writing
from harness.rundir.layout import RunFileError, load_json
from harness.rundir.lock import file_lock
from harness.train.warmup import checkpoint_digest

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
              seed=seed, batch_size=ec.batch_size, progress=progress)
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
    merged = {**sampled, **out}
    merged[f"{ns}/seconds"] = sampled[f"{ns}/seconds"] + out.get(f"{ns}/seconds", 0.0)  # both passes' time
    return merged


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


def initial_eval_settings(cfg: Config) -> dict:
    """What the start evaluation depends on besides the checkpoint and the thread count in force:
    the task, the evaluation settings, the completion limit, the seed where samples are drawn (``eval.n``; a
    greedy-only evaluation draws nothing, so every seed of a shared warm-up reads one entry) and the numerics
    (mode, device, dtype). Not LoRA: its adapters start at B = 0, so they add exact zeros to every projection and
    the start's values are the checkpoint's, bit for bit."""
    settings = {"task": to_dict(cfg.task), "eval": to_dict(cfg.eval),
                "max_new_tokens": cfg.sampling.max_new_tokens, "device": cfg.device,
                "numerics": cfg.numerics, "dtype": cfg.model.dtype}
    if cfg.eval.n:
        settings["seed"] = cfg.seed
    return settings


def initial_eval_key(cfg: Config) -> str:
    """The start evaluation's cache key: `initial_eval_settings` and the thread count in force."""
    return config_hash({**initial_eval_settings(cfg), "threads": torch.get_num_threads(), "v": 2}, 12)


def _cache_dir(cfg: Config, start_info: dict, part: str = "test") -> Optional[Path]:
    """Where the start evaluation's ``part`` (`START_PARTS`) is cached: beside a cached warm-up checkpoint (the tiny
    model's or a pretrained model's), else nowhere."""
    src = start_info.get("source")
    if not src or not (Path(src) / "warmup.json").exists():
        return None
    return Path(src) / "initial_eval" / (initial_eval_key(cfg) + START_PARTS[part][0])


SOURCE = "source.json"
METRICS_FILE = "metrics.json"
VALIDATION_START = "_validation_start.jsonl"  # <task>_validation_start.jsonl: the start's validation records
# part -> (suffix of the cache entry's folder name, which of the run's eval/ records the entry keeps)
START_PARTS = {"test": ("", lambda name: name.endswith("_0.jsonl") or name.endswith("_0_samples.jsonl")),
               "validation": ("-validation", lambda name: name.endswith(VALIDATION_START))}


def _cache_problem(cache: Path, checkpoint: str) -> Optional[str]:
    """Why a cached start evaluation cannot be trusted (None when it can): its ``source.json``
    must name the checkpoint digest ``checkpoint`` and the digest of every file it holds."""
    try:
        source = load_json(cache / SOURCE)
    except FileNotFoundError:
        return f"it has no {SOURCE}"
    except (RunFileError, OSError) as e:
        return f"{SOURCE} {getattr(e, 'problem', None) or e}"
    files = source.get("files_sha256")
    if not isinstance(source.get("checkpoint_sha256"), str) or not isinstance(files, dict) or METRICS_FILE not in files:
        return f"{SOURCE} lists no digests (written before entries were checked, or edited)"
    if source["checkpoint_sha256"] != checkpoint:
        return "it describes another checkpoint (the warm-up weights changed)"
    present = {f.name for f in cache.iterdir() if f.name != SOURCE}
    if present != set(files):
        return f"its files are not the ones it recorded ({', '.join(sorted(present ^ set(files)))})"
    for name, digest in sorted(files.items()):
        f = cache / name
        if not f.is_file() or file_sha256(f) != digest:
            return f"{name} was changed since it was computed"
    return None


def _read_cache(cache: Path, checkpoint: str, out_dir: Path) -> Optional[dict]:
    """The cached start evaluation (its records copied into ``out_dir/eval``) when it can be
    trusted, else None (with a warning when there is an entry that cannot)."""
    if not os.path.lexists(cache):
        return None
    problem = _cache_problem(cache, checkpoint) if cache.is_dir() else "it is not a folder"
    ev = None
    if problem is None:
        try:
            ev = load_json(cache / METRICS_FILE)
        except (RunFileError, OSError) as e:
            problem = f"{METRICS_FILE} {getattr(e, 'problem', None) or e}"
    if problem is not None:
        log_.warning("cached start evaluation %s is not used: %s; recomputing it", cache, problem)
        return None
    (out_dir / "eval").mkdir(parents=True, exist_ok=True)
    for f in sorted(cache.glob("*.jsonl")):
        shutil.copyfile(f, out_dir / "eval" / f.name)
    log_.info("start evaluation read from %s", cache)
    return ev


def _write_cache(cache: Path, checkpoint: str, out_dir: Path, ev: dict, seconds: float, part: str) -> None:
    """Store ``ev`` and the run's start records of ``part`` as the cache entry (replacing an untrusted one):
    written into ``<key>.tmp<pid>`` and renamed into place; a write that fails removes it."""
    tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
    old = cache.with_name(cache.name + f".old{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with writing(tmp):
            tmp.mkdir(parents=True)
            keep = START_PARTS[part][1]
            for f in sorted(p for p in (out_dir / "eval").glob("*.jsonl") if keep(p.name)):
                shutil.copyfile(f, tmp / f.name)
            (tmp / METRICS_FILE).write_text(json.dumps(ev))
            files = {f.name: file_sha256(f) for f in sorted(tmp.iterdir())}
            (tmp / SOURCE).write_text(json.dumps({"computed_by": str(out_dir), "seconds": seconds,
                                                  "checkpoint_sha256": checkpoint, "files_sha256": files}))
            if os.path.lexists(cache):  # an entry that was not trusted: replaced
                os.replace(cache, old)
            os.replace(tmp, cache)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.lexists(old) and not os.path.lexists(cache):
            os.replace(old, cache)
        raise
    finally:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        elif os.path.lexists(old):
            old.unlink()


def cached_initial_eval(cfg: Config, start_info: dict, out_dir: Path, compute: Callable[[], dict],
                        part: str = "test") -> dict:
    """The start evaluation's ``part``: ``"test"`` (the held-out and out-of-domain scores, records
    ``<task>_0.jsonl`` ...) or ``"validation"`` (the greedy scores on the validation split, records
    ``<task>_validation_start.jsonl``; a run with ``eval.validation``). Read from the warm-up's cache (its records
    copied into ``out_dir/eval``) when the entry's digests match the checkpoint and its content, or computed by
    ``compute()`` and stored there for the next run. Each part is an entry of its own
    (``<key>`` and ``<key>-validation``)."""
    cache = _cache_dir(cfg, start_info, part)
    if cache is None:
        return compute()
    cache.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(cache.with_name(cache.name + ".lock")):
        for stale in cache.parent.glob(cache.name + ".tmp*"):  # left by a process killed mid-write
            shutil.rmtree(stale, ignore_errors=True)
        checkpoint = checkpoint_digest(Path(start_info["source"]))
        ev = _read_cache(cache, checkpoint, out_dir)
        if ev is not None:
            return ev
        t0 = time.monotonic()
        ev = compute()
        _write_cache(cache, checkpoint, out_dir, ev, time.monotonic() - t0, part)
        return ev
