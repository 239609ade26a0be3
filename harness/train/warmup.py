"""Supervised warm-up: the starting ('instruct') checkpoint for the tiny model.

Trains the built-in tiny model from scratch on the task's worked solutions (loss on the
completion only); with ``warmup.pretrained``, a pretrained model (``model.name_or_path``)
is fine-tuned the same way from its loaded weights, every weight (the task's prompts go
through its tokenizer's chat template where the task uses one). The result is cached under
``warmup.cache_dir/<hash>`` where the hash covers exactly what determines the checkpoint (model
shape, task knobs, warm-up settings), not the RL run's seed or algorithm: every run of a sweep starts from the same
weights, and a second quickstart reuses them. A file lock keeps parallel sweep workers
from training it twice.

A cache entry is used only when it is whole (:func:`entry_problem`): ``warmup.json`` a JSON
object naming the entry, the model's config, weights and tokenizer files there, the weights
not cut short, and their digest (:func:`checkpoint_digest`, recorded in ``warmup.json`` when
the entry was built) unchanged. An entry that is not (weights deleted, ``warmup.json``
replaced by ``[1]``, a truncated ``model.safetensors``) is rebuilt, with a warning naming it
and why.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import struct
import time
from pathlib import Path
from typing import Optional

import torch

from evals.catalog import get_task
from harness.config.paths import uses_warmup_cache, warmup_cache_root
from harness.config.schema import Config, config_hash, warmup_long_spec
from harness.engine.models import build_char_tokenizer, build_tiny_model, is_out_of_memory, load_policy, save_policy
from harness.foundation.base import to_dict
from harness.foundation.errors import ModelLoadError
from harness.foundation.files import NO_PERMISSION, NO_SPACE, file_sha256, writing
from harness.foundation.modelfiles import resolve_model_path
from harness.rundir.layout import RunFileError, load_json, save_torch
from harness.rundir.lock import FileLock, file_lock
from harness.train.flops import forward_flops

log_ = logging.getLogger(__name__)

WARMUP_SEED = 0
OPTIMIZER_FILE = "optimizer.pt"
META_FILE = "warmup.json"
MODEL_FILES = ("config.json", "tokenizer_config.json")
"""Files every entry has besides its weights (``model.safetensors`` or ``pytorch_model.bin``)."""
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
NOT_MODEL = (META_FILE, OPTIMIZER_FILE)
"""Files of an entry that do not define the model it describes (left out of its digest)."""


def checkpoint_digest(entry: Path) -> str:
    """sha256 over the name and bytes of every file of a warm-up entry that defines the model
    (weights, config, tokenizer; not ``warmup.json``, the optimizer state or cached
    evaluations), in name order: what a cached start evaluation is checked against."""
    h = hashlib.sha256()
    for f in sorted(Path(entry).iterdir(), key=lambda x: x.name):
        if f.name in NOT_MODEL or f.name.endswith((".lock", ".tmp")) or not f.is_file():
            continue
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()




def _safetensors_problem(path: Path) -> Optional[str]:
    """Why a ``.safetensors`` file is not whole (None when its header and size agree)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} is cut short ({size} bytes)"
            n = struct.unpack("<Q", head)[0]
            if n > min(size - 8, 100 * 2**20):
                return f"{path.name} is cut short or not a safetensors file"
            header = json.loads(f.read(n))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error) as e:
        return f"{path.name} is not a readable safetensors file ({type(e).__name__})"
    if 8 + n + max(ends, default=0) != size:
        return f"{path.name} is cut short ({size} bytes, its header says {8 + n + max(ends, default=0)})"
    return None


def entry_problem(entry: Path) -> Optional[str]:
    """Why a warm-up cache entry cannot be used (None when it can): see the module doc."""
    entry = Path(entry)
    if not entry.is_dir():
        return "it is not a folder"
    try:
        meta = load_json(entry / META_FILE)
    except FileNotFoundError:
        return f"it has no {META_FILE}"
    except (RunFileError, OSError) as e:
        return f"{META_FILE} {getattr(e, 'problem', None) or e}"
    if meta.get("key") not in (None, entry.name):
        return f"{META_FILE} describes entry {meta.get('key')!r}"
    missing = [n for n in MODEL_FILES if not (entry / n).is_file()]
    weights = [entry / n for n in WEIGHT_FILES if (entry / n).is_file()]
    if not weights:
        missing.append(WEIGHT_FILES[0])
    if missing:
        return f"{', '.join(missing)} missing"
    for w in weights:
        if w.suffix == ".safetensors":
            why = _safetensors_problem(w)
            if why:
                return why
    digest = meta.get("digest")
    if isinstance(digest, str) and digest != checkpoint_digest(entry):
        return "its model files changed since it was built (digest mismatch)"
    return _optimizer_problem(entry, meta.get("optimizer_digest"))


def _optimizer_problem(entry: Path, digest) -> Optional[str]:
    """Why the entry's ``optimizer.pt`` is not the one it was built with (None when it is, or when
    the entry predates ``optimizer_digest``: its load is then checked where it is read,
    `harness.engine.learner.adopt_adam_state`)."""
    if not isinstance(digest, str):
        return None
    f = entry / OPTIMIZER_FILE
    if os.path.islink(f) or not f.is_file():
        return f"{OPTIMIZER_FILE} is missing or not a regular file"
    if file_sha256(f) != digest:
        return f"its optimizer state ({OPTIMIZER_FILE}) changed since it was built (digest mismatch)"
    return None


def warmup_seed(cfg: Config) -> int:
    """The warm-up's seed: the run's with ``warmup.per_seed``, else the shared WARMUP_SEED."""
    return cfg.seed if cfg.warmup.per_seed else WARMUP_SEED


def warmup_key(cfg: Config) -> str:
    task = to_dict(cfg.task)
    task.pop("eval_size", None)
    warm = to_dict(cfg.warmup)
    warm.pop("cache_dir", None)
    if warm.pop("per_seed", False):  # absent when off: the keys of shared warm-ups do not change
        warm["seed"] = warmup_seed(cfg)
    model = to_dict(cfg.model)
    model.pop("lora", None)  # the warm-up trains every weight; LoRA starts at RL: one warm-up serves both
    if cfg.model.name_or_path != "tiny":  # warmup.pretrained: the weights it starts from enter the key
        model["start"] = start_fingerprint(cfg.model.name_or_path)
    # the numerics mode enters the key: a checkpoint built in native mode on one CPU kind is
    # never read by a portable run (warm["threads"] is in it already). v4: portable numerics' kernels changed
    # (matrix products from MKL to OpenBLAS, harness.foundation.portable_blas), so no earlier checkpoint is read
    return config_hash({"model": model, "task": task, "warmup": warm, "numerics": cfg.numerics, "v": 4}, 12)


def start_fingerprint(name_or_path: str) -> list:
    """What identifies a pretrained model's files without reading them: the resolved path, and the
    size and mtime of the file (a .gguf) or of every file of the folder (a hub name: itself)."""
    p = Path(resolve_model_path(name_or_path))
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p] if p.is_file() else []
    return [str(p.resolve())] + [[str(f.relative_to(p)) if f != p else f.name, f.stat().st_size,
                                  f.stat().st_mtime_ns] for f in files]


def warmup_dir(cfg: Config) -> Path:
    return warmup_cache_root(cfg) / warmup_key(cfg)


def _locked(path: Path) -> FileLock:
    """Blocking exclusive lock: parallel sweep workers wait for one warm-up instead of training it twice."""
    return file_lock(path)


def sft_batch(tokenizer, prompts: list[str], targets: list[str], device):
    """Left-padded prompt+target+EOS with labels only on target tokens."""
    eos = tokenizer.eos_token_id
    seqs, labels = [], []
    for p, t in zip(prompts, targets):
        p_ids = tokenizer(p)["input_ids"]
        t_ids = tokenizer(t, add_special_tokens=False)["input_ids"] + [eos]
        seqs.append(p_ids + t_ids)
        labels.append([-100] * len(p_ids) + t_ids)
    L = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (L - len(s)) + s for s in seqs], device=device)
    lab = torch.tensor([[-100] * (L - len(s)) + s for s in labels], device=device)
    mask = (torch.arange(L, device=device)[None, :] >= torch.tensor([L - len(s) for s in seqs], device=device)[:, None]).long()
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    return ids, mask, pos, lab


def sft_loss(model, ids, mask, pos, labels):
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, :-1].float()
    tgt = labels[:, 1:]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)


def _warmup_examples(task, long_task, rng: random.Random, w) -> list:
    """One warm-up step's worked solutions: ``examples_per_step`` of the task's, of which each is,
    with probability ``long_share``, one of ``long_task``'s instead (the long ones last). With
    ``long_share`` 0 the generator draws exactly what it always did."""
    if long_task is None:
        return task.sample_train(rng, w.examples_per_step)
    n_long = sum(rng.random() < w.long_share for _ in range(w.examples_per_step))
    return task.sample_train(rng, w.examples_per_step - n_long) + long_task.sample_train(rng, n_long)


def _warmup_batches(cfg: Config, task, tok, device):
    """The warm-up's batches in step order (``sft_batch`` of each step's `_warmup_examples`, drawn
    from the seed's own generator): what :func:`train_warmup` trains on and :func:`warmup_flops`
    counts. The task must be bound to ``tok``."""
    w = cfg.warmup
    long_task = get_task(warmup_long_spec(cfg)) if w.long_share > 0 else None
    rng = random.Random(f"warmup-{warmup_seed(cfg)}")
    for _ in range(w.steps):
        probs = _warmup_examples(task, long_task, rng, w)
        yield sft_batch(tok, [task.format_prompt(p) for p in probs], [p.solution for p in probs], device)


def warmup_flops(cfg: Config, task) -> float:
    """The warm-up's model FLOPs (``harness.train.flops``' count: 3 F per example, a forward and
    its backward, over its real prompt + solution + EOS tokens, padding excluded), over the
    batches :func:`train_warmup` trains on (`_warmup_batches`; nothing is trained)."""
    tok = build_char_tokenizer()
    task.bind_tokenizer(tok)
    model = build_tiny_model(cfg.model, tok, seed=warmup_seed(cfg))
    return sum(3 * forward_flops(model, mask.sum(1)) for _, mask, _, _ in _warmup_batches(cfg, task, tok, "cpu"))


def train_warmup(cfg: Config, task, out: Path, device, progress: bool = True) -> dict:
    """Train the warm-up into ``out`` with ``warmup.threads`` threads (the caller's count is
    restored after), in this process's numerics."""
    prev = torch.get_num_threads()
    torch.set_num_threads(cfg.warmup.threads)
    try:
        return _train_warmup(cfg, task, out, device, progress)
    finally:
        torch.set_num_threads(prev)


def _train_warmup(cfg: Config, task, out: Path, device, progress: bool) -> dict:
    from tqdm.auto import tqdm

    seed = warmup_seed(cfg)
    if cfg.model.name_or_path == "tiny":
        tok = build_char_tokenizer()
        model = build_tiny_model(cfg.model, tok, seed=seed).to(device)
    else:  # warmup.pretrained
        model, tok = load_policy(cfg.model.name_or_path, cfg.model.gguf_file, cfg.model.dtype)
        model = model.to(device)
    task.bind_tokenizer(tok)
    w = cfg.warmup
    opt = torch.optim.AdamW(model.parameters(), lr=w.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm_steps = max(1, min(50, w.steps // 10))

    def lr_at(s):
        if s < warm_steps:
            return w.lr * (s + 1) / warm_steps
        frac = (s - warm_steps) / max(1, w.steps - warm_steps)
        f = w.final_lr_fraction
        return w.lr * (f + (1 - f) * 0.5 * (1 + math.cos(math.pi * frac)))

    torch.manual_seed(seed)
    model.train()
    t0 = time.monotonic()
    bar = tqdm(range(w.steps), desc="warm-up (SFT)", disable=not progress, dynamic_ncols=True)
    ema = None
    for s, batch in zip(bar, _warmup_batches(cfg, task, tok, device)):
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        loss = sft_loss(model, *batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"warm-up loss is {loss.item()} at step {s}; lower warmup.lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if s % 20 == 0:
            bar.set_postfix(loss=f"{ema:.3f}")
    meta = {"key": out.name, "seed": seed, "steps": w.steps, "final_loss": ema, "seconds": time.monotonic() - t0,
            "threads": torch.get_num_threads(), "numerics": cfg.numerics,
            "config": {"model": to_dict(cfg.model), "task": to_dict(cfg.task), "warmup": to_dict(cfg.warmup)}}
    # written beside the cache entry, then renamed into place: a reader never sees half a
    # checkpoint, and a write cut short (a full disk) leaves no ``.tmp`` folder behind
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with writing(tmp):  # safetensors reports a full disk as a SafetensorError
            save_policy(model, tok, tmp)
        save_torch(opt.state_dict(), tmp / OPTIMIZER_FILE)
        meta["digest"] = checkpoint_digest(tmp)
        meta["optimizer_digest"] = file_sha256(tmp / OPTIMIZER_FILE)  # a planted optimizer.pt is never read
        with writing(tmp / META_FILE):
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        _remove_entry(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def ensure_warmup(cfg: Config, task, device, progress: bool = True) -> tuple[Path, dict]:
    """The cached warm-up checkpoint of ``cfg`` (trained now if absent, under the cache entry's
    lock so that concurrent runs build it once): (its folder, its ``warmup.json`` with
    ``cached``, ``wait_seconds`` spent on the lock and ``build_seconds`` spent training it)."""
    out = warmup_dir(cfg)
    t0 = time.monotonic()
    with _locked(out.with_name(out.name + ".lock")):
        waited = time.monotonic() - t0
        problem = entry_problem(out) if os.path.lexists(out) else "absent"
        if problem is None:
            info = load_json(out / META_FILE)
            info["cached"] = True
        else:
            if problem != "absent":
                log_.warning("warm-up cache entry %s is unusable (%s): rebuilding it", out, problem)
            info = train_warmup(cfg, task, out, device, progress)
            info["cached"] = False
    info["wait_seconds"] = waited
    secs = info.get("seconds")
    info["build_seconds"] = 0.0 if info["cached"] or not isinstance(secs, (int, float)) else float(secs)
    return out, info


def _remove_entry(out: Path) -> None:
    """Remove a (broken) cache entry: a folder with what it holds, or anything else at its path."""
    if out.is_dir() and not out.is_symlink():
        shutil.rmtree(out)
    elif os.path.lexists(out):
        out.unlink()


def _machine_problem(e: BaseException) -> bool:
    """Whether loading failed for a reason of this machine or process (memory, threads that cannot start, a
    library that does not import), not because the cache entry is broken."""
    if isinstance(e, (MemoryError, ImportError)) or is_out_of_memory(e):
        return True
    text = str(e).lower()
    return "pthread_create" in text or "resource temporarily unavailable" in text


def starting_checkpoint(cfg: Config, task, device, progress: bool = True):
    """(model, tokenizer, info) for the start of RL: the cached warm-up checkpoint for the
    tiny model (and a pretrained one with ``warmup.pretrained``), or the configured local model."""
    if cfg.model.name_or_path != "tiny" and not uses_warmup_cache(cfg):
        model, tok = load_policy(cfg.model.name_or_path, cfg.model.gguf_file, cfg.model.dtype)
        return model.to(device), tok, {"source": cfg.model.name_or_path}
    if not cfg.warmup.enabled:
        tok = build_char_tokenizer()
        return build_tiny_model(cfg.model, tok, seed=WARMUP_SEED).to(device), tok, {"source": "tiny-untrained"}
    # time spent on the shared warm-up by this run (lock wait + building it) is its own phase,
    # not the run's wall-clock (harness.rundir.summary.record_end)
    out, info = ensure_warmup(cfg, task, device, progress)
    try:
        model, tok = load_policy(str(out))
    except Exception as e:  # whole by entry_problem, yet unloadable (e.g. corrupt bytes in an old entry)
        if isinstance(e, OSError) and e.errno in NO_SPACE + NO_PERMISSION:
            raise  # the environment (exit 3), not the entry
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if _machine_problem(e):  # the entry may be fine: do not advise deleting it
            raise ModelLoadError(f"the warm-up checkpoint {out} could not be loaded in this process "
                                 f"({type(e).__name__}: {first[:200]}): memory, threads or a library failed here, "
                                 f"not the cache entry (it is kept)") from None
        raise RunFileError(out, f"the warm-up checkpoint cannot be loaded ({type(e).__name__}: {first[:200]})",
                           "delete this folder: the next run rebuilds it") from None
    info["source"] = str(out)
    if (out / OPTIMIZER_FILE).exists():
        info["optimizer_state"] = str(out / OPTIMIZER_FILE)
    return model.to(device), tok, info
