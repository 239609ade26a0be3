"""The sections of a run config other than the algorithm's: model, task, warm-up, sampling, training, budget, evaluation and tracking.

Each section is a frozen dataclass whose fields carry a docstring and their rules
(:func:`harness.config.rules.ruled`); its ``validate()`` checks them, then what its fields must
agree on, each refusal a ConfigError naming the field and the value.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Optional

from evals.arith import HELDOUT_MOD, describe_knobs, problem_space, space_problem, split_sizes
from evals.catalog import available_tasks
from evals.tasks import TaskSpec
from harness.config.rules import (COMPLETION_TOKENS, DTYPES, FRACTION, MAX_ARITH_EVAL_SIZE, MAX_BUDGET, MAX_EVAL_POINTS,
                                  MAX_PER_STEP, MAX_SAMPLES_PER_PROMPT, MAX_TINY_PARAMS, MLFLOW_URI,
                                  POSITIVE_FRACTION, SAMPLER_BACKENDS, THREADS, THREADS_OR_DEFAULT, TINY_VOCAB_SIZE,
                                  WANDB_MODES, WANDB_PROJECT, Rule, above, at_least, at_most, between,
                                  check_fields, dir_path, one_of, rule, ruled)
from harness.foundation.base import ConfigError, check
from harness.foundation.budget import BUDGET_UNITS


def tiny_param_count(m: "ModelConfig") -> int:
    """Parameters of the built-in tiny model ``m`` describes (`harness.engine.models.build_tiny_model`:
    a Llama with tied embeddings, as many key/value heads as heads, no biases): the embedding,
    per layer four hidden x hidden attention projections, three hidden x intermediate MLP
    projections and two norms, and the final norm."""
    h, i = m.hidden_size, m.intermediate_size
    return TINY_VOCAB_SIZE * h + m.num_layers * (4 * h * h + 3 * h * i + 2 * h) + h


def _gguf_if_a_file(path: str) -> bool:
    """``model.name_or_path`` names 'tiny', no file, or a .gguf file."""
    p = Path(os.path.expanduser(path))
    return path == "tiny" or not p.is_file() or p.suffix.lower() == ".gguf"


MODEL_PATH = rule(_gguf_if_a_file, "a file must be a .gguf model; otherwise give a Hugging Face model directory or "
                                   "'tiny'")


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a Llama decoder layer LoRA can adapt (``model.lora.target_modules``); the
embedding and the output head are not among them (the fast forward reads their weights as they are)."""


def _lora_targets_why(v) -> Optional[str]:
    if not isinstance(v, (list, tuple)) or not v:
        return f"must be a non-empty list of {', '.join(LORA_TARGETS)}"
    bad = [t for t in v if t not in LORA_TARGETS]
    if bad or len(set(v)) != len(v):
        return (f"must name each of its modules once, from {', '.join(LORA_TARGETS)}"
                + (f" ({', '.join(map(str, bad))} is not one)" if bad else " (one is repeated)"))
    return None


LORA_TARGET_MODULES = Rule(_lora_targets_why)


@dataclass(frozen=True)
class LoraConfig:
    """The ``model.lora`` section: low-rank adapters (LoRA, Hu et al. 2021) trained in place of the
    policy's weights, through PEFT (``harness.engine.lora``). Off at rank 0, the default, and then
    left out of config.yaml and run ids."""

    rank: int = ruled(0, between(0, 4096))
    """r: the adapters' rank (0 = off: every weight trains, as without this section). The base
    weights are frozen; each target linear layer W gains W + (alpha / r) B A with A [r, in]
    (random) and B [out, r] (zeros), so training starts from the base model exactly. Dropout is 0."""
    alpha: float = ruled(16.0, above(0))
    """LoRA's alpha: the update is scaled by alpha / rank."""
    target_modules: tuple[str, ...] = ruled(LORA_TARGETS, LORA_TARGET_MODULES)
    """The linear layers of every decoder layer that get adapters (default: all seven, as
    'all-linear')."""

    def validate(self):
        check_fields(self, "model.lora")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True)
class ModelConfig:
    name_or_path: str = ruled("tiny", MODEL_PATH)
    """'tiny' builds the built-in Llama-style model with a character tokenizer (trained from
    scratch by the warm-up); otherwise a local Hugging Face causal-LM directory, or a .gguf
    file (loaded with transformers' ``gguf_file=``)."""
    gguf_file: Optional[str] = None
    """GGUF file name inside ``name_or_path`` (a directory), when the weights are GGUF."""
    hidden_size: int = 128
    """Tiny model only: width of the residual stream."""
    num_layers: int = ruled(4, at_least(1))
    """Tiny model only: number of decoder layers."""
    num_heads: int = ruled(4, at_least(1))
    """Tiny model only: attention heads (head dim = hidden_size / num_heads)."""
    intermediate_size: int = ruled(384, at_least(1))
    """Tiny model only: SwiGLU MLP width."""
    max_length: int = ruled(96, at_least(8))
    """Tiny model only: maximum sequence length (prompt + completion) in tokens."""
    dtype: str = ruled("float32", one_of(DTYPES))
    """Parameter dtype: float32 | bfloat16 | float16 (float32 on CPU)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (off by default: ``model.lora.rank`` 0)."""

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("lora",)
    """Left out of config.yaml, run ids and cache keys while off (the section came later)."""

    def __post_init__(self):
        if not self.lora.enabled:  # off is off: alpha or targets given at rank 0 change nothing, nor the run id
            object.__setattr__(self, "lora", LoraConfig())

    def validate(self):
        check_fields(self, "model")
        check(self.hidden_size > 0 and self.hidden_size % self.num_heads == 0, "model.hidden_size",
              self.hidden_size, "must be positive and divisible by model.num_heads")
        if self.name_or_path == "tiny":
            head_dim = self.hidden_size // self.num_heads
            check(head_dim % 2 == 0, "model.num_heads", self.num_heads,
                  f"model.hidden_size / model.num_heads = {head_dim} must be even (rotary position embeddings "
                  f"rotate pairs of dimensions)")
            self._check_size()

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

    FIELD_RULES: ClassVar[dict] = {
        "name": (one_of(available_tasks),),
        "min_ops": (at_least(1),),
        "operators": (rule(lambda ops: bool(ops) and set(ops) <= set("+-*"), "must be a non-empty subset of '+-*'"),),
        "eval_size": (at_least(1),),
        "seed": (at_least(0),),
        "few_shot": (at_least(0),),
        "demo_error_rate": (FRACTION,),
    }
    """The rules of the fields :class:`evals.tasks.TaskSpec` declares (evals cannot import them)."""

    def validate(self, evaluate_only: bool = False):
        check_fields(self, "task")
        check(self.max_ops >= self.min_ops, "task.max_ops", self.max_ops, "must be >= task.min_ops")
        check(0 <= self.min_operand <= self.max_operand, "task.max_operand", self.max_operand,
              "need 0 <= min_operand <= max_operand")
        if self.name in ("arith", "wordarith"):  # wordarith: arith's knobs and splits, told as word problems
            check(self.name == "arith" or self.demo_error_rate == 0, "task.demo_error_rate", self.demo_error_rate,
                  "wordarith has no imperfect demonstrations: set it to 0")
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
    steps: int = ruled(1500, at_least(0))
    """Optimizer steps of warm-up."""
    examples_per_step: int = ruled(64, at_least(1))
    """Worked solutions per warm-up step."""
    lr: float = ruled(3e-3, above(0))
    """Peak learning rate (AdamW, linear warm-up then cosine decay to final_lr_fraction)."""
    final_lr_fraction: float = ruled(0.05, FRACTION)
    """Learning rate at the end of the warm-up, as a fraction of lr (1.0 = constant: the
    checkpoint is not annealed, as when SFT stops early)."""
    cache_dir: Optional[str] = ruled(None, dir_path(" (or null: <output_dir>/_cache/warmup)"))
    """Where warm-up checkpoints are cached (keyed by a hash of model+task+warmup); default
    ``<output_dir>/_cache/warmup``, so every run and sweep under one output directory shares
    it wherever the command is started. Does not enter the run id."""
    threads: int = ruled(2, THREADS)
    """torch CPU threads of the warm-up (1 to 1024): a fixed number, not the machine's cores, because the
    thread count changes how sums are split and so the checkpoint (it enters the cache key)."""
    per_seed: bool = False
    """Train one warm-up per run seed (the seed initialises the model and orders its data),
    shared by every algorithm of that seed; false: one warm-up (seed 0) for every run. A
    study with per-seed warm-ups measures the spread that comes from the starting point too."""
    long_share: float = ruled(0.0, FRACTION)
    """arith: the share of warm-up worked solutions drawn with ``long_ops`` operations instead of
    the task's min_ops..max_ops (each example independently; from the training bucket, with the
    task's demo_error_rate): a small share of longer supervised solutions, so that an
    out-of-domain set of longer problems is one the start solves in part. 0: off (left out of
    config.yaml, run ids and the warm-up's cache key)."""
    long_ops: int = ruled(4, between(1, 16))
    """arith: operations in the warm-up's longer solutions (``long_share``)."""
    pretrained: bool = False
    """Warm up a pretrained model too (model.name_or_path not 'tiny'): full fine-tuning of every
    weight of the loaded model on the task's worked solutions, through its chat template where the
    task uses one, cached like the tiny model's (the key adds the model file's size and mtime).
    false: a pretrained model starts RL as loaded, whatever warmup.enabled says (as always). Left
    out of config.yaml, run ids and cache keys while false."""

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("long_share", "long_ops", "pretrained")
    """Later knobs left out of config.yaml, run ids and cache keys at their defaults
    (:func:`harness.foundation.base.to_dict`)."""

    def validate(self):
        check_fields(self, "warmup")


def _vllm_where_installed(backend: str) -> bool:
    """vllm: an optional extra for CUDA machines, UNVERIFIED (never run by us yet): accepted only
    where the package is installed (the run logs that it is unverified), refused elsewhere."""
    return backend != "vllm" or importlib.util.find_spec("vllm") is not None


VLLM_INSTALLED = rule(_vllm_where_installed, "needs the vllm package (pip install 'grpo-harness[vllm]' on a CUDA "
                                             "machine); it is unverified: use 'hf' or 'paged' for results you rely on")


@dataclass(frozen=True)
class SamplingConfig:
    backend: str = ruled("hf", one_of(SAMPLER_BACKENDS), VLLM_INSTALLED)
    """Sampler backend (harness.engine.sampling.get_sampler): 'hf' (in-process, KV-cached decoding
    on the learner's weights; the reference), 'paged' (transformers' continuous batching with paged
    attention, harness.engine.paged), 'vllm' (harness.engine.vllm_sampler: optional extra for CUDA
    machines, accepted where vllm is installed, UNVERIFIED: it has not run on a GPU yet). The
    default is 'hf' on every device: on CPU it generated 2.4x to 12x the tokens/s of 'paged' at
    every measured setting (1 to 256 rows, 24 to 128 new tokens; bench/samplers.py, bench/README.md
    "Samplers"); no backend has been measured on a GPU."""
    samples_per_prompt: int = ruled(8, at_least(1), at_most(MAX_SAMPLES_PER_PROMPT))
    """G: completions sampled per prompt (the group for GRPO's baseline)."""
    max_new_tokens: int = ruled(40, at_least(1), COMPLETION_TOKENS)
    """Longest completion, in tokens; longer ones are truncated (and usually score 0)."""
    temperature: float = ruled(1.0, above(0))
    """Sampling temperature for rollouts."""
    top_p: float = ruled(1.0, POSITIVE_FRACTION)
    """Nucleus sampling mass for rollouts (1.0 = off)."""
    dtype: Optional[str] = ruled(None, one_of(DTYPES))
    """Precision of the sampler's copy of the policy (null: the sampler reads the learner's weights
    themselves, as always). bfloat16 with a float32 learner: the behaviour log-probs differ from the
    learner's at the same weights, a real mismatch for algorithm.correction to correct (and measure:
    offpolicy/* metrics). Any value samples from a copy refreshed every step (harness.train.pipeline)."""

    threads: int = ruled(0, THREADS_OR_DEFAULT)
    """torch threads of the pipelined sampler's own thread (train.staleness >= 1; at most 1024); 0: half the
    run's, at least 1. The learner keeps the run's (train.threads)."""

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("dtype", "threads")
    """Later settings left out of config.yaml and run ids at their defaults (earlier runs keep their ids)."""

    def validate(self):
        check_fields(self, "sampling")


@dataclass(frozen=True)
class TrainConfig:
    prompts_per_step: int = ruled(16, at_least(1), at_most(MAX_PER_STEP, " (one stage's batch must fit in memory)"))
    """Prompts per exploration stage; each gets samples_per_prompt completions."""
    lr: float = ruled(1e-4, above(0))
    """Policy learning rate (AdamW, constant after lr_warmup_steps)."""
    lr_warmup_steps: int = ruled(0, at_least(0))
    """Linear learning-rate warm-up at the start of RL."""
    lr_schedule: str = ruled("constant", one_of(("constant", "cosine")))
    """constant, or cosine: decay to 0 over the budget (progress = budget consumed / amount,
    in the budget's unit), which keeps late noisy updates from undoing early gains."""
    weight_decay: float = ruled(0.0, at_least(0))
    """AdamW weight decay for the policy."""
    inner_epochs: int = ruled(1, at_least(1))
    """mu: optimisation passes over each batch of rollouts (DeepSeekMath uses 1)."""
    mini_batches: int = ruled(1, at_least(1))
    """Optimizer steps per pass over a batch of rollouts (verl's ppo_mini_batch_size, TRL's
    steps_per_generation): the batch's rows are split, in order, into this many disjoint slices
    of (nearly) equal size, one optimizer step each, every loss normalised over its own slice.
    Ratio and value clipping are against the log-probs and values from before the first step.
    With inner_epochs = 1 and mini_batches = 1 there is one step per batch, so the ratio is 1 and
    clipping is inactive (clip_eps and value_clip do nothing)."""
    micro_batch_size: int = ruled(64, at_least(1))
    """Sequences per forward/backward; gradients accumulate to one optimizer step per pass."""
    max_grad_norm: float = ruled(1.0, at_least(0))
    """Gradient-norm clipping (0 = off)."""
    threads: int = ruled(0, THREADS_OR_DEFAULT)
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
    checkpoint_minutes: float = ruled(10.0, at_least(0, " (0 = checkpoint at evaluation points only)"))
    """Also save the resume point after the stage that ends every this-many minutes of
    training (0 = only at evaluation points), so a long gap between evaluations loses at most
    this much to a kill. Does not change what the run computes, nor its run id."""
    staleness: int = ruled(0, at_least(0), at_most(64))
    """k: the rollouts of step t are sampled with the weights after step max(0, t - k), exactly
    (harness.train.pipeline), so a run is the same whatever the timing; the sampler runs in a thread of
    its own, concurrently with the learner, the weights handed over after every step. 0: the on-policy
    loop (the sampler reads the learner's weights right before each step), bit for bit as before.
    k >= 1: one process only, not with algorithm.drop_zero_variance or reward_model.type; logs the offpolicy/*
    diagnostics (docs/offpolicy.md)."""

    heap_mmap_threshold_kib: int = ruled(0, at_least(0), at_most(32 * 1024, " (glibc's largest mmap threshold)"))
    """Memory, not values: with glibc, allocations of at least this many KiB get a mapping of their own, returned
    to the system when freed, and the heap's free top is returned at once (`harness.engine.heap.
    limit_heap_retention`), in the run's process from its start. 0: glibc's defaults, which keep freed memory
    for reuse: a pretrained model's evaluations then peak well above their live tensors. The SmolLM2 recipe
    sets 64 (docs/results.md)."""

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("staleness", "heap_mmap_threshold_kib")
    """Later settings left out of config.yaml and run ids at their defaults (earlier runs keep their ids)."""

    def validate(self):
        check_fields(self, "train")


@dataclass(frozen=True)
class BudgetConfig:
    unit: str = ruled("steps", one_of(BUDGET_UNITS))
    """Budget unit: samples (completions), tokens (generated), steps (optimizer stages) or
    seconds (wall-clock of training, evaluation excluded)."""
    amount: float = ruled(40, above(0))
    """Stop once this much of `unit` is consumed."""
    eval_points: int = ruled(4, at_least(1), at_most(MAX_EVAL_POINTS))
    """Evaluate at this many evenly spaced budget checkpoints (plus once before training)."""

    def validate(self):
        """The fields' rules, then the amount against its unit's limit (a budget beyond it never ends)
        and, in steps, a whole number: the one budget rule of a config and a sweep file's ``budget``."""
        check_fields(self, "budget")
        limit = MAX_BUDGET[self.unit]
        check(self.amount <= limit, "budget.amount", self.amount,
              f"a budget in {self.unit} must be at most {limit:.0e} (a run cannot reach more)")
        check(self.unit != "steps" or float(self.amount).is_integer(), "budget.amount", self.amount,
              "a budget in steps must be a whole number")


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
    n: int = ruled(0, at_least(0), at_most(MAX_PER_STEP))
    """Samples per problem for pass@k / maj@k curves (0 = greedy only)."""
    temperature: float = ruled(1.0, above(0))
    """Temperature of the n samples."""
    max_new_tokens: int = ruled(0, at_least(0), COMPLETION_TOKENS)
    """Completion limit for evaluation (0 = sampling.max_new_tokens)."""
    final_only_samples: bool = True
    """Draw the n samples only at the final checkpoint (greedy accuracy at every one)."""

    sample_problems: int = ruled(0, at_least(0, " (0 = all)"))
    """Draw the n samples for pass@k / maj@k on the first this-many held-out problems only
    (0 = all); greedy accuracy always uses every problem. Lets a large greedy set (small
    standard error) sit beside an affordable n = 64 evaluation."""
    ood: OodEvalConfig = field(default_factory=OodEvalConfig)
    """Out-of-domain held-out set (off by default)."""
    validation: bool = False
    """Also score the start and the final model (greedy) on the task's validation split, disjoint from the
    training and test problems (summary.json ``initial_val_eval`` / ``final_val_eval``; the start's is computed once
    per warm-up and cached beside it), to choose hyper-parameters such as the learning rate without looking at the
    test set (a sweep's ``select``), and to say how far the chosen setting moved from its start."""
    batch_size: int = ruled(256, at_least(1), at_most(4096))
    """Sequences the evaluations decode at once (greedy rows, or samples: the n samples' seeds go by chunk of this
    many, so it is part of what a sampled evaluation computes). Peak memory grows with it through the KV cache: a
    pretrained model's evaluation holds rows x tokens x its per-token cache (SmolLM2-135M: 45 KiB a token)."""

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("batch_size",)
    """Later settings left out of config.yaml, run ids and the start evaluation's cache key at their defaults."""

    def validate(self):
        check_fields(self, "eval")
        check(self.greedy or self.n > 0, "eval.n", self.n,
              "with eval.greedy=false, eval.n must be >= 1 (otherwise nothing is evaluated)")


@dataclass(frozen=True)
class TrackingConfig:
    mlflow: bool = False
    """Mirror metrics to MLflow (JSONL is always written)."""
    mlflow_uri: Optional[str] = ruled(None, MLFLOW_URI)
    """MLflow tracking URI (default: sqlite database under the results directory): sqlite:///<path>.db,
    file:<path>, http(s)://<host>[:<port>], postgresql|mysql|mssql://..., or databricks."""
    wandb: bool = False
    """Mirror metrics to Weights & Biases (offline unless configured online)."""
    wandb_mode: Optional[str] = ruled(None, one_of(WANDB_MODES))
    """wandb mode: offline | online | disabled (default: offline unless WANDB_MODE is set)."""
    wandb_project: str = "grpo-harness"
    """wandb project name (with wandb on: 1 to 128 characters, none of / \\ # ? % :)."""

    def validate(self):
        check_fields(self, "tracking")
        if self.wandb:  # the project name wandb will be given
            WANDB_PROJECT.check("tracking.wandb_project", self.wandb_project)
