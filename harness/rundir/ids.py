"""Run ids, defined once: ``<algorithm>-s<seed>-<hash8>`` made from a loaded config, and parsed back.

The hash covers every field that changes what a run computes; ``name``, ``output_dir`` and
``tracking`` (and ``warmup.cache_dir``, ``train.checkpoint_minutes``, a ``reward_model``
section left at its defaults or without a ``type``, whose fields a run then never reads, and an algorithm
field its algorithm ignores, :func:`harness.config.validation.identity_algorithm`) do not, so the same cell
in two sweeps (or a re-launch with a tracker switched on) is the same run. The algorithm is hashed
resolved, its components with their preset values filled in (``cfg.effective_dict()``: the config with
``cfg.algo``, which config.yaml writes out), so a run's own ``config.yaml`` names the same run as the
config it was made from. It is the first 8 hex digits of the SHA-256 of the remaining config as sorted
JSON, integral floats written as ints (:func:`harness.foundation.base.stable_hash`, which the cache keys'
:func:`harness.config.schema.config_hash` also uses, without that step).

:func:`parse_run_id` is the inverse used wherever only the id is at hand (a run directory
without a summary, a tracker given a bare id).
"""
from __future__ import annotations

import re
from typing import NamedTuple, Optional

from harness.config.validation import identity_algorithm
from harness.foundation.base import stable_hash, to_dict

__all__ = ["run_id", "format_run_id", "parse_run_id", "RunIdParts", "HASH_LENGTH", "NOT_HASHED"]

HASH_LENGTH = 8
NOT_HASHED = ("name", "output_dir", "tracking")
"""Config sections that do not enter the hash (they do not change what a run computes)."""

DEFAULT_REWARD_MODEL = {"type": None, "init": None, "rounds": 1, "samples_per_round": 1024, "replay_fraction": 0.1,
                        "epochs": 4, "lr": 0.001, "micro_batch_size": 32, "beta": 0.05}
"""The ``reward_model`` section at its defaults (``harness.config.schema.RewardModelConfig``; a test
keeps the two equal): left out of the hash, so configs that predate the section keep their run ids."""

NEUTRAL_ALGORITHM = {"ratio_level": "token", "drop_zero_variance": False, "max_resample": 0, "overlong_mask": False,
                     "overlong_buffer": 0.0, "overlong_penalty": 1.0}
"""Algorithm settings that came after run ids were pinned, at the value that computes what runs did
before them: left out of the hash, so earlier configs keep their run ids. (``eps_low`` and
``eps_high`` are left out when they equal ``clip_eps``, which is hashed.)"""


def _drop_neutral(algo: dict) -> None:
    """Remove from a resolved algorithm section the later settings that change nothing
    (:data:`NEUTRAL_ALGORITHM`; a clip side equal to ``clip_eps``)."""
    for side in ("eps_low", "eps_high"):
        if side in algo and algo[side] == algo.get("clip_eps"):
            algo.pop(side)
    for key, value in NEUTRAL_ALGORITHM.items():
        if key in algo and algo[key] == value and isinstance(algo[key], bool) == isinstance(value, bool):
            algo.pop(key)


_RUN_ID = re.compile(r"^(?P<algorithm>.+?)-s(?P<seed>-?\d+)-(?P<hash>[0-9a-f]+)$")


class RunIdParts(NamedTuple):
    algorithm: str
    seed: Optional[int]
    hash: Optional[str]


def format_run_id(algorithm: str, seed: int, digest: str) -> str:
    """``<algorithm>-s<seed>-<digest>``."""
    return f"{algorithm}-s{seed}-{digest}"


def run_id(cfg) -> str:
    """Run id of a loaded :class:`~harness.config.schema.Config` (its algorithm, seed and hash)."""
    d = cfg.effective_dict()  # the algorithm preset-filled: a config.yaml written out is the same run
    d["algorithm"] = to_dict(identity_algorithm(cfg))  # less the fields its algorithm ignores
    for k in NOT_HASHED:
        d.pop(k, None)
    if isinstance(d.get("warmup"), dict):
        d["warmup"].pop("cache_dir", None)  # where the warm-up is cached, not what it is
    if isinstance(d.get("train"), dict):
        d["train"].pop("checkpoint_minutes", None)  # how often it saves, not what it computes
    if isinstance(d.get("algorithm"), dict):
        _drop_neutral(d["algorithm"])
    rm = d.get("reward_model")
    if rm == DEFAULT_REWARD_MODEL or (isinstance(rm, dict) and rm.get("type") is None):
        d.pop("reward_model")  # off (its defaults): the section came later, so runs without it keep their ids;
        # without a type its other fields are read by nothing in a run (`harness rm train` alone reads them)
    return format_run_id(cfg.algo.name, cfg.seed, stable_hash(d, HASH_LENGTH, integral_floats_as_ints=True))


def parse_run_id(rid: str) -> RunIdParts:
    """``"grpo-s0-23bf9b10"`` -> ``("grpo", 0, "23bf9b10")``. An id of another shape keeps
    everything before its first ``-s`` as the algorithm (seed and hash None)."""
    m = _RUN_ID.match(str(rid))
    if m:
        return RunIdParts(m.group("algorithm"), int(m.group("seed")), m.group("hash"))
    return RunIdParts(str(rid).split("-s")[0], None, None)
