"""Resumable training state: saving and restoring the learner, RNG states and budget counters at evaluation checkpoints (one process or several).

``<run_dir>/checkpoint/state.pt`` is the resume point. One process: it holds the learner's
state (policy, critic, optimizers, reference when it is reset), the checkpoint ``state``
the trainer passes (``counters``, ``passed`` evaluation thresholds, ``initial_eval``) and
the Python/NumPy/torch RNG states, written atomically. Several processes: every rank
writes ``dist.save_state`` into ``checkpoint/dist_<step>/`` (engines, optimizers, per-rank
RNG; the reference's weights in ``reference.pt`` when the run resets it) and the main
rank's ``state.pt`` names that folder, with the mode and world size it was written under
(a checkpoint resumes only under the same ones). A finished run's checkpoint is removed.
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from harness.config.schema import Config
from harness.engine.distributed import Distributed
from harness.engine.learner import Learner
from harness.rundir.budget import STEP

__all__ = ["checkpoint_path", "save_checkpoint", "load_checkpoint", "remove_checkpoint", "load_state", "DIST_REFERENCE"]

DIST_REFERENCE = "reference.pt"


def checkpoint_path(run_dir: Path) -> Path:
    """``<run_dir>/checkpoint/state.pt``."""
    return Path(run_dir) / "checkpoint" / "state.pt"


def _rng_state() -> dict:
    """RNG states as types ``torch.load(weights_only=True)`` accepts (tuples, ints, tensors)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": (kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss),
                      float(cached)),
            "torch": torch.get_rng_state()}


def _set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    kind, keys, pos, has_gauss, cached = s["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((kind, keys.astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(s["torch"])


def load_state(path: Path) -> dict:
    """``torch.load(path, weights_only=True)``: tensors and plain types only; a checkpoint that
    needs arbitrary unpickling (or is not a checkpoint) is refused with a RuntimeError naming it."""
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # UnpicklingError, or a truncated / foreign file
        raise RuntimeError(f"{path}: refused to load the checkpoint (only tensors and plain values are "
                           f"loaded; remove it to start over): {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}") from None
    if not isinstance(state, dict):
        raise RuntimeError(f"{path}: not a checkpoint (expected a mapping, got {type(state).__name__})")
    return state


def save_checkpoint(ckpt: Path, dist: Distributed, learner: Learner, cfg: Config, state: dict) -> None:
    """Every rank: write the resume point ``ckpt`` for ``state`` (counters, passed, initial_eval)."""
    if dist.is_distributed:
        _save_dist_checkpoint(ckpt, dist, learner, cfg, state)
        return
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    _save_atomic({"learner": learner.state_dict(), **state, "rng": _rng_state()}, ckpt)


def _save_atomic(obj: dict, ckpt: Path) -> None:
    """``torch.save`` into ``state.tmp``, then ``os.replace`` over ``ckpt``; a failed save
    (disk full) removes the partial ``state.tmp`` and leaves the previous resume point."""
    tmp = ckpt.with_suffix(".tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, ckpt)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def load_checkpoint(ckpt: Path, dist: Distributed, learner: Learner, cfg: Config, resume: bool) -> Optional[dict]:
    """Every rank: when resuming and ``ckpt`` exists, load it into ``learner`` (and the RNG
    states) and return its state; else None."""
    if not resume:
        return None
    if dist.is_distributed:
        return _load_dist_checkpoint(ckpt, dist, learner, cfg)
    if not ckpt.exists():
        return None
    state = load_state(ckpt)
    learner.load_state_dict(state["learner"])
    _set_rng_state(state["rng"])
    return state


def remove_checkpoint(ckpt: Path, dist: Distributed) -> None:
    """The main rank removes the resume state of a finished run (its summary is the record)."""
    if not dist.is_main:
        return
    if ckpt.exists():
        ckpt.unlink()
    for d in ckpt.parent.glob("dist_*"):
        shutil.rmtree(d, ignore_errors=True)


def _save_dist_checkpoint(ckpt: Path, dist: Distributed, learner: Learner, cfg: Config, state: dict) -> None:
    """Every rank: ``dist.save_state`` into ``checkpoint/dist_<step>/`` (engines, optimizers,
    per-rank RNG); the reference's weights when the run resets it; then the main rank
    points ``state.pt`` at that folder (atomically) and removes older ones."""
    tag = f"dist_{state['counters'][STEP]}"
    folder = ckpt.parent / tag
    folder.mkdir(parents=True, exist_ok=True)
    dist.save_state(folder)
    ref = learner.reference_state() if cfg.algorithm.ref_reset_every else None
    if dist.is_main and ref is not None:
        torch.save(ref, folder / DIST_REFERENCE)
    dist.barrier()  # every rank's shard is on disk before state.pt names the folder
    if dist.is_main:
        _save_atomic({**state, "dist_state": tag, "mode": dist.mode, "world_size": dist.world_size,
                      "updates": learner.updates, "rng": _rng_state()}, ckpt)
        for old in ckpt.parent.glob("dist_*"):
            if old.name != tag:
                shutil.rmtree(old, ignore_errors=True)


def _load_dist_checkpoint(ckpt: Path, dist: Distributed, learner: Learner, cfg: Config) -> Optional[dict]:
    """Every rank: the checkpoint's state (None when there is none), after loading it."""
    meta = None
    if dist.is_main and ckpt.exists():
        state = load_state(ckpt)
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
            ref = load_state(folder / DIST_REFERENCE)
        learner.load_reference_state(ref)
    learner.updates = meta.get("updates", 0)
    return meta
