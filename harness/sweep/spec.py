"""`harness sweep FILE.yaml`: expand a grid of runs, launch them, resume, report.

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
      algorithm: [grpo, ppo, rft] #   the runs are the cartesian product of the lists
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
                                  #   fractions share a GPU); ray: num_gpus
      procs: 1                    #   per run: processes (torchrun) for multi-GPU learners
      zero_stage: null            #   2 | 3: DeepSpeed ZeRO for the run's learner
                                  #   (configs/deepspeed/zero{2,3}.json); needs procs > 1
                                  #   or gpus > 1 to matter
      deepspeed_config: null      #   a custom DeepSpeed JSON (relative to this file)
      env: {HF_HOME: /data/hf}    #   extra environment variables for every run
    output_dir: results           # optional (CLI --output-dir wins; default: the config's)
    report:                       # optional: columns of the final table, as dotted paths
      columns: [final_eval.eval/arith/acc, peak.rss_mb, wall_seconds]   # into summary.json

Layering, per run (later wins): ``base`` < ``config`` < ``algorithms[<its algorithm>]`` <
the run's ``grid`` cell < ``budget`` < ``--set`` from the command line; then ``name`` is
set to the sweep name and ``output_dir`` to the sweep's output directory. A key may not be
both in ``grid`` and in an ``algorithms`` override (it would be ambiguous which wins), and
``budget.*`` may not vary inside a sweep (neither in ``grid`` nor in ``algorithms``): a sweep
compares algorithms at a matched budget, so every run stops at the same amount of the same
unit and evaluates at the same budget checkpoints, whatever its batch shape (the trainer
counts consumption in every unit and cuts at the budget).

Every expanded run is validated through :func:`harness.config.schema.config_from_dict` (and the
algorithm preset resolver when available) before anything starts, so a typo in a dotted key
fails with the key, the closest valid names and the run it came from.

Runs, resume and failures
=========================

Run ids are :func:`harness.config.schema.run_id` (``<algorithm>-s<seed>-<hash8>``; the hash covers
everything that changes what a run computes). Re-launching a sweep skips runs whose
``summary.json`` says ``finished``, and hands interrupted or failed ones to the trainer,
which resumes from their ``checkpoint/``. A failing run is recorded (``summary.json``
status ``failed`` + ``error``, ``error.txt`` with the traceback; written by the launcher
when the worker died without writing them, e.g. killed or segfault) and the sweep goes on;
the command then exits 1 and lists the failures. Ctrl-C (or SIGTERM) stops the workers,
marks in-flight runs ``interrupted`` (they resume next time) and keeps finished runs; exit
code 130. Each run's stdout/stderr go to ``<run_dir>/worker.log``. The sweep writes
``<output_dir>/<name>/sweep.json`` (the plan and each run's final state) for reports.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import fnmatch
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from harness.config.schema import BUDGET_UNITS, Config, config_from_dict, load_yaml, parse_overrides, run_id
from harness.config.base import ConfigError, flatten, set_dotted, to_dict

__all__ = [
    "SweepError", "Sweep", "PlannedRun", "LauncherSpec", "TOP_LEVEL_KEYS", "LAUNCHER_KEYS",
    "valid_algorithms", "load_sweep", "expand_sweep", "format_plan", "run_sweep", "register", "main",
]

TOP_LEVEL_KEYS = ("name", "description", "base", "config", "grid", "algorithms", "budget", "launcher",
                  "output_dir", "report")
LAUNCHER_KEYS = ("type", "workers", "address", "cpus", "gpus", "procs", "zero_stage", "deepspeed_config", "env")
BUDGET_KEYS = ("unit", "amount", "eval_points")
LAUNCHER_TYPES = ("local", "ray")
FALLBACK_ALGORITHMS = ("grpo", "grpo_ps", "dr_grpo", "rloo", "grpo_token_mean", "ppo", "rft")
DEFAULT_TRAIN = "harness.train.loop:train"
SWEEP_FILE = "sweep.json"
_NOT_HASHED = ("name", "output_dir", "tracking")


class SweepError(ConfigError):
    """A sweep file is invalid; the message names the file, the key and the problem."""


# --------------------------------------------------------------------------- data


@dataclass
class LauncherSpec:
    """Resolved ``launcher:`` section (CLI flags already applied)."""
    type: str = "local"
    workers: Optional[int] = None
    address: Optional[str] = None
    cpus: int = 1
    gpus: Any = "auto"
    procs: int = 1
    zero_stage: Optional[int] = None
    deepspeed_config: Optional[str] = None
    env: dict = field(default_factory=dict)


@dataclass
class PlannedRun:
    run_id: str
    config: Config
    cell: dict
    """The grid values of this run (dotted key -> value)."""
    run_dir: Path
    state: str = "new"
    """On-disk state when planned: new | finished | failed | interrupted | running."""

    @property
    def config_dict(self) -> dict:
        return to_dict(self.config)


@dataclass
class Sweep:
    name: str
    source: str
    description: str
    runs: list[PlannedRun]
    budget: dict
    launcher: LauncherSpec
    output_dir: Path
    varying: list[str]
    report_columns: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def sweep_dir(self) -> Path:
        return self.output_dir / self.name


# --------------------------------------------------------------------------- helpers


def valid_algorithms() -> list[str]:
    """Algorithm names a run may use: ``algorithms.presets.ALGORITHMS`` when importable."""
    try:
        from algorithms.presets import ALGORITHMS  # type: ignore
    except ImportError:
        return list(FALLBACK_ALGORITHMS)
    return list(ALGORITHMS)


def _near(word: str, options, n: int = 3) -> str:
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=n, cutoff=0.5)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def check_key(dotted: str, where: str) -> None:
    """Raise a SweepError unless ``dotted`` names a config field (``algorithm`` and
    sections themselves included)."""
    import typing
    parts = dotted.split(".")
    cls = Config
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            prefix = ".".join(parts[:i])
            valid = ", ".join(names)
            raise SweepError(f"{where}: unknown config key '{dotted}'{_near(part, names)} "
                             f"(valid keys{' in ' + prefix if prefix else ''}: {valid})")
        tp = typing.get_type_hints(cls)[part]
        if dataclasses.is_dataclass(tp):
            cls = tp
        elif i < len(parts) - 1:
            raise SweepError(f"{where}: '{'.'.join(parts[:i + 1])}' is a value, not a section, in key '{dotted}'")


_NAMED_SECTIONS = ("algorithm", "task")  # sections with the `section: name` shorthand


def _merge(a: dict, b: dict, top: bool = True) -> dict:
    out = dict(a)
    for k, v in b.items():
        cur = out.get(k)
        if top and k in _NAMED_SECTIONS:
            if isinstance(cur, str) and isinstance(v, dict):
                cur = {"name": cur}
            elif isinstance(cur, dict) and isinstance(v, str):
                v = {"name": v}
        if isinstance(v, dict) and isinstance(cur, dict):
            out[k] = _merge(cur, v, top=False)
        else:
            out[k] = v
    return out


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
        out = _merge(out, nested)
    return out


def _check_nested(d: dict, prefix: str, where: str) -> None:
    for k, v in d.items():
        full = f"{prefix}.{k}"
        check_key(full, where)
        if isinstance(v, dict):
            _check_nested(v, full, where)


def _algorithm_name(data: dict) -> str:
    a = data.get("algorithm", Config().algorithm.name)
    if isinstance(a, dict):
        return str(a.get("name", Config().algorithm.name))
    return str(a)


def _resolve_algorithm(cfg: Config, where: str) -> None:
    """Check the algorithm's components with the preset resolver when it exists."""
    try:
        from algorithms.presets import resolve  # type: ignore
    except ImportError:
        return
    try:
        resolve(cfg.algorithm)
    except Exception as e:  # UnknownComponentError and friends
        raise SweepError(f"{where}: {e}") from None


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) >= 1 and abs(v) < 1e15 else f"{v:g}"
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return str(v)


# --------------------------------------------------------------------------- loading


def load_sweep(path: str | os.PathLike, *, output_dir: str | None = None, overrides: list[str] | None = None,
               check_algorithms: bool = True) -> Sweep:
    """Read, validate and expand a sweep file (nothing runs)."""
    p = Path(path)
    if not p.exists():
        raise SweepError(f"sweep file not found: {p}")
    try:
        spec = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise SweepError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(spec, dict):
        raise SweepError(f"{p}: a sweep file must be a mapping with keys {', '.join(TOP_LEVEL_KEYS)}; "
                         f"got {type(spec).__name__}")
    return expand_sweep(spec, base_dir=p.parent, source=str(p), output_dir=output_dir, overrides=overrides,
                        check_algorithms=check_algorithms)


def _launcher_spec(raw: Any, src: str, base_dir: Path) -> LauncherSpec:
    if raw is None:
        return LauncherSpec()
    if not isinstance(raw, dict):
        raise SweepError(f"{src}: launcher must be a mapping ({', '.join(LAUNCHER_KEYS)}), got {raw!r}")
    for k in raw:
        if k not in LAUNCHER_KEYS:
            raise SweepError(f"{src}: unknown key 'launcher.{k}'{_near(k, LAUNCHER_KEYS)} "
                             f"(valid: {', '.join(LAUNCHER_KEYS)})")
    ls = LauncherSpec()
    t = raw.get("type", "local")
    if t not in LAUNCHER_TYPES:
        raise SweepError(f"{src}: launcher.type={t!r} is invalid{_near(t, LAUNCHER_TYPES)} "
                         f"(valid: {', '.join(LAUNCHER_TYPES)})")
    ls.type = t

    def _int(key, lo, allow_none=True):
        v = raw.get(key)
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise SweepError(f"{src}: launcher.{key}={v!r} is invalid: expected an integer >= {lo}")
        return v

    ls.workers = _int("workers", 1)
    if "cpus" in raw:
        ls.cpus = _int("cpus", 1, allow_none=False)
    if "procs" in raw:
        ls.procs = _int("procs", 1, allow_none=False)
    g = raw.get("gpus", "auto")
    if g != "auto" and (isinstance(g, bool) or not isinstance(g, (int, float)) or g < 0
                        or (g > 1 and float(g) != int(g))):
        raise SweepError(f"{src}: launcher.gpus={g!r} is invalid: expected 'auto', 0, a fraction of one GPU, "
                         f"or a whole number of GPUs")
    ls.gpus = g
    z = raw.get("zero_stage")
    if z not in (None, 2, 3):
        raise SweepError(f"{src}: launcher.zero_stage={z!r} is invalid: expected 2, 3 or null")
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
    ls.env = {k: str(v) for k, v in env.items()}
    return ls


def _budget(raw: Any, src: str) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SweepError(f"{src}: budget must be a mapping with unit, amount, eval_points; got {raw!r}")
    for k in raw:
        if k not in BUDGET_KEYS:
            raise SweepError(f"{src}: unknown key 'budget.{k}'{_near(k, BUDGET_KEYS)} "
                             f"(valid: {', '.join(BUDGET_KEYS)})")
    unit = raw.get("unit")
    if unit is None:
        raise SweepError(f"{src}: budget.unit is missing (one of {', '.join(BUDGET_UNITS)})")
    if unit not in BUDGET_UNITS:
        raise SweepError(f"{src}: budget.unit={unit!r} is not a budget unit{_near(unit, BUDGET_UNITS)} "
                         f"(valid: {', '.join(BUDGET_UNITS)})")
    if "amount" not in raw:
        raise SweepError(f"{src}: budget.amount is missing (how much {unit} every run gets)")
    amt = raw["amount"]
    if isinstance(amt, str):
        try:
            amt = float(amt)
        except ValueError:
            pass
    if isinstance(amt, bool) or not isinstance(amt, (int, float)) or amt <= 0:
        raise SweepError(f"{src}: budget.amount={raw['amount']!r} is invalid: expected a number > 0")
    out = {"unit": unit, "amount": amt}
    if "eval_points" in raw:
        ep = raw["eval_points"]
        if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
            raise SweepError(f"{src}: budget.eval_points={ep!r} is invalid: expected an integer >= 1")
        out["eval_points"] = ep
    return out


def expand_sweep(spec: dict, *, base_dir: str | os.PathLike = ".", source: str = "<sweep>",
                 output_dir: str | None = None, overrides: list[str] | None = None,
                 check_algorithms: bool = True) -> Sweep:
    """Validate a parsed sweep mapping and expand it into validated runs."""
    src = source
    base_dir = Path(base_dir)
    for k in spec:
        if k not in TOP_LEVEL_KEYS:
            raise SweepError(f"{src}: unknown top-level key '{k}'{_near(k, TOP_LEVEL_KEYS)} "
                             f"(valid: {', '.join(TOP_LEVEL_KEYS)})")
    name = spec.get("name")
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise SweepError(f"{src}: name={name!r} is invalid: a sweep needs a non-empty name without '/' "
                         f"(its runs go to <output_dir>/<name>/)")
    warnings: list[str] = []
    algos = valid_algorithms() if check_algorithms else None

    def check_algo(a: Any, where: str) -> None:
        if algos is None:
            return
        if isinstance(a, dict) and "name" not in a:
            return  # components only; the name comes from elsewhere (grid, default)
        nm = a.get("name") if isinstance(a, dict) else a
        if nm not in algos:
            raise SweepError(f"{src}: {where}: unknown algorithm {nm!r}{_near(str(nm), algos)} "
                             f"(valid: {', '.join(algos)})")

    # base + config
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
    data = apply_overrides(data, inline, f"{src}: config")
    if "algorithm" in data:
        check_algo(data["algorithm"], "config.algorithm")

    # grid
    grid = spec.get("grid")
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
                             f"(write [{_fmt(values)}] for a single value)")
        if not values:
            raise SweepError(f"{src}: grid.{key} is an empty list: give at least one value")
        if key in ("algorithm", "algorithm.name"):
            for v in values:
                check_algo(v, f"grid.{key}")

    # per-algorithm overrides
    per_algo = spec.get("algorithms") or {}
    if not isinstance(per_algo, dict):
        raise SweepError(f"{src}: algorithms must be a mapping of algorithm name -> overrides, got {per_algo!r}")
    for a, ov in per_algo.items():
        check_algo(a, f"algorithms.{a}")
        if not isinstance(ov, dict):
            raise SweepError(f"{src}: algorithms.{a} must be a mapping of config overrides, got {ov!r}")
        flat = flatten(apply_overrides({}, ov, f"{src}: algorithms.{a}"))
        for k in flat:
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

    budget = _budget(spec.get("budget"), src)
    launcher = _launcher_spec(spec.get("launcher"), src, base_dir)

    rep = spec.get("report") or {}
    if not isinstance(rep, dict) or any(k != "columns" for k in rep):
        raise SweepError(f"{src}: report must be a mapping with 'columns' (dotted paths into summary.json), "
                         f"got {rep!r}")
    columns = rep.get("columns") or []
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise SweepError(f"{src}: report.columns must be a list of strings, got {columns!r}")

    # output directory: CLI > sweep file > config > default
    od = output_dir or spec.get("output_dir") or data.get("output_dir") or Config().output_dir
    out_root = Path(od).expanduser().resolve()

    cli_over = parse_overrides(overrides)
    for k, _ in cli_over:
        check_key(k, "--set")

    keys = [str(k) for k in grid]
    runs: list[PlannedRun] = []
    seen: dict[str, dict] = {}
    used_algos = set()
    for combo in itertools.product(*(grid[k] for k in grid)):
        cell = dict(zip(keys, combo))
        cell_desc = ", ".join(f"{k}={_fmt(v)}" for k, v in cell.items())
        where = f"{src}: run [{cell_desc}]"
        trial = apply_overrides(data, cell, where)
        algo = _algorithm_name(trial)
        if "algorithm" not in data and not any(k.startswith("algorithm") for k in cell):
            check_algo(algo, "default algorithm")
        used_algos.add(algo)
        d = apply_overrides(data, per_algo.get(algo) or {}, where)
        d = apply_overrides(d, cell, where)
        if budget:
            d = _merge(d, {"budget": budget})
        for k, v in cli_over:
            set_dotted(d, k, v)
        d["name"] = name
        d["output_dir"] = str(out_root)
        try:
            cfg = config_from_dict(d)
        except ConfigError as e:
            raise SweepError(f"{where}: {e}") from None
        _resolve_algorithm(cfg, where)
        rid = run_id(cfg)
        if rid in seen:
            raise SweepError(f"{src}: runs [{_cell(seen[rid])}] and [{cell_desc}] expand to the same config "
                             f"(run id {rid}); remove the duplicate grid values")
        seen[rid] = cell
        rdir = out_root / name / rid
        runs.append(PlannedRun(rid, cfg, cell, rdir, _disk_state(rdir)))
    for a in per_algo:
        if a not in used_algos:
            warnings.append(f"algorithms.{a} is given but no run uses algorithm {a!r}")

    # fields that differ between runs
    flats = []
    for r in runs:
        f = flatten({k: v for k, v in r.config_dict.items() if k not in _NOT_HASHED})
        flats.append(f)
    varying = []
    if flats:
        for k in flats[0]:
            if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1:
                varying.append(k)
    # grid keys first, in grid order, then the rest
    order = [k for g in keys for k in varying
             if (k == "algorithm.name" if g == "algorithm" else (k == g or k.startswith(g + ".")))]
    order = list(dict.fromkeys(order))
    order += [k for k in varying if k not in order]
    eff_budget = dict(to_dict(runs[0].config.budget)) if runs else budget
    return Sweep(name=name, source=src, description=str(spec.get("description") or ""), runs=runs,
                 budget=eff_budget, launcher=launcher, output_dir=out_root, varying=order,
                 report_columns=columns, warnings=warnings)


def _cell(cell: dict) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in cell.items())


def _disk_state(run_dir: Path) -> str:
    from harness.rundir.layout import SUMMARY, read_json
    s = read_json(run_dir / SUMMARY)
    if not isinstance(s, dict):
        return "new"
    st = s.get("status")
    return st if st in ("finished", "failed", "interrupted", "running") else "new"


# --------------------------------------------------------------------------- plan output


def per_step(cfg: Config) -> str:
    """Budget consumed by one training step, where it is known up front."""
    unit = cfg.budget.unit
    n = cfg.train.prompts_per_step * cfg.sampling.samples_per_prompt
    if unit == "samples":
        return f"{n}"
    if unit == "tokens":
        return f"<={n * cfg.sampling.max_new_tokens}"
    if unit == "steps":
        return "1"
    return "-"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


_STATE_NOTE = {"new": "new", "finished": "finished (skip)", "failed": "failed (re-run)",
               "interrupted": "interrupted (resume)", "running": "unfinished (resume)"}


def format_plan(sw: Sweep, *, workers: Optional[int] = None) -> str:
    b = sw.budget
    out = [f"sweep {sw.name}: {len(sw.runs)} run(s) from {sw.source} -> {sw.sweep_dir}/"]
    if sw.description:
        out.append(f"  {sw.description.strip()}")
    ep = b.get("eval_points")
    every = b["amount"] / ep if ep else None
    out.append(f"budget: {_fmt(b['amount'])} {b['unit']} per run; evaluated before training and at {ep} "
               f"point(s) (every {_fmt(every)} {b['unit']})")
    ls = sw.launcher
    where = f" at {ls.address}" if ls.type == "ray" and ls.address else ""
    w = workers if workers is not None else (ls.workers or "auto")
    extra = f", {ls.procs} procs/run" if ls.procs > 1 else ""
    extra += f", ZeRO-{ls.zero_stage}" if ls.zero_stage else ""
    out.append(f"launcher: {ls.type}{where}, workers {w}, {ls.cpus} cpu/run, gpus/run {ls.gpus}{extra}")
    cols = [k for k in sw.varying if k != "seed" and k != "algorithm.name"]
    headers = ["run id", "algorithm", "seed"] + cols + [f"{b['unit']}/step", "status"]
    rows = []
    for r in sw.runs:
        flat = flatten(r.config_dict)
        rows.append([r.run_id, r.config.algorithm.name, str(r.config.seed)] + [_fmt(flat.get(c)) for c in cols]
                    + [per_step(r.config), _STATE_NOTE.get(r.state, r.state)])
    out.append(_table(headers, rows))
    todo = sum(r.state != "finished" for r in sw.runs)
    out.append(f"{todo} to run, {len(sw.runs) - todo} already finished")
    for wmsg in sw.warnings:
        out.append(f"warning: {wmsg}")
    return "\n".join(out)


def summary_value(summary: dict, path: str) -> Any:
    """Look up a dotted path in a summary, where keys may themselves contain '/' or '.'."""
    cur: Any = summary
    rest = path
    while rest:
        if not isinstance(cur, dict):
            return None
        if rest in cur:
            return cur[rest]
        parts = rest.split(".")
        for i in range(len(parts) - 1, 0, -1):
            k = ".".join(parts[:i])
            if k in cur:
                cur, rest = cur[k], ".".join(parts[i:])
                break
        else:
            return None
    return cur


def _default_columns(summaries: list[dict]) -> list[str]:
    cols: list[str] = []
    for s in summaries:
        for k in (s.get("final_eval") or {}):
            if (k.endswith("/acc") or k.endswith("/pass@1")) and f"final_eval.{k}" not in cols:
                cols.append(f"final_eval.{k}")
    return cols[:3] + ["peak.rss_mb", "wall_seconds"]


def format_results(sw: Sweep, results: dict) -> str:
    from harness.rundir.layout import SUMMARY, read_json
    summaries = {r.run_id: (read_json(r.run_dir / SUMMARY) or {}) for r in sw.runs}
    cols = sw.report_columns or _default_columns(list(summaries.values()))
    headers = ["run id", "status", "consumed"] + [c.split(".", 1)[-1] if c.startswith("final_eval.") else c
                                                  for c in cols]
    rows = []
    unit = sw.budget["unit"]
    for r in sw.runs:
        s = summaries[r.run_id]
        res = results.get(r.run_id)
        status = res.status if res else s.get("status", r.state)
        status = "finished" if status == "skipped" else status
        cons = summary_value(s, f"budget.consumed.{unit}")
        if cons is None:
            from harness.sweep.launchers import _consumed
            cons = _consumed(r.run_dir).get(unit) if (r.run_dir / "metrics.jsonl").exists() else None
        cons_s = f"{_fmt(cons)}/{_fmt(sw.budget['amount'])}" if cons is not None else "-"
        vals = []
        for c in cols:
            v = summary_value(s, c)
            vals.append("-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)))
        rows.append([r.run_id, status, cons_s] + vals)
    return _table(headers, rows)


# --------------------------------------------------------------------------- running


def _lock(sweep_dir: Path):
    """Exclusive lock on the sweep directory: two launchers on one sweep would run runs twice."""
    import fcntl
    sweep_dir.mkdir(parents=True, exist_ok=True)
    f = open(sweep_dir / ".sweep.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        raise SweepError(f"another sweep launcher is running on {sweep_dir} ({holder or 'pid unknown'}); "
                         f"wait for it or stop it first")
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
    f.flush()
    return f


def _write_sweep_json(sw: Sweep, results: dict, status: str) -> None:
    from harness.rundir.layout import write_json_atomic
    doc = {
        "name": sw.name, "source": sw.source, "description": sw.description, "status": status,
        "budget": sw.budget, "varying": sw.varying, "launcher": dataclasses.asdict(sw.launcher),
        "updated": time.time(),
        "runs": [{"run_id": r.run_id, "algorithm": r.config.algorithm.name, "seed": r.config.seed,
                  "cell": r.cell, "dir": str(r.run_dir),
                  "state": (results[r.run_id].status if r.run_id in results else r.state)} for r in sw.runs],
    }
    write_json_atomic(sw.sweep_dir / SWEEP_FILE, doc)


def run_sweep(sw: Sweep, *, train: str | Callable = DEFAULT_TRAIN, launcher: Optional[str] = None,
              workers: Optional[int] = None, address: Optional[str] = None, only: Optional[list[str]] = None,
              skip_failed: bool = False, progress: bool | str = True, refresh: Optional[float] = None,
              stream=None) -> int:
    """Launch the runs of ``sw`` that are not finished; returns an exit code (0 all
    finished, 1 some failed, 130 interrupted)."""
    from harness.sweep import launchers as L
    from harness.sweep.progress import Progress

    stream = stream or sys.stdout
    ls = dataclasses.replace(sw.launcher)
    if launcher:
        ls.type = launcher
    if address:
        ls.address = address
    if workers is not None:
        ls.workers = workers
    todo = [r for r in sw.runs if r.state != "finished"]
    if only:
        todo = [r for r in todo if any(fnmatch.fnmatch(r.run_id, pat) or pat in r.run_id for pat in only)]
    if skip_failed:
        todo = [r for r in todo if r.state != "failed"]
    lock = _lock(sw.sweep_dir)
    results: dict = {}
    try:
        for r in sw.runs:
            if r.state == "finished":
                results[r.run_id] = L.RunResult(r.run_id, "skipped")
        _write_sweep_json(sw, results, "running")
        if not todo:
            left = [r for r in sw.runs if r.state != "finished"]
            print("nothing to run: every selected run is finished" if not left else
                  f"nothing to run: {len(left)} run(s) not finished but not selected", file=stream)
            _write_sweep_json(sw, results, "finished" if not left else "incomplete")
            print(format_results(sw, results), file=stream)
            return 0 if not left else 1
        specs = [L.RunSpec(run_id=r.run_id, run_dir=str(r.run_dir), config=r.config_dict, label=_cell(r.cell))
                 for r in todo]
        opts = L.LaunchOptions(train=L.callable_path(train), cpus=ls.cpus, gpus=ls.gpus, procs=ls.procs,
                               zero_stage=ls.zero_stage, deepspeed_config=ls.deepspeed_config, env=dict(ls.env))
        mon = Progress([(r.run_id, r.run_dir) for r in sw.runs], unit=sw.budget["unit"],
                       amount=sw.budget["amount"], initial={r.run_id: ("finished" if r.state == "finished"
                                                                       else "pending") for r in sw.runs},
                       mode=progress, stream=stream, interval=refresh)
        if ls.type == "ray":
            runner = L.RayLauncher(address=ls.address, workers=ls.workers, options=opts)
        else:
            runner = L.LocalLauncher(workers=ls.workers, options=opts)
        interrupted = False
        try:
            with mon:
                results.update(runner.run(specs, mon))
        except KeyboardInterrupt:
            interrupted = True
            results.update(getattr(runner, "results", {}) or {})
        failed = [rid for rid, res in results.items() if res.status == "failed"]
        state = "interrupted" if interrupted else ("failed" if failed else "finished")
        _write_sweep_json(sw, results, state)
        print("", file=stream)
        print(format_results(sw, results), file=stream)
        if failed:
            print(f"\n{len(failed)} run(s) failed:", file=stream)
            for rid in failed:
                res = results[rid]
                first = (res.error or "").strip().splitlines()
                print(f"  {rid}: {first[-1] if first else 'unknown error'}", file=stream)
                print(f"      see {Path(next(r.run_dir for r in sw.runs if r.run_id == rid)) / 'error.txt'}",
                      file=stream)
        if interrupted:
            n = sum(1 for r in results.values() if r.status == "interrupted")
            print(f"\ninterrupted: {n} in-flight run(s) marked interrupted; re-launch the same command to "
                  f"resume (finished runs are kept)", file=stream)
            return 130
        return 1 if failed else 0
    finally:
        lock.close()


# --------------------------------------------------------------------------- CLI


def _cmd(args) -> int:
    sw = load_sweep(args.file, output_dir=args.output_dir, overrides=args.set)
    if args.launcher:
        sw.launcher.type = args.launcher
    if args.address:
        sw.launcher.address = args.address
    if args.workers is not None:
        if args.workers < 1:
            raise SweepError(f"--workers {args.workers}: must be >= 1")
        sw.launcher.workers = args.workers
    print(format_plan(sw))
    if args.dry_run:
        return 0
    print("", flush=True)
    progress: bool | str = False if args.no_progress else True
    return run_sweep(sw, train=args.train_fn, only=args.only, skip_failed=args.skip_failed, progress=progress,
                     refresh=args.refresh)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="sweep YAML (see `harness sweep --help` or harness/sweep.py for the schema)")
    p.add_argument("--dry-run", action="store_true", help="print the expanded plan and run nothing")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="runs in parallel (default: launcher.workers, else fit the CPUs/GPUs)")
    p.add_argument("--launcher", choices=LAUNCHER_TYPES, default=None,
                   help="local worker processes or an existing Ray cluster (default: launcher.type)")
    p.add_argument("--address", default=None, metavar="ADDR", help="Ray cluster address host:port")
    p.add_argument("--output-dir", default=None, metavar="DIR",
                   help="root of run outputs (default: the sweep's output_dir, else the config's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every run (changes run ids), e.g. --set budget.amount=64")
    p.add_argument("--only", action="append", default=None, metavar="PATTERN",
                   help="launch only runs whose id matches (glob or substring); repeatable")
    p.add_argument("--skip-failed", action="store_true", help="do not re-run runs recorded as failed")
    p.add_argument("--no-progress", action="store_true", help="no live progress table")
    p.add_argument("--refresh", type=float, default=None, metavar="SECONDS",
                   help="progress refresh period (default 1 s on a terminal, 30 s otherwise)")
    p.add_argument("--train-fn", default=DEFAULT_TRAIN, metavar="MODULE:FUNC",
                   help="train entry point each worker calls (tests inject a fake one)")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="run a grid of training runs (algorithms x seeds x ...) at a matched budget",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=_cmd)


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.sweep.spec FILE ...`` (same as ``harness sweep``)."""
    p = argparse.ArgumentParser(prog="harness sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return _cmd(args)
    except ConfigError as e:
        print(f"harness sweep: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("harness sweep: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
