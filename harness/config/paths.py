"""The files and folders a config reads, checked before any work starts.

:func:`check_input_paths` is what every command that starts a run of a config calls before it
makes a run folder (``harness train``, ``harness warmup``, ``harness quickstart``; a sweep may
call it on each run's config): each path the run will read exists and is what it must be, or
one error naming the field and the path, exit 2 in :mod:`harness.cli.main`:

* ``model.name_or_path`` (not ``tiny``): a local Hugging Face model folder, complete
  (:func:`harness.foundation.modelfiles.check_model_folder`), a ``.gguf`` file, a folder holding
  ``model.gguf_file``, ``pkg:<package>/<file>``, or a hub name the local Hugging Face cache holds
  (nothing is downloaded at run time);
* ``algorithm.prm`` (a path, not null or ``rule``): the same, and not an outcome reward model;
* ``reward_model.init``: a folder written by ``harness rm train`` (``reward_model.json``) of
  ``reward_model.type``'s kind, and a complete model folder;
* ``task.data_path`` (dataset tasks): the data file or folder is there (the task locates its
  files; nothing is read).

Nothing here writes or imports torch (a reward model's spec file name is read from ``evals.prm`` when one is checked).
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Optional

from evals.catalog import get_task
from harness.config.algorithm import TRAINED_REWARD_MODELS
from harness.foundation.base import ConfigError, invalid
from harness.foundation.errors import ModelLoadError
from harness.foundation.modelfiles import check_model_folder, looks_like_hub_id, resolve_model_path


def _rm_spec_file() -> str:
    """evals.prm's spec file name (evals.prm imports torch: loaded only when a check needs it)."""
    return importlib.import_module("evals.prm").RM_SPEC_FILE

__all__ = ["check_input_paths", "check_model_path", "check_reward_model_init", "check_task_data",
           "reward_model_spec", "task_mismatch"]

NOT_DOWNLOADED = "nothing is downloaded at run time"


def _refuse(field: str, value: Any, why: str) -> ConfigError:
    return ConfigError(invalid(field, value, why))


def _hub_cached(name: str) -> bool:
    """Whether the local Hugging Face cache holds the model ``name`` (``org/model``) that
    ``from_pretrained(..., local_files_only=True)`` would load; True when that cannot be told."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return True
    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # a name the hub library refuses: not in the cache
        return False


def check_model_path(field: str, value: str, gguf_file: Optional[str] = None) -> None:
    """``value`` names a model the harness can load without downloading (see the module doc);
    ConfigError naming ``field`` when it is missing, ModelLoadError (the engine's check, naming
    ``field`` too) when a folder is incomplete."""
    try:
        path = resolve_model_path(value)
    except FileNotFoundError as e:  # pkg:<package>/... whose package is not installed
        raise _refuse(field, value, str(e).split(": ", 1)[-1]) from None
    p = Path(path)
    if gguf_file is None and p.suffix.lower() == ".gguf":  # as load_policy reads it
        if not p.is_file():
            raise _refuse(field, value, f"no such GGUF file{_where(value, path)}")
        return
    if not p.exists():
        if gguf_file is None and looks_like_hub_id(path):
            if _hub_cached(path):
                return
            raise _refuse(field, value, f"no such folder, and not a model the local Hugging Face cache holds "
                                        f"({NOT_DOWNLOADED}: download it beforehand or give a local folder)")
        raise _refuse(field, value, f"no such file or folder{_where(value, path)} (a local Hugging Face model "
                                    f"folder or a .gguf file is expected; {NOT_DOWNLOADED})")
    if not p.is_dir():
        raise _refuse(field, value, f"not a folder{_where(value, path)} (a Hugging Face model folder, or a .gguf file)")
    if gguf_file is not None:
        if not (p / gguf_file).is_file():
            raise _refuse("model.gguf_file", gguf_file, f"no such file in {path}")
        return
    try:
        check_model_folder(p)
    except ModelLoadError as e:
        raise ModelLoadError(invalid(field, value, str(e))) from None


def _where(value: str, path: str) -> str:
    return f" ({path})" if path != value else ""


def reward_model_spec(field: str, folder: str) -> Optional[dict]:
    """``folder``'s reward_model.json (None without one), or a ConfigError naming ``field``: it cannot be
    read (empty, garbage, not UTF-8, nested too deeply) or is not a spec of a trained reward model."""
    RM_SPEC_FILE = _rm_spec_file()
    f = Path(folder) / RM_SPEC_FILE
    if not f.is_file():
        return None
    try:
        spec = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _refuse(field, folder, f"its {RM_SPEC_FILE} cannot be read ({type(e).__name__}: "
                                     f"{str(e)[:200]})") from None
    kind = spec.get("kind") if isinstance(spec, dict) else None
    if kind not in TRAINED_REWARD_MODELS:
        raise _refuse(field, folder, f"its {RM_SPEC_FILE} is not a reward-model spec (expected a mapping with "
                                     f"kind {' or '.join(TRAINED_REWARD_MODELS)})")
    return spec


def task_mismatch(spec: Optional[dict], task: str) -> Optional[str]:
    """Why a reward model trained on another task's samples may not score ``task`` (None when it may,
    or when its spec names no task)."""
    trained = spec.get("task") if isinstance(spec, dict) else None
    if isinstance(trained, str) and trained != task:
        return (f"it was trained on task '{trained}' samples (its reward_model.json says so) and this run's task "
                f"is '{task}': train one on this task with `harness rm train`")
    return None


def check_reward_model_init(cfg) -> None:
    """``reward_model.init``, when set: a folder of ``harness rm train`` of the configured type."""
    rm = cfg.reward_model
    if rm.init is None:
        return
    p = Path(rm.init)
    if not p.exists():
        raise _refuse("reward_model.init", rm.init, "no such folder (a folder written by `harness rm train`)")
    if not p.is_dir():
        raise _refuse("reward_model.init", rm.init, "not a folder (a folder written by `harness rm train`)")
    spec = reward_model_spec("reward_model.init", rm.init)
    kind = None if spec is None else spec["kind"]
    if kind is None:
        spec_file = _rm_spec_file()
        raise _refuse("reward_model.init", rm.init, f"no {spec_file} there: not a reward model written by "
                                                    f"`harness rm train`")
    if rm.type in TRAINED_REWARD_MODELS and kind != rm.type:
        raise _refuse("reward_model.init", rm.init, f"it is a{'n' if kind == 'orm' else ''} {kind} and "
                                                    f"reward_model.type is {rm.type}")
    why = task_mismatch(spec, cfg.task.name)
    if why:
        raise _refuse("reward_model.init", rm.init, why)
    check_model_path("reward_model.init", rm.init)


def check_task_data(spec) -> None:
    """The task's data is where ``task.data_path`` (or the data root) says: the task locates its
    files (FileNotFoundError naming task.data_path and the path tried, exit 2); nothing is read."""
    get_task(spec)


def check_input_paths(cfg) -> None:
    """Every path ``cfg`` reads exists and is what it must be (the module doc), before any run
    folder is made: one ConfigError (or the engine's ModelLoadError, a task's FileNotFoundError)
    naming the field and the path. Writes nothing."""
    m = cfg.model
    if m.name_or_path != "tiny":
        check_model_path("model.name_or_path", m.name_or_path, m.gguf_file)
    prm = cfg.algo.prm
    if prm not in (None, "", "rule"):
        check_model_path("algorithm.prm", prm)
        spec = reward_model_spec("algorithm.prm", prm) if Path(prm).is_dir() else None
        if spec is not None and spec["kind"] == "orm":
            raise _refuse("algorithm.prm", prm, "an outcome reward model (its reward_model.json says kind orm): "
                                                "give it as reward_model.type=orm reward_model.init=<folder>")
        why = task_mismatch(spec, cfg.task.name)
        if why:
            raise _refuse("algorithm.prm", prm, why)
    check_reward_model_init(cfg)
    check_task_data(cfg.task)


def uses_warmup_cache(cfg) -> bool:
    """Whether a run of ``cfg`` reads or builds the cached warm-up (warm-up on, and the tiny model or
    ``warmup.pretrained``)."""
    return cfg.warmup.enabled and (cfg.model.name_or_path == "tiny" or cfg.warmup.pretrained)


def warmup_cache_root(cfg) -> Path:
    """The warm-up cache a run of ``cfg`` uses: ``warmup.cache_dir``, or ``<output_dir>/_cache/warmup`` when unset."""
    return Path(cfg.warmup.cache_dir) if cfg.warmup.cache_dir else Path(cfg.output_dir) / "_cache" / "warmup"
