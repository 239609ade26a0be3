"""The memory a stage of samples takes, estimated before any work and checked against this machine's.

A stage holds its samples' tokens several times over (prompts, completions, their token ids,
log-probabilities and the learner's batches): about :data:`BYTES_PER_TOKEN` bytes a token, measured
on the quickstart (a 1,000,000-sample stage of 53-token samples peaked at 5.6 to 7 GB, issue 48). A
setting whose memory grows with a number (``train.prompts_per_step`` x ``sampling.samples_per_prompt``,
``reward_model.samples_per_round``, ``rm train --samples``) is refused in one line naming it when
the estimate passes :data:`USABLE` of the machine's memory (its RAM, or a cgroup's limit when lower),
instead of an allocator traceback part-way.
"""
from __future__ import annotations

import os
from typing import Optional

from harness.config.validation import arith_prompt_tokens

BYTES_PER_TOKEN = 128
"""Bytes a stage holds per token of its samples (prompt and completion), as measured (module doc)."""
USABLE = 0.8
"""Share of the machine's memory a stage may take (the model, the reference and the OS take the rest)."""
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def machine_memory() -> Optional[int]:
    """Bytes of memory this process may use: the physical memory, or a cgroup's limit when lower
    (None when neither can be read)."""
    try:
        total: Optional[int] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = int(text) if total is None else min(total, int(text))
    return total


def tokens_per_sample(cfg) -> int:
    """The most tokens one sample of ``cfg`` holds: the tiny model's arith prompt (one character a
    token) plus ``sampling.max_new_tokens``; for another model or task, ``model.max_length``."""
    if cfg.model.name_or_path == "tiny" and cfg.task.name == "arith":
        return arith_prompt_tokens(cfg.task) + cfg.sampling.max_new_tokens
    return cfg.model.max_length


def samples_memory_problem(n: int, cfg, setting: str) -> Optional[str]:
    """Why ``n`` samples held at once do not fit this machine (None when they do, or when its
    memory cannot be read), as one line naming ``setting``."""
    have = machine_memory()
    tokens = tokens_per_sample(cfg)
    need = n * tokens * BYTES_PER_TOKEN
    if have is None or need <= USABLE * have:
        return None
    fit = int(USABLE * have // (tokens * BYTES_PER_TOKEN))
    return (f"{setting} = {n:,} samples held at once need about {need / 2**30:,.1f} GiB (~{BYTES_PER_TOKEN} bytes a "
            f"token, up to {tokens} tokens a sample), more than this machine's {have / 2**30:,.1f} GiB allow: lower "
            f"it to at most about {fit:,}")


def check_stage_memory(cfg) -> Optional[str]:
    """The first of a run's settings whose samples do not fit (:func:`samples_memory_problem`): its stage,
    then its reward model's rounds of samples; None when both fit."""
    stage = cfg.train.prompts_per_step * cfg.sampling.samples_per_prompt
    why = samples_memory_problem(stage, cfg, "train.prompts_per_step x sampling.samples_per_prompt")
    if why is None and cfg.reward_model.type in ("orm", "prm"):
        why = samples_memory_problem(cfg.reward_model.samples_per_round, cfg, "reward_model.samples_per_round")
    return why
