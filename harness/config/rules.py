"""Input rules, each written once: what a config field takes (range, choices, name, device, path), declared on the field and called wherever an option or key stands for it.

A :class:`Rule` says what a value must be (``must be >= 1``); :func:`ruled` declares rules on a
dataclass field, as pydantic's ``Field(ge=1)`` does, and :func:`check_fields` checks a section's
fields against them (each section's ``validate()`` calls it). The command line and sweep files
call the same rules for the options and keys that stand for config fields
(:func:`harness.config.fields.option_problem`), so a limit or a spelling has one definition and
one message: ``field=value is invalid: must be ...``.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Optional

from algorithms.presets import algorithm_problem
from harness.foundation.base import ConfigError, did_you_mean, invalid
from harness.foundation.numerics import MODES as NUMERICS_MODES  # no torch: numerics imports it where it needs it

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


class Rule:
    """One input rule. ``why(value)`` is None for a value the rule takes, else what the value must be
    (``"must be >= 1"``); :meth:`problem` puts the field (or the option) and the value in front. A
    rule whose ``why`` names the value itself (``names_value``) is put after the field alone."""

    def __init__(self, why: Callable[[Any], Optional[str]], names_value: bool = False):
        self.why = why
        self.names_value = names_value

    def ok(self, value: Any) -> bool:
        return self.why(value) is None

    def problem(self, field: str, value: Any) -> Optional[str]:
        """``field=value is invalid: why`` (or ``field: why``), or None when the rule takes ``value``."""
        why = self.why(value)
        if why is None:
            return None
        return f"{field}: {why}" if self.names_value else invalid(field, value, why)

    def check(self, field: str, value: Any) -> None:
        """Raise the ConfigError of :meth:`problem`, if any."""
        bad = self.problem(field, value)
        if bad:
            raise ConfigError(bad)


def rule(test: Callable[[Any], bool], must: str) -> Rule:
    """The rule that ``test(value)`` holds, said as ``must``."""
    return Rule(lambda v: None if test(v) else must)


def _number(test: Callable[[Any], bool], must: str) -> Rule:
    """A rule on a number (not a bool): ``test`` holds, said as ``must``; NaN and infinities are refused."""
    def why(v: Any) -> Optional[str]:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return must
        if isinstance(v, float) and not math.isfinite(v):
            return "must be a finite number"
        return None if test(v) else must
    return Rule(why)


def at_least(low: float, note: str = "") -> Rule:
    return _number(lambda v: v >= low, f"must be >= {low}{note}")


def above(low: float, note: str = "") -> Rule:
    return _number(lambda v: v > low, f"must be > {low}{note}")


def at_most(high: float, note: str = "") -> Rule:
    return _number(lambda v: v <= high, f"must be <= {high}{note}")


def between(low: float, high: float, note: str = "") -> Rule:
    return _number(lambda v: low <= v <= high, f"must be between {low} and {high}{note}")


FRACTION = _number(lambda v: 0 <= v <= 1, "must be in [0, 1]")
POSITIVE_FRACTION = _number(lambda v: 0 < v <= 1, "must be in (0, 1]")


def one_of(choices: tuple | Callable[[], Any]) -> Rule:
    """``value`` is one of ``choices`` (or of what ``choices()`` returns, read when checked); the
    message lists them and the closest one."""
    def why(v: Any) -> Optional[str]:
        names = list(choices() if callable(choices) else choices)
        if v in names:
            return None
        return f"must be one of {', '.join(map(str, names))}{did_you_mean(v, names, n=1)}"
    return Rule(why)


def all_of(*rules: Rule) -> Rule:
    """Each of ``rules`` in turn (the first one broken speaks)."""
    return Rule(lambda v: next((w for w in (r.why(v) for r in rules) if w is not None), None))


RULES = "rules"
"""The metadata key of a field's rules (:func:`ruled`)."""


def ruled(default: Any, *rules: Rule) -> Any:
    """A dataclass field holding ``default`` whose value must keep ``rules``, in order (None, where the
    field's type allows it, keeps every rule): the field's rules declared beside it."""
    return dataclasses.field(default=default, metadata={RULES: rules})


def field_rules(cls) -> dict[str, tuple[Rule, ...]]:
    """{field name: its rules} of dataclass ``cls``: those :func:`ruled` declared, then the class's
    ``FIELD_RULES`` (for fields a class inherits, such as the task section's from
    :class:`evals.tasks.TaskSpec`)."""
    declared = {f.name: f.metadata[RULES] for f in dataclasses.fields(cls) if RULES in f.metadata}
    return {**declared, **getattr(cls, "FIELD_RULES", {})}


def check_fields(obj: Any, section: str = "") -> None:
    """Every field of ``obj`` keeps its rules (:func:`field_rules`), else one ConfigError naming
    ``section.field`` and the value."""
    for name, rules in field_rules(type(obj)).items():
        value = getattr(obj, name)
        if value is not None:
            for r in rules:
                r.check(f"{section}.{name}" if section else name, value)


def field_problem(cls, dotted: str, value: Any, option: str) -> Optional[str]:
    """Why ``value`` of ``option`` breaks the rules of field ``dotted`` of dataclass ``cls``
    (sections descended: ``eval.n``), in ``option``'s name; None when it keeps them."""
    *sections, name = dotted.split(".")
    for s in sections:  # a section field's default_factory is the section's class
        cls = next(f for f in dataclasses.fields(cls) if f.name == s).default_factory
    for r in field_rules(cls)[name]:
        bad = r.problem(option, value)
        if bad:
            return bad
    return None


def is_safe_name(name) -> bool:
    """A run or sweep name that stays one directory below the output directory."""
    return isinstance(name, str) and len(name) <= 200 and bool(_NAME_RE.fullmatch(name)) and ".." not in name


NAME = rule(is_safe_name, NAME_RULE)
"""A run's or a sweep's name (``name``; a sweep file's ``name``)."""
DEVICE = rule(lambda v: isinstance(v, str) and _DEVICE_RE.fullmatch(v) is not None,
              "must be auto, cpu, cuda or cuda:N (N a CUDA device index)")
"""``device`` and every command's ``--device``."""
SEED = _number(lambda v: 0 <= v <= MAX_SEED, f"must be an integer from 0 to 2**63-1 ({MAX_SEED})")
"""``seed`` and ``harness eval --seed``."""
NUMERICS = one_of(NUMERICS_MODES)
"""``numerics``."""
ALGORITHM = Rule(algorithm_problem, names_value=True)
"""``algorithm.name`` and a sweep file's algorithm names: :func:`algorithms.presets.algorithm_problem`."""


def thread_count(low: int, note: str = "") -> Rule:
    """A number of threads: from ``low`` to :data:`MAX_THREADS`."""
    return between(low, MAX_THREADS, note)


THREADS = thread_count(1)
"""``warmup.threads``; the torch threads of each process of a sweep's run."""
THREADS_OR_DEFAULT = thread_count(0, " (0: the default count)")
"""``train.threads``, ``harness eval --threads``, and the count OMP_NUM_THREADS gives where they are 0."""
COMPLETION_TOKENS = at_most(MAX_NEW_TOKENS)
"""The longest completion: ``sampling.max_new_tokens``, ``eval.max_new_tokens``, ``harness eval --max-new-tokens``."""
STAGE_SAMPLES = between(1, MAX_PER_STEP, " (drawn at once, as one stage of a run)")
"""Samples a reward model's round draws at once: ``reward_model.samples_per_round``, ``harness rm train --samples``."""
DTYPES = ("float32", "bfloat16", "float16")
"""``model.dtype`` and ``harness eval --dtype``."""
SAMPLER_BACKENDS = ("hf", "paged", "vllm")
"""``sampling.backend`` (:data:`harness.engine.sampling.BACKENDS`)."""


def dir_path(note: str = "") -> Rule:
    """The value can name a directory (:func:`dir_path_problem`); ``note`` follows the reason."""
    return Rule(lambda v: None if dir_path_problem(v) is None else f"{dir_path_problem(v)}{note}")


def _mlflow_uri_why(uri: Any) -> Optional[str]:
    why = mlflow_uri_problem(uri)
    return None if why is None else f"{why}; accepted: {MLFLOW_URI_FORMS}, or null (sqlite:///<output_dir>/mlflow.db)"


MLFLOW_URI = Rule(_mlflow_uri_why)
"""``tracking.mlflow_uri``."""


def _wandb_project_why(p: str) -> Optional[str]:
    bad = sorted(set(_WANDB_PROJECT_BAD) & set(p))
    if 0 < len(p) <= 128 and not bad:
        return None
    return ("must be a wandb project name: 1 to 128 characters, none of " + " ".join(_WANDB_PROJECT_BAD)
            + (f" (it holds {' '.join(bad)})" if bad else ""))


WANDB_PROJECT = Rule(_wandb_project_why)
"""``tracking.wandb_project`` (with wandb on; wandb refuses these at wandb.init, mid-run)."""


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
