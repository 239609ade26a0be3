"""Run configuration: frozen dataclasses, one per section, each field documented.

Load with :func:`load_config` (YAML file + ``--set a.b=v`` overrides), save with
:func:`save_config`. Unknown keys, wrong types and out-of-range values are errors that
name the field and the value.

The algorithm is resolved once, here: a loaded :class:`Config` holds ``algorithm`` (the section
as given, components left null for the preset) and :attr:`Config.algo` (the same section with
the preset's components filled in: what runs). Everything downstream reads ``cfg.algo``; the
``algorithm: ppo`` shorthand and section renaming are read only by this package, on the raw
mappings before a config is built (:func:`deep_merge`, :func:`set_dotted`).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

import yaml

from algorithms.presets import ALGORITHMS, COMPONENTS, GROUP_ESTIMATORS, has_critic, resolve, uses_reference
from algorithms.registry import UnknownComponentError
from evals.arith import HELDOUT_MOD, describe_knobs, held_out_shortfall, problem_space, space_problem, split_sizes
from evals.catalog import available_tasks, has_step_checker
from evals.tasks import TaskSpec
from harness.config import yamlsafe
from harness.config.base import (ConfigError, brief, check, check_choice, expand_shorthand, field_docs, from_dict,
                                 stable_hash, to_dict)
from harness.config.yamlsafe import DuplicateKeyError, YamlBadValue, YamlTooLarge
from harness.rundir.budget import BUDGET_UNITS, stage_samples, threshold_warning
from harness.rundir.layout import write_text_atomic
from harness.engine.numerics import MODES as NUMERICS_MODES

__all__ = [
    "Config", "ModelConfig", "TaskConfig", "WarmupConfig", "SamplingConfig", "TrainConfig",
    "AlgorithmConfig", "BudgetConfig", "EvalConfig", "OodEvalConfig", "TrackingConfig", "RewardModelConfig",
    "ConfigError",
    "load_config", "save_config", "config_hash", "config_from_dict", "field_docs", "algorithm_name", "ood_task_spec",
    "config_warnings", "dir_path_problem", "effective_dict", "deep_merge", "set_dotted", "rename_section",
    "NAMED_SECTIONS", "MAX_THREADS", "MAX_TINY_PARAMS", "tiny_param_count", "mlflow_uri_problem",
]


# Limits a run can reach or hold (a budget beyond them never ends; a stage beyond them never fits).
MAX_BUDGET = {"steps": 1e8, "samples": 1e12, "tokens": 1e15, "seconds": 1e8}
MAX_PER_STEP = 1_000_000        # samples in one stage (prompts_per_step x samples_per_prompt); eval.n
MAX_SAMPLES_PER_PROMPT = 65_536
MAX_NEW_TOKENS = 1_048_576
MAX_EVAL_POINTS = 100_000
MAX_SEED = 2**63 - 1            # torch's generators take at most 64 bits; numpy's seed is taken mod 2**32
MAX_ARITH_EVAL_SIZE = 1_000_000  # arith problems generated for one evaluation set
MAX_THREADS = 1024              # every thread-count field (OpenBLAS and OpenMP fail to start far more threads)
TINY_VOCAB_SIZE = 100           # the character tokenizer's tokens (harness.engine.models.build_char_tokenizer)
MAX_TINY_PARAMS = 1_000_000_000
"""Most parameters of the built-in tiny model: float32 weights, gradients and Adam's two moments
(16 bytes a parameter) fit in 16 GB, so a 24 GiB machine can hold it. A fixed number, not this
machine's memory: a config validates the same everywhere."""
WANDB_MODES = ("offline", "online", "disabled")
MLFLOW_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc",
                  "uc")
"""The tracking-store URI schemes MLflow knows (a database scheme may carry a driver: postgresql+psycopg2)."""
MLFLOW_URI_FORMS = ("sqlite:///<path>.db, file:<path>, http(s)://<host>[:<port>], "
                    "postgresql|mysql|mssql://<user>@<host>/<database>, databricks")
"""The forms of tracking.mlflow_uri, as the message of a refused one lists them."""
_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9.+-]*):(.*)$", re.S)
_WANDB_PROJECT_BAD = tuple("/\\#?%:")
"""Characters wandb refuses in a project name (wandb.Settings.validate_project)."""
NAME_RULE = ("must be a non-empty name of letters, digits, '.', '_', '-', '+', '=', ',' or '@', "
             "without '/', '\\' or '..' and not starting with '.' (it becomes a directory name)")
_NAME_RE = re.compile(r"^[A-Za-z0-9_+=,@-][A-Za-z0-9._+=,@-]*$")
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:[0-9]+)?)$")


def is_safe_name(name) -> bool:
    """A run or sweep name that stays one directory below the output directory."""
    return isinstance(name, str) and len(name) <= 200 and bool(_NAME_RE.match(name)) and ".." not in name


def check_threads(field: str, value: int, low: int = 1, meaning: str = "") -> None:
    """A thread-count field is between ``low`` and :data:`MAX_THREADS` (one message for them all)."""
    check(low <= value <= MAX_THREADS, field, value, f"must be between {low} and {MAX_THREADS}{meaning}")


def tiny_param_count(m: "ModelConfig") -> int:
    """Parameters of the built-in tiny model ``m`` describes (`harness.engine.models.build_tiny_model`:
    a Llama with tied embeddings, as many key/value heads as heads, no biases): the embedding,
    per layer four hidden x hidden attention projections, three hidden x intermediate MLP
    projections and two norms, and the final norm."""
    h, i = m.hidden_size, m.intermediate_size
    return TINY_VOCAB_SIZE * h + m.num_layers * (4 * h * h + 3 * h * i + 2 * h) + h


def arith_prompt_tokens(task) -> int:
    """Upper bound on the tiny model's tokens for an arith prompt ``Q:<expr>\nA:`` (one
    character a token, plus BOS): operands of at most len(str(max_operand)) digits."""
    digits = max(len(str(task.max_operand)), len(str(task.min_operand)))
    return 1 + len("Q:\nA:") + (task.max_ops + 1) * digits + task.max_ops


@dataclass(frozen=True)
class ModelConfig:
    name_or_path: str = "tiny"
    """'tiny' builds the built-in Llama-style model with a character tokenizer (trained from
    scratch by the warm-up); otherwise a local Hugging Face causal-LM directory, or a .gguf
    file (loaded with transformers' ``gguf_file=``)."""
    gguf_file: Optional[str] = None
    """GGUF file name inside ``name_or_path`` (a directory), when the weights are GGUF."""
    hidden_size: int = 128
    """Tiny model only: width of the residual stream."""
    num_layers: int = 4
    """Tiny model only: number of decoder layers."""
    num_heads: int = 4
    """Tiny model only: attention heads (head dim = hidden_size / num_heads)."""
    intermediate_size: int = 384
    """Tiny model only: SwiGLU MLP width."""
    max_length: int = 96
    """Tiny model only: maximum sequence length (prompt + completion) in tokens."""
    dtype: str = "float32"
    """Parameter dtype: float32 | bfloat16 | float16 (float32 on CPU)."""

    def validate(self):
        check(self.hidden_size > 0 and self.hidden_size % max(self.num_heads, 1) == 0, "model.hidden_size",
              self.hidden_size, "must be positive and divisible by model.num_heads")
        check(self.num_layers >= 1, "model.num_layers", self.num_layers, "must be >= 1")
        check(self.num_heads >= 1, "model.num_heads", self.num_heads, "must be >= 1")
        check(self.intermediate_size >= 1, "model.intermediate_size", self.intermediate_size, "must be >= 1")
        check(self.max_length >= 8, "model.max_length", self.max_length, "must be >= 8")
        if self.name_or_path == "tiny":
            head_dim = self.hidden_size // self.num_heads
            check(head_dim % 2 == 0, "model.num_heads", self.num_heads,
                  f"model.hidden_size / model.num_heads = {head_dim} must be even (rotary position embeddings "
                  f"rotate pairs of dimensions)")
            self._check_size()
        p = Path(os.path.expanduser(self.name_or_path))
        if self.name_or_path != "tiny" and p.is_file():
            check(p.suffix.lower() == ".gguf", "model.name_or_path", self.name_or_path,
                  "a file must be a .gguf model; otherwise give a Hugging Face model directory or 'tiny'")
        check_choice("model.dtype", self.dtype, ("float32", "bfloat16", "float16"))

    SIZE_FIELDS: ClassVar[tuple[str, ...]] = ("hidden_size", "num_layers", "intermediate_size")

    def _check_size(self) -> None:
        """The tiny model holds at most :data:`MAX_TINY_PARAMS` parameters; the message names the
        size field furthest above its default (the one most likely meant otherwise) and every size."""
        n = tiny_param_count(self)
        if n <= MAX_TINY_PARAMS:
            return
        field = max(self.SIZE_FIELDS, key=lambda f: getattr(self, f) / getattr(ModelConfig, f))
        sizes = ", ".join(f"{f}={getattr(self, f)}" for f in self.SIZE_FIELDS)
        about = re.sub(r"e\+0*", "e", f"{n:.2g}")  # 2.8e14
        check(False, f"model.{field}", getattr(self, field),
              f"the built-in tiny model would hold about {about} parameters ({sizes}, a {TINY_VOCAB_SIZE}-token "
              f"vocabulary), more than {MAX_TINY_PARAMS:,} (float32 weights, gradients and Adam state at 16 bytes "
              f"a parameter must fit in memory): lower model.hidden_size, model.num_layers or "
              f"model.intermediate_size")


@dataclass(frozen=True)
class TaskConfig(TaskSpec):
    """The ``task`` section: fields and their meaning in :class:`evals.tasks.TaskSpec`."""

    def validate(self, evaluate_only: bool = False):
        tasks = available_tasks()
        if self.name not in tasks:
            check_choice("task.name", self.name, tasks)
        check(self.min_ops >= 1, "task.min_ops", self.min_ops, "must be >= 1")
        check(self.max_ops >= self.min_ops, "task.max_ops", self.max_ops, "must be >= task.min_ops")
        check(0 <= self.min_operand <= self.max_operand, "task.max_operand", self.max_operand,
              "need 0 <= min_operand <= max_operand")
        check(bool(self.operators) and set(self.operators) <= set("+-*"), "task.operators", self.operators,
              "must be a non-empty subset of '+-*'")
        check(self.eval_size >= 1, "task.eval_size", self.eval_size, "must be >= 1")
        check(self.few_shot >= 0, "task.few_shot", self.few_shot, "must be >= 0")
        check(0.0 <= self.demo_error_rate <= 1.0, "task.demo_error_rate", self.demo_error_rate, "must be in [0, 1]")
        if self.name == "arith":
            self._validate_arith(evaluate_only)
        else:
            check(not self.disjoint_validation, "task.disjoint_validation", self.disjoint_validation,
                  f"splits arith's held-out bucket; task '{self.name}' has its own test set: remove it")

    def _validate_arith(self, evaluate_only: bool):
        """Dataset knobs are refused (arith would ignore them, and they would still change the run
        id); the problem space must leave problems to evaluate and (unless ``evaluate_only``: the
        out-of-domain set) to train on, and, when it is too large to count, hold about eval_size
        held-out problems (a small one is counted: a larger eval_size evaluates all of them, and
        `config_warnings` says so)."""
        check(self.data_path is None, "task.data_path", self.data_path,
              "arith generates its problems and reads no data: remove task.data_path (it is for gsm8k, math "
              "and math500)")
        check(self.few_shot == 0, "task.few_shot", self.few_shot,
              "arith prompts hold no worked examples: remove task.few_shot (it is for gsm8k, math and math500)")
        check(self.eval_size <= MAX_ARITH_EVAL_SIZE, "task.eval_size", self.eval_size,
              f"must be <= {MAX_ARITH_EVAL_SIZE:,} (arith problems generated for one evaluation)")
        why = space_problem(self, evaluate_only)
        if why:
            raise ConfigError(f"task: {why}")
        space = problem_space(self)
        test = split_sizes(self)[0]
        half = " in the test half (task.disjoint_validation)" if self.disjoint_validation else ""
        check(space.exact or self.eval_size <= test, "task.eval_size", self.eval_size,
              f"these arith knobs ({describe_knobs(self)}) allow about {test:,} held-out problems{half} "
              f"(1 in {HELDOUT_MOD} of {space.total:,} expressions held out): set task.eval_size <= {test:,} "
              f"or widen the task (max_operand, operators, max_ops)")


@dataclass(frozen=True)
class WarmupConfig:
    enabled: bool = True
    """Supervised warm-up on worked solutions before RL (tiny model; produces the
    starting 'instruct' checkpoint, cached by a hash of the config that determines it)."""
    steps: int = 1500
    """Optimizer steps of warm-up."""
    examples_per_step: int = 64
    """Worked solutions per warm-up step."""
    lr: float = 3e-3
    """Peak learning rate (AdamW, linear warm-up then cosine decay to final_lr_fraction)."""
    final_lr_fraction: float = 0.05
    """Learning rate at the end of the warm-up, as a fraction of lr (1.0 = constant: the
    checkpoint is not annealed, as when SFT stops early)."""
    cache_dir: Optional[str] = None
    """Where warm-up checkpoints are cached (keyed by a hash of model+task+warmup); default
    ``<output_dir>/_cache/warmup``, so every run and sweep under one output directory shares
    it wherever the command is started. Does not enter the run id."""
    threads: int = 2
    """torch CPU threads of the warm-up (1 to 1024): a fixed number, not the machine's cores, because the
    thread count changes how sums are split and so the checkpoint (it enters the cache key)."""
    per_seed: bool = False
    """Train one warm-up per run seed (the seed initialises the model and orders its data),
    shared by every algorithm of that seed; false: one warm-up (seed 0) for every run. A
    study with per-seed warm-ups measures the spread that comes from the starting point too."""
    long_share: float = 0.0
    """arith: the share of warm-up worked solutions drawn with ``long_ops`` operations instead of
    the task's min_ops..max_ops (each example independently; from the training bucket, with the
    task's demo_error_rate): a small share of longer supervised solutions, so that an
    out-of-domain set of longer problems is one the start solves in part. 0: off (left out of
    config.yaml, run ids and the warm-up's cache key)."""
    long_ops: int = 4
    """arith: operations in the warm-up's longer solutions (``long_share``)."""

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("long_share", "long_ops")
    """Later knobs left out of config.yaml, run ids and cache keys at their defaults
    (:func:`harness.config.base.to_dict`)."""

    def validate(self):
        check(self.steps >= 0, "warmup.steps", self.steps, "must be >= 0")
        check(self.examples_per_step >= 1, "warmup.examples_per_step", self.examples_per_step, "must be >= 1")
        check(self.lr > 0, "warmup.lr", self.lr, "must be > 0")
        check(0 <= self.final_lr_fraction <= 1, "warmup.final_lr_fraction", self.final_lr_fraction, "must be in [0, 1]")
        check_threads("warmup.threads", self.threads)
        check(0.0 <= self.long_share <= 1.0, "warmup.long_share", self.long_share, "must be in [0, 1]")
        check(1 <= self.long_ops <= 16, "warmup.long_ops", self.long_ops, "must be between 1 and 16")
        if self.cache_dir is not None:
            why = dir_path_problem(self.cache_dir)
            check(why is None, "warmup.cache_dir", self.cache_dir, f"{why} (or null: <output_dir>/_cache/warmup)")


@dataclass(frozen=True)
class SamplingConfig:
    backend: str = "hf"
    """Sampler backend (harness.engine.sampling.get_sampler): 'hf' (in-process, KV-cached decoding
    on the learner's weights; the reference), 'paged' (transformers' continuous batching with paged
    attention, harness.engine.paged), 'vllm' (harness.engine.vllm_sampler: optional extra for CUDA
    machines, accepted where vllm is installed, UNVERIFIED: it has not run on a GPU yet). The
    default is 'hf' on every device: on CPU it generated 2.4x to 12x the tokens/s of 'paged' at
    every measured setting (1 to 256 rows, 24 to 128 new tokens; bench/samplers.py, bench/README.md
    "Samplers"); no backend has been measured on a GPU."""
    samples_per_prompt: int = 8
    """G: completions sampled per prompt (the group for GRPO's baseline)."""
    max_new_tokens: int = 40
    """Longest completion, in tokens; longer ones are truncated (and usually score 0)."""
    temperature: float = 1.0
    """Sampling temperature for rollouts."""
    top_p: float = 1.0
    """Nucleus sampling mass for rollouts (1.0 = off)."""

    def validate(self):
        check_choice("sampling.backend", self.backend, ("hf", "paged", "vllm"))
        # vllm: an optional extra for CUDA machines, UNVERIFIED (never run by us yet): accepted only
        # where the package is installed (the run logs that it is unverified), refused elsewhere
        check(self.backend != "vllm" or importlib.util.find_spec("vllm") is not None, "sampling.backend",
              self.backend, "needs the vllm package (pip install 'grpo-harness[vllm]' on a CUDA machine); "
              "it is unverified: use 'hf' or 'paged' for results you rely on")
        check(self.samples_per_prompt >= 1, "sampling.samples_per_prompt", self.samples_per_prompt, "must be >= 1")
        check(self.max_new_tokens >= 1, "sampling.max_new_tokens", self.max_new_tokens, "must be >= 1")
        check(self.samples_per_prompt <= MAX_SAMPLES_PER_PROMPT, "sampling.samples_per_prompt",
              self.samples_per_prompt, f"must be <= {MAX_SAMPLES_PER_PROMPT}")
        check(self.max_new_tokens <= MAX_NEW_TOKENS, "sampling.max_new_tokens", self.max_new_tokens,
              f"must be <= {MAX_NEW_TOKENS}")
        check(self.temperature > 0, "sampling.temperature", self.temperature, "must be > 0")
        check(0 < self.top_p <= 1, "sampling.top_p", self.top_p, "must be in (0, 1]")


@dataclass(frozen=True)
class TrainConfig:
    prompts_per_step: int = 16
    """Prompts per exploration stage; each gets samples_per_prompt completions."""
    lr: float = 1e-4
    """Policy learning rate (AdamW, constant after lr_warmup_steps)."""
    lr_warmup_steps: int = 0
    """Linear learning-rate warm-up at the start of RL."""
    lr_schedule: str = "constant"
    """constant, or cosine: decay to 0 over the budget (progress = budget consumed / amount,
    in the budget's unit), which keeps late noisy updates from undoing early gains."""
    weight_decay: float = 0.0
    """AdamW weight decay for the policy."""
    inner_epochs: int = 1
    """mu: optimisation passes over each batch of rollouts (DeepSeekMath uses 1)."""
    mini_batches: int = 1
    """Optimizer steps per pass over a batch of rollouts (verl's ppo_mini_batch_size, TRL's
    steps_per_generation): the batch's rows are split, in order, into this many disjoint slices
    of (nearly) equal size, one optimizer step each, every loss normalised over its own slice.
    Ratio and value clipping are against the log-probs and values from before the first step.
    With inner_epochs = 1 and mini_batches = 1 there is one step per batch, so the ratio is 1 and
    clipping is inactive (clip_eps and value_clip do nothing)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward; gradients accumulate to one optimizer step per pass."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping (0 = off)."""
    threads: int = 0
    """torch CPU threads (at most 1024). 0: in portable numerics, the launcher's cpus per run (OMP_NUM_THREADS)
    or else 2, never the machine's core count (results depend on it); in native numerics,
    torch's default."""
    save_final_model: bool = True
    """Save the final policy (and tokenizer) to <run_dir>/final_model for `harness eval`."""
    reuse_warmup_optimizer: bool = False
    """False (default): RL starts with a fresh AdamW, as TRL and verl do. True: start the
    policy's Adam from the warm-up's second-moment estimates (first moments zeroed) when the
    starting checkpoint ships them. With a fresh Adam the first updates are ~lr * sign(g) on
    every weight: on the tiny model even continued SFT on gold solutions at lr 5e-4 fell from
    59% to 50% in 3 steps that way."""
    checkpoint_minutes: float = 10.0
    """Also save the resume point after the stage that ends every this-many minutes of
    training (0 = only at evaluation points), so a long gap between evaluations loses at most
    this much to a kill. Does not change what the run computes, nor its run id."""

    def validate(self):
        check(self.prompts_per_step >= 1, "train.prompts_per_step", self.prompts_per_step, "must be >= 1")
        check(self.prompts_per_step <= MAX_PER_STEP, "train.prompts_per_step", self.prompts_per_step,
              f"must be <= {MAX_PER_STEP} (one stage's batch must fit in memory)")
        check(self.lr > 0, "train.lr", self.lr, "must be > 0")
        check(self.lr_warmup_steps >= 0, "train.lr_warmup_steps", self.lr_warmup_steps, "must be >= 0")
        check_choice("train.lr_schedule", self.lr_schedule, ("constant", "cosine"))
        check(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "must be >= 0")
        check(self.inner_epochs >= 1, "train.inner_epochs", self.inner_epochs, "must be >= 1")
        check(self.mini_batches >= 1, "train.mini_batches", self.mini_batches, "must be >= 1")
        check(self.micro_batch_size >= 1, "train.micro_batch_size", self.micro_batch_size, "must be >= 1")
        check(self.max_grad_norm >= 0, "train.max_grad_norm", self.max_grad_norm, "must be >= 0")
        check_threads("train.threads", self.threads, low=0, meaning=" (0: the default count)")
        check(self.checkpoint_minutes >= 0, "train.checkpoint_minutes", self.checkpoint_minutes,
              "must be >= 0 (0 = checkpoint at evaluation points only)")


@dataclass(frozen=True)
class AlgorithmConfig:
    name: str = "grpo"
    """Named algorithm; sets the defaults of every component below that is left null:
    grpo, grpo_ps (process supervision), grpo_iter (reference resets only; the paper's iterative RL with
    reward-model retraining is reward_model.rounds), dr_grpo, rloo, prime (RLOO + process returns; PRIME
    with reward_model.type=implicit), grpo_token_mean, ppo, rft, rft_dedup."""
    advantage: Optional[str] = None
    """Advantage estimator (registry in algorithms.advantages), e.g. grpo, grpo_ps, rloo, dr_grpo, gae."""
    policy_loss: Optional[str] = None
    """Per-token policy loss (algorithms.losses): ppo_clip or sft_nll."""
    aggregation: Optional[str] = None
    """How per-token losses become one number: seq-mean-token-mean (DeepSeekMath),
    token-mean, seq-mean-token-sum-norm (Dr. GRPO's constant normaliser)."""
    reward: Optional[str] = None
    """Reward signal: outcome (one score per completion) or process (one per step)."""
    filter: Optional[str] = None
    """Sample filter before the update: none; correct (online RFT: every correct output, alias
    correct_only); correct_dedup (each distinct correct text of a group once). Dropped rows have
    gradient coefficient 0: losses are still normalised by the whole sampled batch."""
    clip_eps: float = 0.2
    """epsilon of the clipped ratio min(r A, clip(r, 1-eps, 1+eps) A)."""
    kl_coef: Optional[float] = None
    """beta: KL weight (GRPO: 0.04 in the loss; PPO: 0.04 as a per-token reward penalty)."""
    kl_estimator: Optional[str] = None
    """KL estimator k1 (log ratio), k2 (half squared log ratio) or k3 (pi_ref/pi - log(pi_ref/pi) - 1)."""
    kl_placement: Optional[str] = None
    """Where the KL goes: loss, reward, or none (no reference model is held)."""
    std_eps: float = 1e-4
    """Added to the group standard deviation (see group_std) before dividing."""
    group_std: str = "population"
    """Std of GRPO's group normalisation (grpo, grpo_ps): population (ddof 0) or sample
    (ddof 1, larger by sqrt(G / (G - 1)))."""
    whiten_advantages: Optional[bool] = None
    """Whiten the advantages over the batch (masked mean, unbiased masked std, as verl's
    masked_whiten); null = the preset's (ppo: true, others false)."""
    prm: Optional[str] = None
    """Process rewards (reward: process): null = the task's rule-based step checker; a local
    directory = a neural process reward model (Math-Shepherd style, see evals.prm)."""
    ref_reset_every: int = 0
    """Reference resets: reset the reference model to the current policy every N steps (0 = never);
    grpo_iter requires N >= 1. (Iterative RL with a retrained reward model: reward_model.rounds.)"""
    gae_gamma: float = 1.0
    """PPO: discount of GAE."""
    gae_lambda: float = 0.95
    """PPO: lambda of GAE."""
    critic_lr: float = 3e-4
    """PPO: learning rate of the value model."""
    value_clip: float = 0.2
    """PPO: clip range of the clipped value loss (around the rollout-time values)."""
    value_coef: float = 0.5
    """PPO: weight of the value loss (the critic has its own optimizer; this scales its loss)."""
    critic_warmup_steps: int = 0
    """PPO: steps at the start that train only the critic (policy frozen)."""
    dr_grpo_norm: int = 0
    """Dr. GRPO: constant normaliser of the token sum (0 = sampling.max_new_tokens)."""

    def validate(self):
        check(self.clip_eps > 0, "algorithm.clip_eps", self.clip_eps, "must be > 0")
        check(self.kl_coef is None or self.kl_coef >= 0, "algorithm.kl_coef", self.kl_coef, "must be >= 0")
        check(self.std_eps >= 0, "algorithm.std_eps", self.std_eps, "must be >= 0")
        check_choice("algorithm.group_std", self.group_std, ("population", "sample"))
        check(self.ref_reset_every >= 0, "algorithm.ref_reset_every", self.ref_reset_every, "must be >= 0")
        check(0 <= self.gae_gamma <= 1, "algorithm.gae_gamma", self.gae_gamma, "must be in [0, 1]")
        check(0 <= self.gae_lambda <= 1, "algorithm.gae_lambda", self.gae_lambda, "must be in [0, 1]")
        check(self.critic_lr > 0, "algorithm.critic_lr", self.critic_lr, "must be > 0")
        check(self.value_clip > 0, "algorithm.value_clip", self.value_clip, "must be > 0")
        check(self.critic_warmup_steps >= 0, "algorithm.critic_warmup_steps", self.critic_warmup_steps, "must be >= 0")
        check(self.dr_grpo_norm >= 0, "algorithm.dr_grpo_norm", self.dr_grpo_norm, "must be >= 0")

    # of the resolved section (Config.algo), whose components are filled in
    @property
    def critic(self) -> bool:
        """Whether the algorithm trains a critic (its preset has one, or its advantage is gae)."""
        return has_critic(self)

    @property
    def uses_reference(self) -> bool:
        """Whether the algorithm holds a reference model (a KL term is on)."""
        return uses_reference(self)


REWARD_MODEL_TYPES = ("orm", "prm", "implicit")


@dataclass(frozen=True)
class RewardModelConfig:
    """A learned reward model in the loop (docs/reward_models.md). Left at its defaults the
    section changes nothing and does not enter the run id (harness.rundir.ids)."""

    type: Optional[str] = None
    """null: rewards from the task's exact checker (and algorithm.prm), as always. orm: a learned
    outcome reward model (P(good) at a tag after the completion) gives the outcome reward. prm: a
    learned Math-Shepherd-style process reward model (P(good) at a tag after each step) gives the
    step rewards (algorithms with reward: process). implicit: PRIME's implicit PRM (Cui et al. 2025),
    a copy of the starting policy trained online on every batch's outcome labels, whose per-token
    beta*log(pi_rm/pi_ref) are the process rewards (algorithm prime or grpo_ps). orm and prm are
    trained on the policy's own samples labelled by the exact checker (the grader for outcomes)."""
    init: Optional[str] = None
    """orm/prm: a folder written by `harness rm train` to start from (its recorded cost in samples,
    tokens and seconds is charged to this run's budget); null: one is trained before RL on
    samples_per_round samples of the starting policy."""
    rounds: int = 1
    """orm/prm: rounds of iterative RL (DeepSeekMath §4.2). 1: the reward model stays fixed during RL.
    R > 1: the budget is cut into R equal parts; at the end of each but the last the current policy
    draws samples_per_round samples, the exact checker labels them, the reward model trains further
    on them plus a replay of earlier examples, and the reference is reset to the policy."""
    samples_per_round: int = 1024
    """Completions drawn from the current policy to (re)train the reward model each round (a
    multiple of sampling.samples_per_prompt). They count against the run's budget (samples,
    tokens), as does the reward model's training time (seconds)."""
    replay_fraction: float = 0.1
    """Share of the earlier rounds' examples replayed when the reward model trains further
    (drawn without replacement, the count rounded half up; DeepSeekMath: 10%)."""
    epochs: int = 4
    """orm/prm: passes over each round's training set."""
    lr: float = 1e-3
    """Learning rate of the reward model (AdamW, constant). The defaults (lr 1e-3, 4 epochs, micro-batch
    32) suit the tiny model: a PRM trained so on 2,048 samples of the quickstart's warm-up scored
    held-out steps at AUC 0.83 (lr 1e-4 with 2 epochs on 512 samples: 0.52; docs/reward_models.md)."""
    micro_batch_size: int = 32
    """Sequences per reward-model forward / backward (one optimizer step per micro-batch for
    orm/prm; one per batch of rollouts for implicit)."""
    beta: float = 0.05
    """implicit: beta of the implicit PRM (PRIME: 0.05): token process reward beta*log(pi_rm/pi_ref),
    outcome logit beta times their sum."""

    def validate(self):
        if self.type is not None:
            check_choice("reward_model.type", self.type, REWARD_MODEL_TYPES)
        check(self.rounds >= 1, "reward_model.rounds", self.rounds, "must be >= 1 (1 = one round, no retraining)")
        check(self.samples_per_round >= 1, "reward_model.samples_per_round", self.samples_per_round, "must be >= 1")
        check(0.0 <= self.replay_fraction <= 1.0, "reward_model.replay_fraction", self.replay_fraction,
              "must be in [0, 1]")
        check(self.epochs >= 1, "reward_model.epochs", self.epochs, "must be >= 1")
        check(self.lr > 0, "reward_model.lr", self.lr, "must be > 0")
        check(self.micro_batch_size >= 1, "reward_model.micro_batch_size", self.micro_batch_size, "must be >= 1")
        check(self.beta > 0, "reward_model.beta", self.beta, "must be > 0")
        if self.init is not None:
            why = dir_path_problem(self.init)
            check(why is None, "reward_model.init", self.init, f"{why} (a folder written by `harness rm train`)")


@dataclass(frozen=True)
class BudgetConfig:
    unit: str = "steps"
    """Budget unit: samples (completions), tokens (generated), steps (optimizer stages) or
    seconds (wall-clock of training, evaluation excluded)."""
    amount: float = 40
    """Stop once this much of `unit` is consumed."""
    eval_points: int = 4
    """Evaluate at this many evenly spaced budget checkpoints (plus once before training)."""

    def validate(self):
        check_choice("budget.unit", self.unit, BUDGET_UNITS)
        check(self.amount > 0, "budget.amount", self.amount, "must be > 0")
        limit = MAX_BUDGET.get(self.unit)
        check(limit is None or self.amount <= limit, "budget.amount", self.amount,
              f"a budget in {self.unit} must be at most {limit:.0e} (a run cannot reach more)")
        check(self.eval_points <= MAX_EVAL_POINTS, "budget.eval_points", self.eval_points,
              f"must be <= {MAX_EVAL_POINTS}")
        check(self.eval_points >= 1, "budget.eval_points", self.eval_points, "must be >= 1")


@dataclass(frozen=True)
class OodEvalConfig:
    """An out-of-domain held-out set: the task with some knobs changed (arith: more operations
    or larger operands than training saw), scored at the start and at the end of the run
    (greedy, and the n samples when ``eval.n`` > 0), as ``eval/<task>_ood/...`` metrics."""

    enabled: bool = False
    """Score the out-of-domain set at the start and the end of the run."""
    min_ops: Optional[int] = None
    """Fewest operations (None: the task's)."""
    max_ops: Optional[int] = None
    """Most operations (None: the task's)."""
    min_operand: Optional[int] = None
    """Smallest operand (None: the task's)."""
    max_operand: Optional[int] = None
    """Largest operand (None: the task's)."""
    eval_size: Optional[int] = None
    """Problems in the set (None: the task's eval_size)."""

    def overrides(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "enabled" and v is not None}


@dataclass(frozen=True)
class EvalConfig:
    greedy: bool = True
    """Report greedy (temperature 0) accuracy on the held-out set."""
    n: int = 0
    """Samples per problem for pass@k / maj@k curves (0 = greedy only)."""
    temperature: float = 1.0
    """Temperature of the n samples."""
    max_new_tokens: int = 0
    """Completion limit for evaluation (0 = sampling.max_new_tokens)."""
    final_only_samples: bool = True
    """Draw the n samples only at the final checkpoint (greedy accuracy at every one)."""

    sample_problems: int = 0
    """Draw the n samples for pass@k / maj@k on the first this-many held-out problems only
    (0 = all); greedy accuracy always uses every problem. Lets a large greedy set (small
    standard error) sit beside an affordable n = 64 evaluation."""
    ood: OodEvalConfig = field(default_factory=OodEvalConfig)
    """Out-of-domain held-out set (off by default)."""
    validation: bool = False
    """Also score the final model (greedy) on the task's validation split, disjoint from the
    training and test problems (summary.json ``final_val_eval``), to choose hyper-parameters
    such as the learning rate without looking at the test set (a sweep's ``select``)."""

    def validate(self):
        check(self.n >= 0, "eval.n", self.n, "must be >= 0")
        check(self.greedy or self.n > 0, "eval.n", self.n,
              "with eval.greedy=false, eval.n must be >= 1 (otherwise nothing is evaluated)")
        check(self.n <= MAX_PER_STEP, "eval.n", self.n, f"must be <= {MAX_PER_STEP}")
        check(self.temperature > 0, "eval.temperature", self.temperature, "must be > 0")
        check(self.max_new_tokens >= 0, "eval.max_new_tokens", self.max_new_tokens, "must be >= 0")
        check(self.sample_problems >= 0, "eval.sample_problems", self.sample_problems, "must be >= 0 (0 = all)")


@dataclass(frozen=True)
class TrackingConfig:
    mlflow: bool = False
    """Mirror metrics to MLflow (JSONL is always written)."""
    mlflow_uri: Optional[str] = None
    """MLflow tracking URI (default: sqlite database under the results directory): sqlite:///<path>.db,
    file:<path>, http(s)://<host>[:<port>], postgresql|mysql|mssql://..., or databricks."""
    wandb: bool = False
    """Mirror metrics to Weights & Biases (offline unless configured online)."""
    wandb_mode: Optional[str] = None
    """wandb mode: offline | online | disabled (default: offline unless WANDB_MODE is set)."""
    wandb_project: str = "grpo-harness"
    """wandb project name (with wandb on: 1 to 128 characters, none of / \\ # ? % :)."""

    def validate(self):
        if self.mlflow_uri is not None:
            why = mlflow_uri_problem(self.mlflow_uri)
            check(why is None, "tracking.mlflow_uri", self.mlflow_uri,
                  f"{why}; accepted: {MLFLOW_URI_FORMS}, or null (sqlite:///<output_dir>/mlflow.db)")
        if self.wandb_mode is not None:
            check_choice("tracking.wandb_mode", self.wandb_mode, WANDB_MODES)
        if self.wandb:  # the project name wandb will be given (wandb refuses these at wandb.init, mid-run)
            p, bad = self.wandb_project, sorted(set(_WANDB_PROJECT_BAD) & set(self.wandb_project))
            check(0 < len(p) <= 128 and not bad, "tracking.wandb_project", p,
                  "must be a wandb project name: 1 to 128 characters, none of " + " ".join(_WANDB_PROJECT_BAD)
                  + (f" (it holds {' '.join(bad)})" if bad else ""))


def mlflow_uri_problem(uri: str) -> Optional[str]:
    """Why ``uri`` is not an MLflow tracking URI (None when it is): it must name one of
    :data:`MLFLOW_SCHEMES` with what that scheme needs (`MLFLOW_URI_FORMS`). A bare path is
    refused: MLflow would read it as its file store, which MLflow 3 refuses by default, and a typo
    would read as a folder; ``sqlite:///<path>/mlflow.db`` (or ``file:<path>``) says which."""
    if not uri:
        return "is empty"
    if uri in ("databricks", "databricks-uc", "uc"):
        return None
    m = _URI_SCHEME.match(uri)
    if m is None or len(m.group(1)) == 1:  # no scheme, or a Windows drive letter
        return f"has no URI scheme (a folder: sqlite:///{uri.rstrip('/') or '<path>'}/mlflow.db)"
    scheme, rest = m.group(1).lower(), m.group(2)
    base = scheme.split("+", 1)[0]
    if base not in MLFLOW_SCHEMES or ("+" in scheme and base not in ("postgresql", "mysql", "mssql", "sqlite")):
        return f"scheme '{scheme}:' is not one MLflow keeps runs with"
    if base == "sqlite" and not (rest.startswith("///") and len(rest) > 3):
        return "a SQLite store is sqlite:///<path to the .db file> (three slashes, then the path)"
    if base in ("http", "https") and not re.match(r"^//[^/\s]+", rest):
        return f"an {base} store is {base}://<host>[:<port>][/<path>]"
    if base == "file" and rest in ("", "//", "///"):
        return "a file store is file:<path> or file:///<absolute path>"
    if base in ("postgresql", "mysql", "mssql") and not rest.startswith("//"):
        return f"a {base} store is {scheme}://<user>:<password>@<host>/<database>"
    return None


@dataclass(frozen=True)
class Config:
    name: str = "default"
    """Experiment name: results go to <output_dir>/<name>/<run_id>/."""
    seed: int = 0
    """Seed of sampling, initialisation and prompt order."""
    output_dir: str = "results"
    """Root of run outputs."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (cuda when available)."""
    numerics: str = "portable"
    """portable: ATen, MKL and oneDNN pinned to code paths that give the same bits on every
    x86-64 CPU with AVX2 (Intel or AMD), and a fixed thread count; native: each library picks
    this CPU's fastest path (results then differ between CPU kinds). See
    harness/engine/numerics.py; every run records which it used."""
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
        check(is_safe_name(self.name), "name", self.name, NAME_RULE)
        check(0 <= self.seed <= MAX_SEED, "seed", self.seed, f"must be an integer from 0 to 2**63-1 ({MAX_SEED})")
        check(bool(_DEVICE_RE.match(self.device)), "device", self.device, "must be auto, cpu, cuda or cuda:N")
        why = dir_path_problem(self.output_dir)
        check(why is None, "output_dir", self.output_dir, str(why))
        check(self.numerics in NUMERICS_MODES, "numerics", self.numerics, f"must be one of {', '.join(NUMERICS_MODES)}")
        try:
            algo = self.algo
        except UnknownComponentError as e:
            raise ConfigError(f"algorithm: {e}") from None
        check(algo.advantage not in GROUP_ESTIMATORS or self.sampling.samples_per_prompt >= 2,
              "sampling.samples_per_prompt", self.sampling.samples_per_prompt,
              f"advantage '{algo.advantage}' normalises within a group of samples per prompt: G must be >= 2")
        check(self.budget.unit != "steps" or float(self.budget.amount).is_integer(), "budget.amount",
              self.budget.amount, "a budget in steps must be a whole number")
        check(self.train.prompts_per_step * self.sampling.samples_per_prompt <= MAX_PER_STEP,
              "train.prompts_per_step", self.train.prompts_per_step,
              f"prompts_per_step x sampling.samples_per_prompt must be <= {MAX_PER_STEP} samples per stage")
        if algo.reward == "process" and algo.prm in (None, "", "rule") and self.reward_model.type is None:
            check(has_step_checker(self.task.name), "algorithm.prm", algo.prm,
                  f"algorithm '{algo.name}' uses process rewards, and task '{self.task.name}' has no "
                  f"step checker: set algorithm.prm to a process reward model directory, reward_model.type to "
                  f"implicit (PRIME), or use an outcome-reward algorithm")
        check(algo.name != "grpo_iter" or algo.ref_reset_every > 0, "algorithm.ref_reset_every", algo.ref_reset_every,
              "grpo_iter (GRPO with reference resets) resets its reference every N steps: set N >= 1")
        self._validate_reward_model(algo)
        ood = None
        if self.eval.ood.enabled:
            check(self.task.name == "arith", "eval.ood.enabled", True,
                  f"the out-of-domain knobs are arith's; task '{self.task.name}' has none")
            ood = ood_task_spec(self)  # validates the changed knobs
        if self.eval.validation and self.task.name == "arith" and self.task.disjoint_validation:
            space = problem_space(self.task)
            check(space.validation >= 1 if space.exact else space.validation >= self.task.eval_size,
                  "eval.validation", True,
                  f"the validation set draws task.eval_size={self.task.eval_size} problems from the validation half "
                  f"of the held-out bucket (task.disjoint_validation), and these arith knobs allow "
                  f"{'about ' if not space.exact else ''}{space.validation:,}: lower task.eval_size or widen the "
                  f"task (max_operand, operators, max_ops)")
        elif self.eval.validation and self.task.name == "arith":
            space = problem_space(self.task)
            check(space.heldout > self.task.eval_size if space.exact else space.heldout >= 2 * self.task.eval_size,
                  "eval.validation", True,
                  f"the validation split draws task.eval_size={self.task.eval_size} more held-out problems than "
                  f"the test set's, and these arith knobs allow {'about ' if not space.exact else ''}"
                  f"{space.heldout:,}: lower task.eval_size or widen the task (max_operand, operators, max_ops)")
        if self.warmup.enabled and self.warmup.long_share > 0:
            check(self.task.name == "arith", "warmup.long_share", self.warmup.long_share,
                  f"adds longer arith solutions to the warm-up; task '{self.task.name}' has none: set it to 0")
            long = warmup_long_spec(self)
            check(problem_space(long).train > 0, "warmup.long_ops", self.warmup.long_ops,
                  f"these arith knobs ({describe_knobs(long)}) leave no expression outside the held-out bucket "
                  f"for the warm-up's longer solutions: change warmup.long_ops or widen the task")
        if self.model.name_or_path == "tiny" and self.task.name == "arith":
            tasks = [self.task] + ([ood] if ood is not None else [])
            prompt = max(arith_prompt_tokens(t) for t in tasks)
            new = max(self.sampling.max_new_tokens, self.eval.max_new_tokens)
            check(self.model.max_length >= prompt + new, "model.max_length", self.model.max_length,
                  f"must hold the longest prompt ({prompt} tokens) + max_new_tokens ({new}) = {prompt + new}")

    def _validate_reward_model(self, algo) -> None:
        """The reward_model section fits the algorithm and the task (one ConfigError naming the field)."""
        rm = self.reward_model
        if rm.type is None:
            check(rm.rounds == 1, "reward_model.rounds", rm.rounds,
                  "iterative RL retrains a learned reward model: set reward_model.type to orm or prm (reference "
                  "resets alone are algorithm grpo_iter with algorithm.ref_reset_every)")
            check(rm.init is None, "reward_model.init", rm.init, "needs reward_model.type (orm or prm)")
            return
        wants = "outcome" if rm.type == "orm" else "process"
        check(algo.reward == wants, "reward_model.type", rm.type,
              f"gives {wants} rewards, and algorithm '{algo.name}' uses {algo.reward} rewards: use "
              + ("an outcome-reward algorithm (grpo, rloo, dr_grpo, ppo, ...)" if wants == "outcome"
                 else "a process-reward algorithm (grpo_ps, prime)"))
        check(algo.prm in (None, "", "rule"), "algorithm.prm", algo.prm,
              f"reward_model.type={rm.type} supplies the rewards: leave algorithm.prm null")
        check(rm.type != "implicit" or (rm.rounds == 1 and rm.init is None), "reward_model.type", rm.type,
              "the implicit PRM trains online on every batch: reward_model.rounds and reward_model.init are for "
              "orm and prm")
        check(rm.rounds == 1 or algo.ref_reset_every == 0, "algorithm.ref_reset_every",
              algo.ref_reset_every, "iterative RL (reward_model.rounds > 1) resets the reference at the "
              "end of each round: leave algorithm.ref_reset_every at 0")
        G = self.sampling.samples_per_prompt
        check(rm.samples_per_round % G == 0, "reward_model.samples_per_round", rm.samples_per_round,
              f"must be a multiple of sampling.samples_per_prompt ({G}): whole groups of the policy's samples")
        trainings = (rm.rounds - 1 + (rm.init is None)) if rm.type != "implicit" else 0
        check(self.budget.unit != "samples" or rm.samples_per_round * trainings < self.budget.amount,
              "reward_model.samples_per_round", rm.samples_per_round,
              f"{trainings} reward-model training(s) of {rm.samples_per_round} samples would use the whole budget of "
              f"{self.budget.amount:g} samples (they count against it): lower it or reward_model.rounds")
        if rm.type == "prm" and not has_step_checker(self.task.name):
            check(rm.init is not None and rm.rounds == 1, "reward_model.type", rm.type,
                  f"task '{self.task.name}' has no exact step checker to label the policy's samples during the run: "
                  f"train a PRM with `harness rm train --step-labels mc` and give it as reward_model.init with "
                  f"reward_model.rounds=1, or use reward_model.type=implicit")

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


def dir_path_problem(value: Any) -> Optional[str]:
    """Why ``value`` cannot name a directory (None when it can): not text, empty, or holding a
    NUL byte (the OS cannot hold one in a path)."""
    if not isinstance(value, str):
        return "must be a directory path"
    if not value:
        return "must be a directory path, not empty"
    if "\0" in value:
        return "contains a NUL byte (\\0), which no path can hold"
    return None


def config_warnings(cfg: Config) -> list[str]:
    """What a valid config will do that its author may not expect, one line each (the commands
    print them before any work): evaluation points other than ``budget.eval_points`` asks (they
    fall on stage boundaries), and an arith evaluation set asked to be larger than the held-out
    problems its knobs allow, which evaluates all of them."""
    out = []
    points = threshold_warning(cfg.budget, stage_samples(cfg.train.prompts_per_step, cfg.sampling.samples_per_prompt))
    if points:
        out.append(points)
    sets = [("task", cfg.task)] + ([("eval.ood", ood_task_spec(cfg))] if cfg.eval.ood.enabled else [])
    for label, spec in sets:
        if spec.name == "arith":
            have = held_out_shortfall(spec, spec.eval_size)
            if have is not None:
                out.append(f"{label}.eval_size={spec.eval_size}: these arith knobs ({describe_knobs(spec)}) allow "
                           f"only {have} held-out problem{'s' if have != 1 else ''}, so the evaluation set "
                           f"holds {have}")
    if cfg.eval.validation and cfg.task.name == "arith" and cfg.task.disjoint_validation:
        space = problem_space(cfg.task)
        if space.exact and space.validation < cfg.task.eval_size:
            out.append(f"eval.validation: the validation half of the held-out bucket holds {space.validation} "
                       f"problems, fewer than task.eval_size={cfg.task.eval_size}, so the validation set holds "
                       f"{space.validation}")
    elif cfg.eval.validation and cfg.task.name == "arith":
        have = held_out_shortfall(cfg.task, 2 * cfg.task.eval_size)
        if have is not None and have > cfg.task.eval_size:
            out.append(f"eval.validation: the validation split gets the {have - cfg.task.eval_size} held-out "
                       f"problems the test set leaves, fewer than task.eval_size={cfg.task.eval_size}")
    return out


def warmup_long_spec(cfg: Config) -> TaskConfig:
    """The task the warm-up's longer solutions (``warmup.long_share``) are drawn from: the run's
    task with exactly ``warmup.long_ops`` operations."""
    return dataclasses.replace(cfg.task, min_ops=cfg.warmup.long_ops, max_ops=cfg.warmup.long_ops)


def ood_task_spec(cfg: Config) -> TaskConfig:
    """The out-of-domain set's task: the run's task with ``eval.ood``'s knobs changed."""
    spec = dataclasses.replace(cfg.task, **cfg.eval.ood.overrides())
    try:
        spec.validate(evaluate_only=True)  # only scored: its knobs need held-out problems, not training ones
    except ConfigError as e:
        raise ConfigError(f"eval.ood: {e}") from None
    return spec


NAMED_SECTIONS = ("algorithm", "task")
"""Top-level sections with the ``section: name`` shorthand (``algorithm: ppo`` is
``algorithm: {name: ppo}``)."""


def deep_merge(a: dict, b: dict, top: bool = True) -> dict:
    """``b`` layered onto ``a`` (a new dict; nested mappings merge, other values replace).
    At the top level a named section given as a string on one side and a mapping on the
    other merges as ``{name: ...}`` (``algorithm: ppo`` + ``algorithm: {kl_coef: 0}``); a new
    name keeps the section's other fields as :func:`rename_section` says."""
    out = dict(a)
    for k, v in b.items():
        cur = out.get(k)
        if top and k in NAMED_SECTIONS:
            if isinstance(v, dict):
                cur = expand_shorthand(cur)
            elif isinstance(cur, dict):
                v = expand_shorthand(v)
            if isinstance(v, dict) and isinstance(cur, dict) and "name" in v:
                cur = rename_section(k, cur, v["name"])
        if isinstance(v, dict) and isinstance(cur, dict):
            out[k] = deep_merge(cur, v, top=False)
        else:
            out[k] = v
    return out


def rename_section(section: str, current: dict, name: Any) -> dict:
    """The named section ``current`` (a mapping) given the name ``name``, as ``--set algorithm=ppo``,
    ``--set algorithm.name=ppo`` or a sweep's ``algorithm`` grid do: every field written in it is kept
    (``kl_coef: 0.0, clip_eps: 0.1`` stay), except, when an ``algorithm`` section that names one
    algorithm gets another, the components (``COMPONENTS``: advantage, policy_loss, ..., kl_coef)
    whose value is the old algorithm's preset: those came with the old name (a run's config.yaml
    writes them all out) and become the new algorithm's (null)."""
    out = dict(current)
    old = out.get("name")
    out["name"] = name
    if (section != "algorithm" or not isinstance(old, str) or not isinstance(name, str) or old == name
            or old not in ALGORITHMS or name not in ALGORITHMS):
        return out
    preset = ALGORITHMS[old]
    for k in COMPONENTS:
        v = out.get(k)
        if v is not None and v == preset[k] and isinstance(v, bool) == isinstance(preset[k], bool):
            out[k] = None
    return out


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """Apply ``a.b.c=value`` into nested dict ``data``. A named section set to a name
    (``algorithm=ppo`` over an ``algorithm`` mapping) keeps the mapping's fields, as
    :func:`rename_section` says, rather than dropping them."""
    keys = dotted.split(".")
    cur = data
    for k in keys[:-1]:
        nxt = cur.get(k)
        nxt = expand_shorthand(nxt)  # `algorithm: grpo` shorthand, now being refined
        if nxt is None:
            nxt = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {brief(dotted)[1:-1]}: '{brief(k)[1:-1]}' is not a section")
        cur[k] = nxt
        cur = nxt
    last = keys[-1]
    if cur is data and last in NAMED_SECTIONS and isinstance(cur.get(last), dict) and isinstance(value, str):
        cur[last] = rename_section(last, cur[last], value)  # `--set algorithm=ppo` over a mapping
    elif len(keys) == 2 and keys[0] in NAMED_SECTIONS and last == "name" and cur.get("name") != value:
        data[keys[0]] = rename_section(keys[0], cur, value)  # `--set algorithm.name=ppo`
    else:
        cur[last] = value


def effective_dict(cfg: Config | dict) -> dict:
    """The config as it runs, as a plain dict: :meth:`Config.effective_dict` of a loaded config; a
    config read back as a mapping (a run's config.yaml or summary) with its ``algorithm`` section
    (a mapping or the ``"ppo"`` shorthand) resolved the same way, every other key as written. An
    algorithm section naming an unknown algorithm or component is left as written."""
    if isinstance(cfg, Config):
        return cfg.effective_dict()
    d = dict(cfg)
    if "algorithm" in d:
        d["algorithm"] = _effective_section(d["algorithm"])
    return d


def _effective_section(section: Any) -> Any:
    """An ``algorithm`` section as written (a mapping or the shorthand) with its null components
    filled from the preset (values as written, unchecked but for their names)."""
    sec = expand_shorthand(section)
    if not isinstance(sec, dict) or sec.get("name", AlgorithmConfig.name) not in ALGORITHMS:
        return section
    sec = {"name": AlgorithmConfig.name, **sec}
    try:
        algo = resolve(AlgorithmConfig(**{k: sec.get(k) for k in ("name",) + COMPONENTS}))
    except UnknownComponentError:
        return section
    return {**sec, **{k: getattr(algo, k) for k in COMPONENTS}}


def config_from_dict(data: dict | None) -> Config:
    return from_dict(Config, dict(data or {}))


def algorithm_name(data: dict) -> str:
    """The algorithm a config mapping names, whether as ``algorithm: ppo`` or
    ``algorithm: {name: ppo}`` (the default algorithm when it names none)."""
    a = expand_shorthand(data.get("algorithm", AlgorithmConfig.name))
    return str(a.get("name", AlgorithmConfig.name)) if isinstance(a, dict) else str(a)


def parse_overrides(overrides: list[str] | None) -> list[tuple[str, Any]]:
    """``["a.b=1e-4", ...]`` -> ``[("a.b", 0.0001), ...]``: each value read as YAML (text that is
    not YAML stays text); a value YAML refuses for its size, a repeated key or a value that
    cannot be read is an error naming the override."""
    out = []
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {brief(item)}")
        key, raw = item.split("=", 1)
        try:
            value = strict_yaml_load(raw) if raw != "" else ""
        except (DuplicateKeyError, YamlTooLarge, YamlBadValue) as e:
            raise ConfigError(f"--set {brief(key.strip())[1:-1]}=...: {e}") from None
        except yaml.YAMLError:
            value = raw
        out.append((key.strip(), value))
    return out


def yaml_error_line(e: yaml.YAMLError) -> str:
    """One line for a YAML parse error: the problem and where (line, column)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if problem and mark is not None:
        ctx = getattr(e, "context", None)
        return f"{ctx + ': ' if ctx else ''}{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(e).split())


def strict_yaml_load(text: str) -> Any:
    """``yaml.safe_load`` that raises a ``yaml.YAMLError`` on a repeated key (`DuplicateKeyError`),
    on aliases that expand beyond reason or a recursive structure (`YamlTooLarge`) and on a value
    that cannot be read (:mod:`harness.config.yamlsafe`). Config files, sweep files and ``--set``
    values are read with it."""
    return yamlsafe.load(text)


def read_yaml_file(path: str | os.PathLike, kind: str = "config", error: type = ConfigError) -> Any:
    """The parsed YAML of a ``kind`` file (config or sweep), every failure an ``error`` naming the file."""
    p = Path(path)
    if not p.exists():
        raise error(f"{kind} file not found: {p}")
    if not p.is_file():
        raise error(f"{kind} file is not a file: {p}")
    try:
        return strict_yaml_load(p.read_text())
    except (DuplicateKeyError, YamlTooLarge, YamlBadValue) as e:
        raise error(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        raise error(f"{p}: not valid YAML: {yaml_error_line(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{p}: cannot read: {e}") from None


def load_yaml(path: str | os.PathLike) -> dict:
    p = Path(path)
    data = read_yaml_file(p)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping of config sections, got {type(data).__name__}")
    return data


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None,
                base: dict | None = None) -> Config:
    """YAML file (optional) + ``key.sub=value`` overrides -> validated Config."""
    data: dict = dict(base or {})
    if path is not None:
        data = deep_merge(data, load_yaml(path))
    for key, value in parse_overrides(overrides):
        set_dotted(data, key, value)
    where = f" (in {path})" if path else ""
    try:
        return config_from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{e}{where}") from None


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """``config.yaml``: the effective config (:meth:`Config.effective_dict`, the algorithm's
    preset-filled components written out), which is also what the run id hashes: a config.yaml
    loads back as the same run."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, yaml.safe_dump(cfg.effective_dict(), sort_keys=False))


def config_hash(obj: Any, length: int = 10) -> str:
    """Stable short hash of a config (or any section / dict): the cache keys' hash
    (:func:`harness.config.base.stable_hash`; run ids use the same with integral floats as ints)."""
    return stable_hash(obj, length)


def describe(cls=Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default, doc) for every field, for `harness config --help`."""
    rows = []
    docs = field_docs(cls)
    default = cls()
    for f in dataclasses.fields(cls):
        v = getattr(default, f.name)
        if dataclasses.is_dataclass(v):
            rows.extend(describe(type(v), f"{prefix}{f.name}."))
        else:
            rows.append((f"{prefix}{f.name}", repr(v), docs.get(f.name, "")))
    return rows
