"""The sweep file: its keys, and the validation of each section (grid, algorithm overrides, launcher, budget, report).

This module checks the sections; :mod:`harness.sweep.plan` layers them into runs and
:mod:`harness.sweep.run` launches them.

Sweep file
==========

A sweep file is YAML with these top-level keys (anything else is an error that names the
closest valid key)::

    name: quickstart              # required; runs land in <output_dir>/<name>/<run_id>/
    description: free text        # optional, shown in the plan
    base: ../configs/tiny.yaml    # optional: a run config YAML, relative to THIS file
    config:                       # optional: overrides on top of `base`, nested or dotted
      task: {name: arith}
      train.lr: 1e-4
    grid:                         # required, non-empty: dotted config key -> list of values;
      algorithm: [grpo, ppo, rft] #   the runs are the cartesian product of the lists (a list
                                  #   of such mappings joins the runs of several grids)
      seed: [0, 1, 2]
    algorithms:                   # optional: overrides applied only to runs of one algorithm
      ppo: {train.lr: 5e-5, algorithm.critic_lr: 1e-4}
    budget:                       # optional: the budget EVERY run gets (see below)
      unit: samples               #   samples | tokens | steps | seconds
      amount: 4096
      eval_points: 4
    launcher:                     # optional: how runs are executed (CLI flags override)
      type: local                 #   local (worker processes on this machine) | ray
      workers: 2                  #   runs in parallel (default: fit cpus/gpus, see below)
      address: null               #   ray: address of an existing cluster (host:port)
      cpus: 1                     #   per run: CPU cores = torch threads (ray: num_cpus)
      gpus: auto                  #   per run: GPUs (auto = 1 when GPUs exist, else 0;
                                  #   fractions share a GPU); ray: num_gpus. More than this machine
                                  #   shows (local) is refused before anything runs (--dry-run warns)
      procs: 1                    #   per run: processes (torchrun) for multi-GPU learners
      zero_stage: null            #   2 | 3: DeepSpeed ZeRO for the run's learner
                                  #   (harness/configs/deepspeed/zero{2,3}.json); needs procs > 1
                                  #   or gpus > 1 to matter
      deepspeed_config: null      #   a custom DeepSpeed JSON (relative to this file)
      env: {NCCL_DEBUG: WARN}     #   extra environment variables for every run: only the
                                  #   known-safe ones of ENV_ALLOWED (thread, CUDA, NCCL knobs)
    output_dir: results           # optional (CLI --output-dir wins; default: the config's)
    report:                       # optional: columns of the final table, as dotted paths
      columns: [final_eval.eval/arith/acc, peak.rss_mb, wall_seconds]   # into summary.json
      baseline: null              #   the algorithm every row's paired difference is taken from
                                  #   (default: the report's first row)
      study: false                #   true: when every run finished, also write the study report
                                  #   (harness.report.study) to <output_dir>/<name>/study/
      selection: null             #   with study: a folder of learning-rate-selection run folders
                                  #   (relative to THIS file, or absolute) the study report reads
      prm_selection: null         #   with study: the learned-PRM arm's selection folder; its winner's gain
                                  #   over its start decides whether claims 4 and 8 are tested or retired
      retired: {}                 #   with study: {claim id: why}: claims the report lists as retired
      sequential: false           #   with study: run seed by seed and, from the design's first look,
                                  #   only the arms whose claims are still open (harness.sweep.sequential)

The numbers of ``launcher`` are whole (``workers``, ``cpus``, ``procs``: 1 to 65536, at most 1024
threads per process; ``zero_stage`` 2 or 3) and finite; ``.inf`` or ``.nan`` is refused naming the key.

Layering, per run (later wins): ``base`` < ``config`` < ``algorithms[<its algorithm>]`` <
the run's ``grid`` cell < ``budget`` < ``--set`` from the command line; then ``name`` is
set to the sweep name and ``output_dir`` to the sweep's output directory. A key may not be
both in ``grid`` and in an ``algorithms`` override (it would be ambiguous which wins), and
``budget.*`` may not vary inside a sweep (neither in ``grid`` nor in ``algorithms``): a sweep
compares algorithms at a matched budget, so every run stops at the same amount of the same
unit and evaluates at the same budget checkpoints, whatever its batch shape (the trainer
counts consumption in every unit and cuts at the budget).

Every expanded run is validated through :func:`harness.config.schema.config_from_dict` (which
also resolves the algorithm's components) before anything starts, so a typo in a dotted key
fails with the key, the closest valid names and the run it came from.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from algorithms.presets import ALGORITHMS, algorithm_problem
from harness.config.rules import MAX_THREADS, NAME, THREADS
from harness.config.schema import BudgetConfig, Config, config_from_dict, deep_merge, load_yaml, read_yaml_file
from harness.foundation.base import ConfigError, brief, did_you_mean, flatten, from_dict, invalid
from harness.foundation.budget import BUDGET_UNITS
from harness.report.format import number
from harness.report.limits import DESIGN_FIRST_LOOK, MAX_CAP, is_cap

__all__ = [
    "SweepError", "LaunchOptions", "TOP_LEVEL_KEYS", "LAUNCHER_KEYS", "BUDGET_KEYS", "LAUNCHER_TYPES",
    "valid_algorithms", "check_algorithm", "check_key", "apply_overrides", "fmt_value", "read_sweep_file", "check_top_level",
    "base_config", "grid_section", "algorithms_section", "budget_section", "launcher_section", "report_section",
    "ReportOptions", "REPORT_KEYS", "report_options", "refresh_problem", "MAX_COUNT", "count_problem",
]

TOP_LEVEL_KEYS = ("name", "description", "base", "config", "grid", "algorithms", "budget", "launcher",
                  "output_dir", "report")
LAUNCHER_KEYS = ("type", "workers", "address", "cpus", "gpus", "procs", "zero_stage", "deepspeed_config", "env")
BUDGET_KEYS = ("unit", "amount", "eval_points")
LAUNCHER_TYPES = ("local", "ray")
REPORT_KEYS = ("columns", "baseline", "study", "selection", "prm_selection", "retired", "sequential", "amendments",
               "cap")


class SweepError(ConfigError):
    """A sweep file is invalid; the message names the file, the key and the problem."""


@dataclass
class LaunchOptions:
    """How runs are executed (:mod:`harness.sweep.launchers`): the sweep file's ``launcher:`` section
    (validated by :func:`launcher_section`, CLI flags applied) plus the train entry point."""
    type: str = "local"
    """local (worker processes on this machine) | ray."""
    workers: Optional[int] = None
    """Runs in parallel (None: fit the CPUs/GPUs)."""
    address: Optional[str] = None
    """Ray: address of an existing cluster (host:port)."""
    train: str = "harness.train.loop:train"
    """``module:function`` each worker calls as ``fn(cfg, resume=True, progress=False)``."""
    cpus: int = 1
    """CPU cores per run (torch threads = cpus // procs per process)."""
    gpus: Any = "auto"
    """GPUs per run: 'auto' (1 if any GPU is visible, else 0), 0, a fraction, or a whole number."""
    procs: int = 1
    """Processes per run; > 1 starts the run under torchrun."""
    zero_stage: Optional[int] = None
    deepspeed_config: Optional[str] = None
    env: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- keys and values


def valid_algorithms() -> list[str]:
    """Algorithm names a run may use (``algorithms.presets.ALGORITHMS``)."""
    return list(ALGORITHMS)


def check_algorithm(a: Any, where: str, algos: Optional[list[str]]) -> None:
    """Raise a SweepError unless ``a`` (a name, or an algorithm mapping with a ``name``) names an
    algorithm (the config's rule, :func:`algorithms.presets.algorithm_problem`); ``algos`` None
    (:func:`valid_algorithms` not asked for) checks nothing."""
    if algos is None:
        return
    if isinstance(a, dict) and "name" not in a:
        return  # components only; the name comes from elsewhere (grid, default)
    why = algorithm_problem(a.get("name") if isinstance(a, dict) else a)
    if why:
        raise SweepError(f"{where}: {why}")


def check_key(dotted: str, where: str) -> None:
    """Raise a SweepError unless ``dotted`` names a config field (``algorithm`` and
    sections themselves included)."""
    parts = dotted.split(".")
    cls = Config
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            prefix = ".".join(parts[:i])
            valid = ", ".join(names)
            raise SweepError(f"{where}: unknown config key '{dotted}'{did_you_mean(part, names)} "
                             f"(valid keys{' in ' + prefix if prefix else ''}: {valid})")
        tp = typing.get_type_hints(cls)[part]
        if dataclasses.is_dataclass(tp):
            cls = tp
        elif i < len(parts) - 1:
            raise SweepError(f"{where}: '{'.'.join(parts[:i + 1])}' is a value, not a section, in key '{dotted}'")


def apply_overrides(data: dict, overrides: dict, where: str) -> dict:
    """Layer ``overrides`` (nested and/or dotted keys) onto ``data``; returns a new dict.
    Every key is checked against the config schema first."""
    out = json.loads(json.dumps(data, default=str)) if data else {}
    for key, value in (overrides or {}).items():
        key = str(key)
        check_key(key, where)
        parts = key.split(".")
        # expand to a nested dict and merge (so `model: {hidden_size: 64}` keeps other fields)
        nested: Any = value
        if isinstance(value, dict):
            _check_nested(value, key, where)
        for p in reversed(parts):
            nested = {p: nested}
        out = deep_merge(out, nested)
    return out


def _check_nested(d: dict, prefix: str, where: str) -> None:
    for k, v in d.items():
        full = f"{prefix}.{k}"
        check_key(full, where)
        if isinstance(v, dict):
            _check_nested(v, full, where)


def fmt_value(v: Any) -> str:
    """A config value as the plan and the messages show it (``4096``, ``0.0001``, JSON for mappings)."""
    return number(v, "g", whole=True)


# --------------------------------------------------------------------------- sections


# launcher.env: what a sweep file may set in its workers' environment. A sweep file is read
# as trusted input for everything else; this keeps it from making every worker import or load
# code of its choosing. An allow-list of named variables, each a count, a switch or a tuning
# knob that loads nothing: a prefix (CUDA_*, NCCL_*, OMP_*) would let through
# CUDA_INJECTION64_PATH, NCCL_NET_PLUGIN, NCCL_TUNER_PLUGIN or OMP_TOOL_LIBRARIES, each of which
# makes a runtime dlopen a library. Variables that name a file to read or write (NCCL_TOPO_FILE,
# NCCL_DEBUG_FILE, CUDA_CACHE_PATH, HF_HOME, ...) are left out too. Anything else can be
# exported in the shell that starts the sweep, where the user decides.
ENV_ALLOWED = frozenset({
    # CPU threads and the OpenMP / MKL / BLAS runtimes' scheduling
    "OMP_NUM_THREADS", "OMP_DYNAMIC", "OMP_PROC_BIND", "OMP_PLACES", "OMP_WAIT_POLICY", "OMP_SCHEDULE",
    "OMP_STACKSIZE", "OMP_MAX_ACTIVE_LEVELS", "OMP_THREAD_LIMIT", "OMP_DISPLAY_ENV", "OMP_DISPLAY_AFFINITY",
    "MKL_NUM_THREADS", "MKL_DOMAIN_NUM_THREADS", "MKL_DYNAMIC", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS",
    "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "NUMEXPR_MAX_THREADS",
    "RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_HW_SUBSET", "KMP_SETTINGS", "GOMP_SPINCOUNT", "GOMP_CPU_AFFINITY",
    # accelerators: which devices, and CUDA / cuBLAS switches
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING",
    "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_CACHE_DISABLE", "CUDA_CACHE_MAXSIZE", "CUBLAS_WORKSPACE_CONFIG",
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    # PyTorch's allocator and diagnostics
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_NVML_BASED_CUDA_CHECK", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_ENABLE_MONITORING",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_AVOID_RECORD_STREAMS",
    "TORCH_NCCL_HIGH_PRIORITY", "TORCH_NCCL_USE_COMM_NONBLOCKING",
    # NCCL: logging to stderr, interfaces, transports and tuning (no plugin, no file)
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_NTHREADS",
    "NCCL_NSOCKS_PERTHREAD", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT", "NCCL_IB_TC", "NCCL_IB_SL", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ",
    "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_BUFFSIZE", "NCCL_NTHREADS",
    "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_ALGO", "NCCL_PROTO", "NCCL_CROSS_NIC", "NCCL_CUMEM_ENABLE",
    "NCCL_NVLS_ENABLE", "NCCL_LAUNCH_MODE", "NCCL_IGNORE_CPU_AFFINITY", "NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT",
    # Hugging Face: switches that only forbid the network
    "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
    "HF_HUB_DISABLE_PROGRESS_BARS",
})
ENV_LOADS_CODE = frozenset({
    "CUDA_INJECTION64_PATH", "CUDA_INJECTION32_PATH", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN", "NCCL_CONF_FILE", "OMP_TOOL", "OMP_TOOL_LIBRARIES",
    "MKL_THREADING_LAYER", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONPATH", "PYTHONHOME",
    "PYTHONSTARTUP", "PATH", "HF_HOME", "TRANSFORMERS_CACHE", "HF_HUB_CACHE", "TORCH_HOME",
})
"""Refused with the reason spelled out: each makes a runtime, the loader or Python load a library,
module or model files from where the variable points."""
_ENV_VALUE_MAX = 4096


def env_allowed(name: str) -> bool:
    """Whether ``launcher.env`` may set variable ``name`` (:data:`ENV_ALLOWED`)."""
    return name in ENV_ALLOWED


def env_refusal(name: str) -> str:
    """Why ``launcher.env`` may not set ``name`` (for the one-line error)."""
    why = ("makes a runtime, the loader or Python load code or model files from where it points"
           if name in ENV_LOADS_CODE else "is not a known-safe variable")
    return (f"launcher.env.{name} is refused: {name} {why}. launcher.env may set only known-safe thread, "
            f"OpenMP, CUDA, NCCL and allocator settings (ENV_ALLOWED in harness/sweep/spec.py; docs/sweeps.md); "
            f"if you trust it, export {name} in the shell that starts the sweep")


def read_sweep_file(path: str | os.PathLike) -> dict:
    """The parsed mapping of a sweep file (not yet validated)."""
    p = Path(path)
    spec = read_yaml_file(p, "sweep", SweepError)
    if not isinstance(spec, dict):
        raise SweepError(f"{p}: a sweep file must be a mapping with keys {', '.join(TOP_LEVEL_KEYS)}; "
                         f"got {type(spec).__name__}")
    return spec


def check_top_level(spec: dict, src: str) -> str:
    """Check the top-level keys; returns the sweep's name."""
    for k in spec:
        if k not in TOP_LEVEL_KEYS:
            raise SweepError(f"{src}: unknown top-level key '{k}'{did_you_mean(k, TOP_LEVEL_KEYS)} "
                             f"(valid: {', '.join(TOP_LEVEL_KEYS)})")
    name = spec.get("name")
    bad = NAME.problem("name", name)
    if bad:
        raise SweepError(f"{src}: {bad} (its runs go to <output_dir>/<name>/)")
    return name


def base_config(spec: dict, src: str, base_dir: Path) -> dict:
    """``base`` (a config YAML relative to the sweep file) with ``config`` layered on top."""
    data: dict = {}
    base = spec.get("base")
    if base is not None:
        if not isinstance(base, str):
            raise SweepError(f"{src}: base must be a path to a config YAML, got {base!r}")
        bp = Path(base) if os.path.isabs(base) else base_dir / base
        if not bp.exists():
            raise SweepError(f"{src}: base config file not found: {bp} (paths are relative to the sweep file)")
        try:
            data = load_yaml(bp)
        except ConfigError as e:
            raise SweepError(f"{src}: base: {e}") from None
        try:
            config_from_dict(data)
        except ConfigError as e:
            raise SweepError(f"{src}: base {bp}: {e}") from None
    inline = spec.get("config") or {}
    if not isinstance(inline, dict):
        raise SweepError(f"{src}: config must be a mapping of config overrides, got {inline!r}")
    return apply_overrides(data, inline, f"{src}: config")


def grid_section(grid: Any, src: str, algos: Optional[list[str]]) -> list[dict]:
    """Check ``grid``: known dotted keys, each with a non-empty list; no budget, name or
    output_dir. A list of such mappings is several grids whose runs are joined (e.g. five
    seeds for some algorithms, three for others); returns the list of grids."""
    if isinstance(grid, list):
        if not grid:
            raise SweepError(f"{src}: grid is an empty list: give one mapping, or a list of mappings")
        return [grid_section(g, f"{src}: grid[{i}]", algos)[0] for i, g in enumerate(grid)]
    if grid is None:
        raise SweepError(f"{src}: grid is missing: a sweep needs at least one key with a list of values, "
                         f"e.g. grid: {{algorithm: [grpo, ppo], seed: [0, 1]}}")
    if not isinstance(grid, dict):
        raise SweepError(f"{src}: grid must be a mapping of dotted config keys to lists, got {grid!r}")
    if not grid:
        raise SweepError(f"{src}: grid is empty: give at least one key with a list of values, "
                         f"e.g. grid: {{seed: [0]}}")
    for key, values in grid.items():
        key = str(key)
        check_key(key, f"{src}: grid")
        if key == "budget" or key.startswith("budget."):
            raise SweepError(f"{src}: grid.{key}: the budget cannot vary inside a sweep (every run gets the "
                             f"same budget; make one sweep per budget)")
        if key in ("name", "output_dir"):
            raise SweepError(f"{src}: grid.{key}: '{key}' is set by the sweep and cannot vary")
        if not isinstance(values, list):
            raise SweepError(f"{src}: grid.{key} must be a list of values, got {values!r} "
                             f"(write [{fmt_value(values)}] for a single value)")
        if not values:
            raise SweepError(f"{src}: grid.{key} is an empty list: give at least one value")
        if key in ("algorithm", "algorithm.name"):
            for v in values:
                check_algorithm(v, f"{src}: grid.{key}", algos)
    return [grid]


def algorithms_section(per_algo: Any, src: str, grid: dict, algos: Optional[list[str]]) -> dict:
    """Check ``algorithms``: per-algorithm overrides that neither touch the budget, the name
    or the output directory, nor a key the grid varies."""
    per_algo = per_algo or {}
    if not isinstance(per_algo, dict):
        raise SweepError(f"{src}: algorithms must be a mapping of algorithm name -> overrides, got {per_algo!r}")
    for a, ov in per_algo.items():
        check_algorithm(a, f"{src}: algorithms.{a}", algos)
        if not isinstance(ov, dict):
            raise SweepError(f"{src}: algorithms.{a} must be a mapping of config overrides, got {ov!r}")
        for k in flatten(apply_overrides({}, ov, f"{src}: algorithms.{a}")):
            _check_algorithm_override(k, a, src, grid)
    return per_algo


def _check_algorithm_override(k: str, a: str, src: str, grid: dict) -> None:
    if k.startswith("budget."):
        raise SweepError(f"{src}: algorithms.{a}.{k}: the budget cannot differ between algorithms "
                         f"(the point of a sweep is a matched budget)")
    if k in ("name", "output_dir"):
        raise SweepError(f"{src}: algorithms.{a}.{k}: '{k}' is set by the sweep")
    if k in ("algorithm.name",):
        raise SweepError(f"{src}: algorithms.{a}: cannot change the algorithm name")
    for gk in grid:
        gk = "algorithm.name" if gk == "algorithm" else str(gk)
        if k == gk or k.startswith(gk + ".") or gk.startswith(k + "."):
            raise SweepError(f"{src}: '{k}' is both in grid ({gk}) and in algorithms.{a}; "
                             f"it is ambiguous which wins — keep it in one place")


def _check_keys(raw: dict, section: str, valid, src: str) -> None:
    """Every key of the ``section`` mapping is one of ``valid``; else an error naming it."""
    for k in raw:
        if k not in valid:
            raise SweepError(f"{src}: unknown key '{section}.{k}'{did_you_mean(k, valid)} "
                             f"(valid: {', '.join(valid)})")


def budget_section(raw: Any, src: str) -> dict:
    """Check ``budget`` (unit and amount given, then the config's budget rules:
    :class:`harness.config.sections.BudgetConfig`); returns ``{unit, amount[, eval_points]}``
    (``{}`` when absent)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SweepError(f"{src}: budget must be a mapping with unit, amount, eval_points; got {raw!r}")
    _check_keys(raw, "budget", BUDGET_KEYS, src)
    if raw.get("unit") is None:
        raise SweepError(f"{src}: budget.unit is missing (one of {', '.join(BUDGET_UNITS)})")
    if "amount" not in raw:
        raise SweepError(f"{src}: budget.amount is missing (how much {raw['unit']} every run gets)")
    try:
        budget = from_dict(BudgetConfig, raw, "budget")
    except ConfigError as e:
        raise SweepError(f"{src}: {e}") from None
    return {k: getattr(budget, k) for k in BUDGET_KEYS if k in raw}


def launcher_section(raw: Any, src: str, base_dir: Path) -> LaunchOptions:
    """Check ``launcher``; returns the launch options it sets (defaults for the rest)."""
    if raw is None:
        return LaunchOptions()
    if not isinstance(raw, dict):
        raise SweepError(f"{src}: launcher must be a mapping ({', '.join(LAUNCHER_KEYS)}), got {raw!r}")
    _check_keys(raw, "launcher", LAUNCHER_KEYS, src)
    ls = LaunchOptions()
    t = raw.get("type", "local")
    if t not in LAUNCHER_TYPES:
        raise SweepError(f"{src}: launcher.type={t!r} is invalid{did_you_mean(t, LAUNCHER_TYPES)} "
                         f"(valid: {', '.join(LAUNCHER_TYPES)})")
    ls.type = t

    def _int(key, allow_none=True):
        v = raw.get(key)
        if v is None and allow_none:
            return None
        bad = count_problem(f"launcher.{key}", v)
        if bad:
            raise SweepError(f"{src}: {bad}")
        return v

    ls.workers = _int("workers")
    if "cpus" in raw:
        ls.cpus = _int("cpus", allow_none=False)
    if "procs" in raw:
        ls.procs = _int("procs", allow_none=False)
    threads = max(1, ls.cpus // ls.procs)  # each process's torch threads (harness.sweep.launchers)
    if not THREADS.ok(threads):
        raise SweepError(f"{src}: launcher.cpus={ls.cpus} is invalid: each of a run's {ls.procs} process(es) would "
                         f"run {threads} torch threads, at most {MAX_THREADS} (OpenBLAS and OpenMP fail "
                         f"to start more, after the run began)")
    ls.gpus = _gpus(raw.get("gpus", "auto"), src)
    z = raw.get("zero_stage")
    if z is not None and (isinstance(z, bool) or not isinstance(z, int) or z not in (2, 3)):  # 2.0 is not a stage
        raise SweepError(f"{src}: launcher.zero_stage={brief(z)} is invalid: expected 2, 3 or null{_number_note(z)}")
    ls.zero_stage = z
    dsc = raw.get("deepspeed_config")
    if dsc is not None:
        dp = (base_dir / dsc) if not os.path.isabs(dsc) else Path(dsc)
        if not dp.exists():
            raise SweepError(f"{src}: launcher.deepspeed_config file not found: {dp}")
        ls.deepspeed_config = str(dp.resolve())
    addr = raw.get("address")
    if addr is not None and not isinstance(addr, str):
        raise SweepError(f"{src}: launcher.address={addr!r} is invalid: expected 'host:port' or 'auto'")
    ls.address = addr
    env = raw.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
        raise SweepError(f"{src}: launcher.env must be a mapping of variable names to values, got {env!r}")
    for k, v in env.items():
        if not env_allowed(k):
            raise SweepError(f"{src}: {env_refusal(k)}")
        if isinstance(v, (dict, list)) or v is None or "\0" in str(v) or len(str(v)) > _ENV_VALUE_MAX:
            raise SweepError(f"{src}: launcher.env.{k}={str(v)[:60]!r} is invalid: expected a string or number "
                             f"(no NUL, at most {_ENV_VALUE_MAX} characters)")
    ls.env = {k: str(v) for k, v in env.items()}
    return ls


MAX_COUNT = 1 << 16
"""The largest number of workers, CPU cores, processes or GPUs per run a sweep file may ask for."""


def count_problem(field: str, value: Any) -> Optional[str]:
    """Why ``value`` is not a count of workers, CPU cores or processes (a whole number from 1 to
    :data:`MAX_COUNT`): ``launcher.workers``, ``launcher.cpus``, ``launcher.procs`` and ``harness sweep
    --workers``; None when it is one."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        return invalid(field, value, f"expected a whole number from 1 to {MAX_COUNT}{_number_note(value)}")
    return None


def _number_note(v: Any) -> str:
    """Why a number is refused where a count is expected ('' for anything else)."""
    if isinstance(v, float) and not math.isfinite(v):
        return f" ({v!r} is not a finite number)"
    if isinstance(v, float) and v.is_integer():
        return f" (write {int(v)}, not {v!r})" if abs(v) <= MAX_COUNT else ""
    if isinstance(v, float):
        return " (not a whole number)"
    return ""


def _gpus(g: Any, src: str) -> Any:
    """``launcher.gpus``: 'auto', 0, a fraction of one GPU (runs share it), or a whole number of GPUs
    up to :data:`MAX_COUNT`; a non-finite number (``.inf``, ``.nan``) or a non-whole one above 1 is refused."""
    if g == "auto" and isinstance(g, str):
        return g
    ok = (not isinstance(g, bool) and isinstance(g, (int, float)) and math.isfinite(g) and 0 <= g <= MAX_COUNT
          and (g <= 1 or float(g).is_integer()))
    if not ok:
        note = _number_note(g) if not (isinstance(g, float) and g.is_integer()) else ""
        raise SweepError(f"{src}: launcher.gpus={brief(g)} is invalid: expected 'auto', 0, a fraction of one GPU "
                         f"(0.5: two runs share one), or a whole number of GPUs up to {MAX_COUNT}{note}")
    return g


MAX_REFRESH = 86400.0


def refresh_problem(value: Any, field: str = "--refresh") -> str:
    """Why ``value`` cannot be the live table's refresh period in seconds ('' when it can; None is the
    default): it must be a finite number > 0, at most a day."""
    if value is None:
        return ""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 < value <= MAX_REFRESH):
        shown = f"{value:g}" if isinstance(value, float) else brief(value)
        return (f"{field} {shown} is invalid: expected the seconds between refreshes of the live table, "
                f"a number > 0 and at most {MAX_REFRESH:g}")
    return ""


@dataclass
class ReportOptions:
    """The sweep file's ``report:`` section, validated (:func:`report_options`)."""
    columns: list = field(default_factory=list)
    """Dotted paths into summary.json: the columns of the final table (may be empty)."""
    study: bool = False
    """Write the study report (``<sweep_dir>/study``) when every run finished."""
    selection: Optional[Path] = None
    """The learning-rate-selection folder the study report reads (resolved; None: none)."""
    sequential: bool = False
    """Run the study seed by seed, adding seeds only for the arms of open claims (`harness.sweep.sequential`)."""
    baseline: Optional[str] = None
    """The algorithm the report's paired differences are taken from (None: the first row)."""
    amendments: list = field(default_factory=list)
    """Changes to the study's design made after data came in, each a dated sentence saying what changed
    and why: the study report prints them beside its decision rules."""
    prm_selection: Optional[Path] = None
    """The learned-PRM arm's selection folder (resolved; None: none): the study report tests claims 4 and 8 with
    the PRM arms only when its winner gained enough over its start, else lists them as retired with that figure."""
    retired: dict = field(default_factory=dict)
    """``{claim id (text): why}``: claims the study report lists as retired, with the reason, instead of testing."""
    cap: Optional[int] = None
    """The study design's cap: the most seeds any arm is looked at (None: the design's default, 10); each part's
    own cap is the seeds the grid gives its arms, at most this."""


def report_options(rep: Any, src: str, base_dir: Path) -> ReportOptions:
    """Check ``report``; returns its columns, ``study`` and ``selection`` (resolved against
    ``base_dir``, the sweep file's folder, when relative). The selection folder need not
    exist yet (the plan says so); it is read only when the study report is written."""
    rep = {} if rep is None else rep
    if not isinstance(rep, dict):
        raise SweepError(f"{src}: report must be a mapping with {', '.join(REPORT_KEYS)} "
                         f"(columns: dotted paths into summary.json), got {rep!r}")
    _check_keys(rep, "report", REPORT_KEYS, src)
    columns = rep.get("columns") or []
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise SweepError(f"{src}: report.columns must be a list of strings, got {columns!r}")
    baseline = rep.get("baseline")
    if baseline is not None and (not isinstance(baseline, str) or not baseline.strip() or "\0" in baseline):
        raise SweepError(f"{src}: report.baseline={baseline!r} is invalid: expected the name of an algorithm of "
                         f"the sweep (e.g. grpo), the row every other row's paired difference is taken from")
    study = rep.get("study", False)
    if study is None:
        study = False
    if not isinstance(study, bool):
        raise SweepError(f"{src}: report.study={study!r} is invalid: expected true or false")
    selection = _study_folder(rep, "selection", "learning-rate-selection run folders", "a selection folder",
                              study, src, base_dir)
    prm_selection = _study_folder(rep, "prm_selection", "the learned-PRM arm's selection run folders",
                                  "the learned-PRM gate's folder", study, src, base_dir)
    retired = _retired(rep.get("retired"), src)
    if retired and not study:
        raise SweepError(f"{src}: report.retired is given but report.study is not true (only the study report "
                         f"lists claims): set report.study: true or remove report.retired")
    seq = rep.get("sequential", False)
    seq = False if seq is None else seq
    if not isinstance(seq, bool):
        raise SweepError(f"{src}: report.sequential={seq!r} is invalid: expected true or false")
    if seq and not study:
        raise SweepError(f"{src}: report.sequential is true but report.study is not (the sequential design "
                         f"decides the study report's claims): set report.study: true or remove report.sequential")
    amend = rep.get("amendments") or []
    if not isinstance(amend, list) or not all(isinstance(a, str) and a.strip() and "\0" not in a for a in amend):
        raise SweepError(f"{src}: report.amendments must be a list of sentences (text), each saying when and how "
                         f"the study's design changed after data came in, got {amend!r}")
    if amend and not study:
        raise SweepError(f"{src}: report.amendments is given but report.study is not true (only the study report "
                         f"prints them): set report.study: true or remove report.amendments")
    cap = rep.get("cap")
    if cap is not None:
        if not is_cap(cap):
            raise SweepError(f"{src}: report.cap={cap!r} is invalid: expected a whole number of seeds from "
                             f"{DESIGN_FIRST_LOOK} (the design's first look) to {MAX_CAP}: the most seeds any arm of "
                             f"the study is looked at")
        if not study:
            raise SweepError(f"{src}: report.cap is given but report.study is not true (only the study's design has "
                             f"a cap): set report.study: true or remove report.cap")
    return ReportOptions(columns=list(columns), baseline=baseline, study=study, selection=selection,
                         prm_selection=prm_selection, retired=retired, sequential=seq,
                         amendments=[" ".join(a.split()) for a in amend], cap=cap)


def _study_folder(rep: dict, key: str, what: str, reads: str, study: bool, src: str, base_dir: Path) -> Optional[Path]:
    """``report.<key>``, a folder the study report reads (``what`` it holds), checked and resolved against
    ``base_dir`` (the sweep file's folder) when relative; None when not given. It need not exist yet."""
    value = rep.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SweepError(f"{src}: report.{key}={value!r} is invalid: expected a folder path (text) of {what}")
    if not value.strip() or "\0" in value:
        raise SweepError(f"{src}: report.{key}={value!r} is invalid: expected a non-empty folder path "
                         f"without NUL characters")
    if not study:
        raise SweepError(f"{src}: report.{key} is given but report.study is not true (only the study "
                         f"report reads {reads}): set report.study: true or remove report.{key}")
    p = Path(value).expanduser()
    return (p if p.is_absolute() else Path(base_dir) / p).resolve()


def _retired(got: Any, src: str) -> dict:
    """``report.retired`` checked: a mapping of claim ids (whole numbers >= 1, or their text) to a sentence
    saying why the claim is not tested; returned as ``{"<id>": sentence}`` with whitespace collapsed."""
    if got is None:
        return {}
    if not isinstance(got, dict):
        raise SweepError(f"{src}: report.retired must be a mapping of claim ids to the reason each is retired "
                         f"(e.g. {{7: \"its reward model was never selected\"}}), got {got!r}")
    out = {}
    for key, why in got.items():
        cid = str(key).strip() if isinstance(key, (int, str)) and not isinstance(key, bool) else ""
        if not cid.isdigit() or int(cid) < 1 or cid != str(int(cid)):
            raise SweepError(f"{src}: report.retired has the key {key!r}: expected a claim id, a whole number "
                             f"from 1 (docs/study.md numbers the claims)")
        if not isinstance(why, str) or not why.strip() or "\0" in why:
            raise SweepError(f"{src}: report.retired[{cid}]={why!r} is invalid: expected a sentence saying why "
                             f"claim {cid} is not tested")
        if cid in out:
            raise SweepError(f"{src}: report.retired names claim {cid} twice")
        out[cid] = " ".join(why.split())
    return out


def report_section(rep: Any, src: str) -> list[str]:
    """Check ``report``; returns its columns (dotted paths into summary.json; may be empty).
    :func:`report_options` returns the whole section (columns, study, selection)."""
    return report_options(rep, src, Path(".")).columns
