"""Run configuration's public names in one place, re-exported from the modules that define them.

:mod:`harness.config.fields` (the :class:`Config` and its top-level fields), :mod:`harness.config.sections`
and :mod:`harness.config.algorithm` (the sections), :mod:`harness.config.rules` (each input rule and
limit, declared on its field), :mod:`harness.config.validation` (what the sections must agree on, and
warnings), :mod:`harness.config.overrides` (layering and ``--set``) and :mod:`harness.config.loading`
(YAML in and out). Load with :func:`load_config`, save with :func:`save_config`; unknown keys, wrong
types and out-of-range values are errors that name the field and the value.
"""
from __future__ import annotations

from harness.config.algorithm import AlgorithmConfig, RewardModelConfig
from harness.config.fields import Config
from harness.config.loading import (config_from_dict, config_hash, describe, load_config, load_yaml, read_yaml_file,
                                    save_config, strict_yaml_load)
from harness.config.overrides import (NAMED_SECTIONS, algorithm_name, deep_merge, effective_dict, parse_overrides,
                                      rename_section, set_dotted, settings)
from harness.config.rules import (MAX_NEW_TOKENS, MAX_PER_STEP, MAX_SAMPLES_PER_PROMPT, MAX_SEED, MAX_THREADS,
                                  MAX_TINY_PARAMS, NAME_RULE, TINY_VOCAB_SIZE, WANDB_MODES, dir_path_problem,
                                  is_safe_name, mlflow_uri_problem)
from harness.config.sections import (BudgetConfig, EvalConfig, ModelConfig, OodEvalConfig, SamplingConfig, TaskConfig,
                                     TrackingConfig, TrainConfig, WarmupConfig, tiny_param_count)
from harness.config.validation import config_warnings, ood_task_spec, warmup_long_spec
from harness.foundation.base import ConfigError, field_docs

__all__ = [
    "Config", "ModelConfig", "TaskConfig", "WarmupConfig", "SamplingConfig", "TrainConfig",
    "AlgorithmConfig", "BudgetConfig", "EvalConfig", "OodEvalConfig", "TrackingConfig", "RewardModelConfig",
    "ConfigError",
    "load_config", "save_config", "config_hash", "config_from_dict", "field_docs", "algorithm_name", "ood_task_spec",
    "warmup_long_spec", "config_warnings", "dir_path_problem", "effective_dict", "settings", "deep_merge", "set_dotted",
    "rename_section", "parse_overrides", "describe", "load_yaml", "read_yaml_file", "strict_yaml_load",
    "NAMED_SECTIONS", "NAME_RULE", "is_safe_name", "MAX_THREADS", "MAX_PER_STEP", "MAX_SAMPLES_PER_PROMPT",
    "MAX_NEW_TOKENS", "MAX_SEED", "MAX_TINY_PARAMS", "TINY_VOCAB_SIZE", "WANDB_MODES", "tiny_param_count",
    "mlflow_uri_problem",
]
