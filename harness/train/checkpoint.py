"""Resumable training state: saving and restoring the learner, RNG states and budget counters at evaluation checkpoints (one process or several).

``<run_dir>/checkpoint/state.pt`` is the resume point. One process: it holds the learner's
state (policy, critic, optimizers, reference when it is reset), the checkpoint ``state``
the trainer passes (``counters``, ``passed`` evaluation thresholds, ``initial_eval``, ``initial_val_eval``) and
the Python/NumPy/torch RNG states, written atomically. Several processes: every rank
writes ``dist.save_state`` into ``checkpoint/dist_<step>/`` (engines, optimizers, per-rank
RNG; the reference's weights in ``reference.pt`` when the run resets it) and the main
rank's ``state.pt`` names that folder, with the mode and world size it was written under
(a checkpoint resumes only under the same ones). A finished run's checkpoint is removed.

A checkpoint that cannot be resumed from (not a regular file, not a checkpoint, written by
a run of another model size or algorithm, counters of the wrong type) raises
:class:`CheckpointError`: one line naming the file and saying to delete the checkpoint
folder to restart the run (the CLI exits 2 with it). Saves go through a Python file object
(:func:`harness.rundir.layout.save_torch`), so a full disk is an ``OSError(ENOSPC)`` naming
the file, not torch's RuntimeError.
"""
from __future__ import annotations

import math
import os
import random
import shutil
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from harness.config.schema import Config
from harness.engine.distributed import Distributed, full_state, load_full_state
from harness.engine.learner import Learner
from harness.engine.lora import load_trainable_state, trainable_state
from harness.foundation.budget import COUNTERS, STEP
from harness.foundation.files import writing
from harness.rundir.layout import RunFileError, open_regular, save_torch

__all__ = ["checkpoint_path", "save_checkpoint", "load_checkpoint", "remove_checkpoint", "load_state", "DIST_REFERENCE",
           "CheckpointError"]


class CheckpointError(RunFileError, RuntimeError):
    """A checkpoint that cannot be resumed from; ``str(e)``: the file, why, and what to do."""


def _restart_todo(path: Path) -> str:
    folder = Path(path).parent
    return (f"delete {folder} to restart this run from the beginning (or run `harness train` with "
            f"--restart)")

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
    needs arbitrary unpickling, is not a checkpoint or is not a regular file (a FIFO would
    block the load) is refused with a :class:`CheckpointError` (a RuntimeError) naming it."""
    todo = _restart_todo(path)
    try:
        f = open_regular(path, "rb", todo)  # a FIFO here would block torch.load forever
    except RunFileError as e:
        raise CheckpointError(e.path, e.problem, todo) from None
    except FileNotFoundError:
        if not Path(path).is_symlink():
            raise
        raise CheckpointError(path, "is a link to a file that does not exist", todo) from None
    with f:
        try:
            state = torch.load(f, weights_only=True, map_location="cpu")
        except Exception as e:  # UnpicklingError, or a truncated / foreign file
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise CheckpointError(path, f"refused to load the checkpoint (only tensors and plain values are "
                                        f"loaded): {type(e).__name__}: {first}", todo) from None
    if not isinstance(state, dict):
        raise CheckpointError(path, f"not a checkpoint (expected a mapping, got {type(state).__name__})", todo)
    return state


def _is_count(v, whole: bool) -> bool:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    return ok and (not whole or float(v).is_integer())


def _check_state(path: Path, state: dict, need: tuple = ("learner", "rng")) -> None:
    """The fields the trainer resumes from are there and of the right types (a ``{}`` or a
    foreign file raises :class:`CheckpointError`, not a KeyError deep in the resume)."""
    todo = _restart_todo(path)
    missing = [k for k in ("counters", "passed", *need) if k not in state]
    if missing:
        raise CheckpointError(path, f"not a checkpoint of this harness (no {', '.join(missing)})", todo)
    counters = state["counters"]
    if not isinstance(counters, dict) or any(c not in counters for c in COUNTERS):
        raise CheckpointError(path, f"its counters are not {{{', '.join(COUNTERS)}}}", todo)
    for c in COUNTERS:
        if not _is_count(counters[c], whole=c != "seconds"):
            raise CheckpointError(path, f"its counter {c}={counters[c]!r} is not a non-negative number", todo)
    if not _is_count(state["passed"], whole=True):
        raise CheckpointError(path, f"its passed={state['passed']!r} is not a whole number", todo)
    for key in ("initial_eval", "initial_val_eval"):
        if state.get(key) is not None and not isinstance(state.get(key), dict):
            raise CheckpointError(path, f"its {key} is not a mapping", todo)
    if "learner" in need and not isinstance(state["learner"], dict):
        raise CheckpointError(path, "its learner state is not a mapping", todo)
    state["counters"] = {c: (int(counters[c]) if c != "seconds" else float(counters[c])) for c in COUNTERS}
    state["passed"] = int(state["passed"])


def _mismatch(e: BaseException) -> str:
    """The first informative line of a load_state_dict error (``size mismatch for ...``)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("size mismatch", "Missing key", "Unexpected key")):
            return ln[:300]
    return (f"{type(e).__name__}: " + (lines[0] if lines else ""))[:300]


def save_checkpoint(ckpt: Path, dist: Distributed, learner: Learner, cfg: Config, state: dict) -> None:
    """Every rank: write the resume point ``ckpt`` for ``state`` (counters, passed, initial_eval)."""
    if dist.is_distributed:
        _save_dist_checkpoint(ckpt, dist, learner, cfg, state)
        return
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    _save_atomic({"learner": learner_state(learner), **state, "rng": _rng_state()}, ckpt)


def learner_state(learner: Learner) -> dict:
    """One process: the learner's part of the resume point (its models, their optimizers and its
    update count). Several processes: ``dist.save_state`` plus the reference's full weights."""
    d = {"policy": trainable_state(learner.policy), "opt": learner.opt.state_dict(), "updates": learner.updates}
    if learner.reference is not None:
        d["reference"] = learner.reference.state_dict()
    if learner.critic is not None:
        d["critic"] = trainable_state(learner.critic)
        d["critic_opt"] = learner.critic_opt.state_dict()
    return d


def load_learner_state(learner: Learner, d: dict) -> None:
    """:func:`learner_state`'s inverse (a reference missing from ``d`` stays as it is)."""
    load_trainable_state(learner.policy, d["policy"])
    learner.opt.load_state_dict(d["opt"])
    learner.updates = d.get("updates", 0)
    if learner.reference is not None and "reference" in d:
        learner.reference.load_state_dict(d["reference"])
    if learner.critic is not None:
        load_trainable_state(learner.critic, d["critic"])
        learner.critic_opt.load_state_dict(d["critic_opt"])


def _save_atomic(obj: dict, ckpt: Path) -> None:
    """``torch.save`` into ``state.tmp``, then ``os.replace`` over ``ckpt``; a failed save
    (disk full: an ``OSError(ENOSPC)`` naming ``state.tmp``) removes the partial ``state.tmp``
    and leaves the previous resume point."""
    tmp = ckpt.with_suffix(".tmp")
    try:
        save_torch(obj, tmp)
        with writing(ckpt):
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
    if not os.path.lexists(ckpt):
        return None
    state = load_state(ckpt)
    _check_state(ckpt, state)
    try:
        load_learner_state(learner, state["learner"])
    except (KeyError, RuntimeError, ValueError, TypeError, IndexError, AttributeError) as e:
        raise CheckpointError(ckpt, f"does not fit this run's models (another model size or algorithm?): "
                                    f"{_mismatch(e)}", _restart_todo(ckpt)) from None
    try:
        _set_rng_state(state["rng"])
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        raise CheckpointError(ckpt, f"its RNG states are unusable ({type(e).__name__}: {e})",
                              _restart_todo(ckpt)) from None
    return state


def remove_checkpoint(ckpt: Path, dist: Distributed) -> None:
    """The main rank removes the resume state of a finished run (its summary is the record), and
    the ``checkpoint/`` folder once it is empty."""
    if not dist.is_main:
        return
    if ckpt.exists():
        ckpt.unlink()
    for d in ckpt.parent.glob("dist_*"):
        shutil.rmtree(d, ignore_errors=True)
    try:
        ckpt.parent.rmdir()  # the emptied checkpoint/ folder too (kept if anything else is in it)
    except OSError:
        pass


def _save_dist_checkpoint(ckpt: Path, dist: Distributed, learner: Learner, cfg: Config, state: dict) -> None:
    """Every rank: ``dist.save_state`` into ``checkpoint/dist_<step>/`` (engines, optimizers,
    per-rank RNG); the reference's weights when the run resets it; then the main rank
    points ``state.pt`` at that folder (atomically) and removes older ones."""
    tag = f"dist_{state['counters'][STEP]}"
    folder = ckpt.parent / tag
    folder.mkdir(parents=True, exist_ok=True)
    dist.save_state(folder)
    ref = full_state(dist, learner.reference) if cfg.algo.ref_reset_every and learner.reference is not None else None
    if dist.is_main and ref is not None:
        save_torch(ref, folder / DIST_REFERENCE)
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
    if dist.is_main and os.path.lexists(ckpt):
        try:
            state = load_state(ckpt)
            if "dist_state" not in state and "learner" in state:
                meta = {"error": f"written by a single-process run; it cannot resume with "
                                 f"{dist.world_size} processes ({dist.mode})"}
            else:
                _check_state(ckpt, state, need=("dist_state", "mode", "world_size"))
                if (state["mode"], state["world_size"]) != (dist.mode, dist.world_size):
                    meta = {"error": f"written by {state['world_size']} processes ({state['mode']}); "
                                     f"this run has {dist.world_size} ({dist.mode})"}
                elif not isinstance(state["dist_state"], str) or not (ckpt.parent / state["dist_state"]).is_dir():
                    meta = {"error": f"names a missing shard folder {state['dist_state']!r}"}
                else:
                    meta = {k: v for k, v in state.items() if k != "rng"}
        except CheckpointError as e:
            meta = {"error": e.problem}
    meta = dist.broadcast_object(meta)
    if meta is None:
        return None
    if "error" in meta:
        raise CheckpointError(ckpt, meta["error"], _restart_todo(ckpt))
    folder = ckpt.parent / meta["dist_state"]
    dist.load_state(folder)  # weights, optimizers, RNG of every rank
    if cfg.algo.ref_reset_every and learner.reference is not None:
        ref = None
        if dist.is_main or not dist.zero3:
            ref = load_state(folder / DIST_REFERENCE)
        load_full_state(dist, learner.reference, ref)
    learner.updates = meta.get("updates", 0)
    return meta
