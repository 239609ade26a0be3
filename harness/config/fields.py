"""The run config: its top-level fields and its sections, and the algorithm as it runs (resolved once).

A loaded :class:`Config` holds ``algorithm`` (the section as given, components left null for the
preset) and :attr:`Config.algo` (the same section with the preset's components filled in: what
runs). Everything downstream reads ``cfg.algo``; the ``algorithm: ppo`` shorthand and section
renaming are read only by :mod:`harness.config.overrides`, on the raw mappings before a config is
built. Validation across sections is :mod:`harness.config.validation`'s.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Optional

from algorithms.presets import resolve
from harness.config import validation
from harness.config.algorithm import AlgorithmConfig, RewardModelConfig
from harness.config.rules import DEVICE, NAME, NUMERICS, SEED, check_fields, dir_path, field_problem, ruled
from harness.config.sections import (BudgetConfig, EvalConfig, ModelConfig, SamplingConfig, TaskConfig,
                                     TrackingConfig, TrainConfig, WarmupConfig)
from harness.foundation.base import to_dict
from harness.foundation.numerics import DEFAULT_MODE as NUMERICS_DEFAULT


@dataclass(frozen=True)
class Config:
    name: str = ruled("default", NAME)
    """Experiment name: results go to <output_dir>/<name>/<run_id>/."""
    seed: int = ruled(0, SEED)
    """Seed of sampling, initialisation and prompt order."""
    output_dir: str = ruled("results", dir_path())
    """Root of run outputs."""
    device: str = ruled("auto", DEVICE)
    """cpu, cuda, cuda:N, or auto (cuda when available)."""
    numerics: str = ruled(NUMERICS_DEFAULT, NUMERICS)
    """portable: no kernel picks its summation order by CPU kind (matrix products in OpenBLAS's
    Haswell kernels, ATen at AVX2, numpy at X86_V3, a fixed thread count; the README lists the CPU
    kinds it was verified identical on); native: each library picks this CPU's fastest path
    (results then differ between CPU kinds). See harness/foundation/numerics.py; every run records
    which it used, and `harness eval` of a run evaluates in the run's mode."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy (and, for PPO, the critic backbone)."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The task trained and evaluated on."""
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """Supervised warm-up that makes the starting checkpoint."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Rollout generation."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation of the policy."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The RL algorithm, as a composition of named parts."""
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    """When to stop and when to evaluate."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation at budget checkpoints."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """Trackers mirrored from metrics.jsonl."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A learned reward model (orm, prm, PRIME's implicit PRM) and iterative RL; off by default."""

    def validate(self):
        check_fields(self)
        validation.check_config(self)

    def replace(self, **sections) -> "Config":
        return dataclasses.replace(self, **sections)

    @functools.cached_property
    def algo(self) -> AlgorithmConfig:
        """The algorithm as it runs: the ``algorithm`` section with every component it left null set
        to its preset's (:func:`algorithms.presets.resolve`), holding every setting of the algorithm.
        Built once, when the config is validated (loaded); the learner, the loop, run ids,
        config.yaml, displays and trackers read it. ``algorithm`` stays the section as given (what
        summary.json and a sweep's plan record)."""
        return resolve(self.algorithm)

    def effective_dict(self) -> dict:
        """The config as it runs, as a plain dict: :func:`to_dict` of it with the ``algorithm``
        section resolved (:attr:`algo`). What config.yaml, ``harness config --show`` and the
        trackers show, and what a run id hashes (``harness.rundir.ids``)."""
        return {**to_dict(self), "algorithm": to_dict(self.algo)}


def option_problem(dotted: str, value: Any, option: str) -> Optional[str]:
    """Why ``value`` of command-line option ``option`` breaks the rules of config field ``dotted``
    (``eval.n``), which the option stands for, as ``option=value is invalid: ...``; None when it
    keeps them."""
    return field_problem(Config, dotted, value, option)
