"""Input rules of the run config, each written once: the limits, names, devices, thread counts and paths it takes.

The config's sections (:mod:`harness.config.sections`, :mod:`harness.config.algorithm`,
:mod:`harness.config.fields`) declare them on their fields; the command line and sweep files
call the same ones for the options and keys that stand for those fields.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from harness.config.base import check


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
