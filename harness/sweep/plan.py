"""Expanding a sweep file into planned runs (validated configs, run ids, on-disk state), and printing the plan.

:func:`load_sweep` reads a sweep file and :func:`expand_sweep` turns its sections (checked by
:mod:`harness.sweep.spec`) into one :class:`PlannedRun` per grid cell, layered as the sweep
file's documentation says: ``base`` < ``config`` < ``algorithms[<its algorithm>]`` < the grid
cell < ``budget`` < ``--set``, then the sweep's ``name`` and ``output_dir``. Run ids are
:func:`harness.rundir.ids.run_id` (``<algorithm>-s<seed>-<hash8>``); two cells that expand to
the same config are an error. :func:`format_plan` is the table ``harness sweep`` prints before
it launches anything (and all that ``--dry-run`` prints).
"""
from __future__ import annotations

import fnmatch
import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from harness.config.schema import (Config, algorithm_name, config_from_dict, config_warnings, deep_merge,
                                   dir_path_problem, parse_overrides, set_dotted, settings)
from harness.foundation.base import ConfigError, brief, did_you_mean, flatten, to_dict
from harness.foundation.budget import eval_points, stage_samples
from harness.report.format import table
from harness.rundir.ids import NOT_HASHED, run_id
from harness.rundir.layout import SUMMARY, read_json, warn_once
from harness.rundir.read import finished_problem
from harness.sweep.spec import (LaunchOptions, SweepError, algorithms_section, apply_overrides, base_config,
                                budget_section, check_algorithm, check_key, check_top_level, fmt_value, grid_section,
                                launcher_section, read_sweep_file, report_options, valid_algorithms)

__all__ = ["PlannedRun", "Sweep", "load_sweep", "expand_sweep", "format_plan", "study_line", "per_step",
           "cell_label", "matches_only", "only_problem"]


@dataclass
class PlannedRun:
    run_id: str
    config: Config
    cell: dict
    """The grid values of this run (dotted key -> value)."""
    run_dir: Path
    state: str = "new"
    """On-disk state when planned: new | finished | failed | interrupted | running | unverified (says
    finished, but its files do not bear it out: run again)."""

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
    launcher: LaunchOptions
    output_dir: Path
    varying: list[str]
    report_columns: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    report_baseline: Optional[str] = None
    """report.baseline: the algorithm the report's paired differences are taken from (None: the first row)."""
    report_study: bool = False
    """report.study: write the study report (``<sweep_dir>/study``) when every run finished."""
    report_selection: Optional[Path] = None
    """report.selection, resolved: the learning-rate-selection folder the study report reads."""
    report_prm_selection: Optional[Path] = None
    """report.prm_selection, resolved: the learned-PRM arm's selection folder (the gate of claims 4 and 8)."""
    report_retired: dict = field(default_factory=dict)
    """report.retired: ``{claim id: why}``, claims the study report lists as retired (recorded in sweep.json)."""
    report_sequential: bool = False
    """report.sequential: seed by seed, only the arms of open claims (`harness.sweep.sequential`)."""
    report_amendments: list = field(default_factory=list)
    """report.amendments: dated changes to the study's design (recorded in sweep.json for the study report)."""
    report_cap: Optional[int] = None
    """report.cap: the study design's cap, the most seeds any arm is looked at (recorded in sweep.json)."""
    not_needed: dict = field(default_factory=dict)
    """Run id -> why: runs the sequential design left out (filled by `harness.sweep.run.run_sweep`)."""

    @property
    def sweep_dir(self) -> Path:
        return self.output_dir / self.name

    @property
    def study_dir(self) -> Path:
        """Where the study report goes (report.study)."""
        return self.sweep_dir / "study"


@dataclass
class _Layers:
    """Everything a run's config is made of except its grid cell."""
    data: dict
    """``base`` with ``config`` on top."""
    per_algo: dict
    budget: dict
    cli: list
    """Parsed ``--set`` overrides, (dotted key, value) pairs."""
    name: str
    out_root: Path
    src: str
    algos: Optional[list[str]]
    """Valid algorithm names (None: not checked)."""


# --------------------------------------------------------------------------- expanding


def load_sweep(path: str | os.PathLike, *, output_dir: str | None = None, overrides: list[str] | None = None,
               check_algorithms: bool = True) -> Sweep:
    """Read, validate and expand a sweep file (nothing runs)."""
    p = Path(path)
    spec = read_sweep_file(p)
    return expand_sweep(spec, base_dir=p.parent, source=str(p), output_dir=output_dir, overrides=overrides,
                        check_algorithms=check_algorithms)


def expand_sweep(spec: dict, *, base_dir: str | os.PathLike = ".", source: str = "<sweep>",
                 output_dir: str | None = None, overrides: list[str] | None = None,
                 check_algorithms: bool = True) -> Sweep:
    """Validate a parsed sweep mapping and expand it into validated runs."""
    src, base_dir = source, Path(base_dir)
    name = check_top_level(spec, src)
    algos = valid_algorithms() if check_algorithms else None
    data = base_config(spec, src, base_dir)
    if "algorithm" in data:
        check_algorithm(data["algorithm"], f"{src}: config.algorithm", algos)
    grids = grid_section(spec.get("grid"), src, algos)
    grid_keys = list(dict.fromkeys(str(k) for g in grids for k in g))
    per_algo = algorithms_section(spec.get("algorithms"), src, grid_keys, algos)
    budget = budget_section(spec.get("budget"), src)
    launcher = launcher_section(spec.get("launcher"), src, base_dir)
    report = report_options(spec.get("report"), src, base_dir)
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise SweepError(f"{src}: description must be text, got {type(description).__name__}")
    od = _output_dir(output_dir, spec, data, src)
    cli = parse_overrides(overrides)
    for k, _ in cli:
        check_key(k, "--set")
        if k in ("name", "output_dir"):  # set by the sweep after every layer: an override would be lost
            what, fix = (("its name", "change the sweep file's name") if k == "name" else
                         ("its output directory", "give --output-dir instead"))
            raise SweepError(f"--set {k}=...: a sweep's runs take {what} ({src}: {k}); {fix}")
    layers = _Layers(data, per_algo, budget, cli, name, Path(od).expanduser().resolve(), src, algos)
    runs, used_algos = _expand_grids(grids, layers)
    if report.baseline is not None and report.baseline not in used_algos:
        raise SweepError(f"{src}: report.baseline={report.baseline!r} names no algorithm of this sweep's runs"
                         f"{did_you_mean(report.baseline, sorted(used_algos), n=1)} (its algorithms: "
                         f"{', '.join(sorted(used_algos))})")
    warnings = [f"algorithms.{a} is given but no run uses algorithm {a!r}" for a in per_algo if a not in used_algos]
    warnings += list(dict.fromkeys(w for r in runs for w in config_warnings(r.config)))
    eff_budget = dict(to_dict(runs[0].config.budget)) if runs else budget
    return Sweep(name=name, source=src, description=description or "", runs=runs,
                 budget=eff_budget, launcher=launcher, output_dir=layers.out_root,
                 varying=_varying(runs, grid_keys), report_columns=report.columns, warnings=warnings,
                 report_study=report.study, report_selection=report.selection,
                 report_prm_selection=report.prm_selection, report_retired=report.retired,
                 report_sequential=report.sequential, report_amendments=report.amendments, report_cap=report.cap,
                 report_baseline=report.baseline)


def _output_dir(cli: Optional[str], spec: dict, data: dict, src: str) -> str:
    """The sweep's output directory: ``--output-dir`` > the sweep file's ``output_dir`` > the
    config's > the default; the first one given must be a directory path (an empty or NUL-holding
    one is refused, not passed over)."""
    for value, where in ((cli, "--output-dir"), (spec.get("output_dir"), f"{src}: output_dir"),
                         (data.get("output_dir"), f"{src}: config output_dir")):
        if value is not None:
            why = dir_path_problem(value)
            if why:
                raise SweepError(f"{where}={brief(value)} is invalid: {why}")
            return value
    return Config().output_dir


def _expand_grids(grids: list[dict], layers: _Layers) -> tuple[list[PlannedRun], set]:
    """One validated run per cell of each grid's cartesian product, in order; also the
    algorithms used. Two cells (of one grid or of two) that expand to one config are an error."""
    cells = [dict(zip([str(k) for k in g], combo)) for g in grids for combo in itertools.product(*g.values())]
    runs: list[PlannedRun] = []
    seen: dict[str, dict] = {}
    used_algos = set()
    for cell in cells:
        where = f"{layers.src}: run [{cell_label(cell)}]"
        algo, d = _layer_run(layers, cell, where)
        used_algos.add(algo)
        try:
            cfg = config_from_dict(d)
        except ConfigError as e:
            raise SweepError(f"{where}: {e}") from None
        rid = run_id(cfg)
        if rid in seen:
            raise SweepError(f"{layers.src}: runs [{cell_label(seen[rid])}] and [{cell_label(cell)}] expand to the "
                             f"same config (run id {rid}); remove the duplicate grid values")
        seen[rid] = cell
        rdir = layers.out_root / layers.name / rid
        runs.append(PlannedRun(rid, cfg, cell, rdir, _disk_state(rdir, cfg)))
    return runs, used_algos


def _layer_run(layers: _Layers, cell: dict, where: str) -> tuple[str, dict]:
    """The config mapping of one grid cell, and its algorithm's name."""
    algo = algorithm_name(apply_overrides(layers.data, cell, where))
    if "algorithm" not in layers.data and not any(k.startswith("algorithm") for k in cell):
        check_algorithm(algo, f"{layers.src}: default algorithm", layers.algos)
    d = apply_overrides(layers.data, layers.per_algo.get(algo) or {}, where)
    d = apply_overrides(d, cell, where)
    if layers.budget:
        d = deep_merge(d, {"budget": layers.budget})
    for k, v in layers.cli:
        set_dotted(d, k, v)
    d["name"] = layers.name
    d["output_dir"] = str(layers.out_root)
    return algo, d


def _varying(runs: list[PlannedRun], grid_keys: list[str]) -> list[str]:
    """Dotted config fields that differ between runs: the grid's first, in grid order, then the rest."""
    flats = [flatten({k: v for k, v in r.config_dict.items() if k not in NOT_HASHED}) for r in runs]
    varying = []
    for k in dict.fromkeys(k for f in flats for k in f):  # every run's keys: one the first run omits at its default
        if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1:  # (staleness 0) varies too
            varying.append(k)
    order = [k for g in grid_keys for k in varying
             if (k == "algorithm.name" if g == "algorithm" else (k == g or k.startswith(g + ".")))]
    order = list(dict.fromkeys(order))
    return order + [k for k in varying if k not in order]


def _disk_state(run_dir: Path, cfg: Optional[Config] = None) -> str:
    """The run's state from its summary.json; ``finished`` only when its files bear it out
    (:func:`harness.rundir.read.finished_problem` against ``cfg``'s budget), else
    ``unverified`` (resumed like an unfinished run), with a warning naming why."""
    s = read_json(run_dir / SUMMARY)
    if not isinstance(s, dict):
        return "new"
    st = s.get("status")
    if st == "finished":
        why = finished_problem(run_dir, s, cfg.budget if cfg is not None else None,
                               task=cfg.task.name if cfg is not None else "task")
        if why:
            warn_once(f"{run_dir / SUMMARY} says the run finished, but {why}: not trusted; the sweep runs it "
                      f"again (it resumes from its checkpoint)")
            return "unverified"
    return st if st in ("finished", "failed", "interrupted", "running") else "new"


def matches_only(run_id: str, patterns: list[str]) -> bool:
    """Whether ``run_id`` is selected by ``--only`` ``patterns`` (each a glob or a substring of the id)."""
    return any(fnmatch.fnmatch(run_id, pat) or pat in run_id for pat in patterns)


def _some_ids(ids: list[str], n: int = 8) -> str:
    return ", ".join(ids[:n]) + (f" and {len(ids) - n} more" if len(ids) > n else "")


def only_problem(sw: Sweep, only: Optional[list[str]], field: str = "--only") -> str:
    """Why ``only`` (``--only``'s patterns, split; None: not given) cannot select runs of ``sw``: it
    names no pattern (``--only ''``, ``--only ,``), or one of its patterns matches no run id of the
    sweep (finished runs included); '' when it can. The message lists the sweep's run ids."""
    if only is None:
        return ""
    ids = [r.run_id for r in sw.runs]
    choices = f"this sweep's run ids: {_some_ids(ids)}" if ids else "this sweep has no runs"
    if not only:
        return (f"{field} selects no run: it names no pattern (give a glob or a substring of run ids, "
                f"e.g. {field} 'grpo-*'; {choices})")
    for pat in only:
        if not any(matches_only(rid, [pat]) for rid in ids):
            return f"{field} {pat!r} matches no run of sweep {sw.name} (a glob or a substring of a run id; {choices})"
    return ""


def cell_label(cell: dict) -> str:
    """``algorithm=grpo, seed=0``: a grid cell as the plan and the messages name it."""
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in cell.items())


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


_STATE_NOTE = {"new": "new", "finished": "finished (skip)", "failed": "failed (re-run)",
               "interrupted": "interrupted (resume)", "running": "unfinished (resume)",
               "unverified": "finished? not borne out (resume)"}


def study_line(sw: Sweep) -> str:
    """What the plan says of report.study: where the study report will be written and from which
    selection folder (and that the folder does not exist yet, when so); '' without report.study."""
    if not sw.report_study:
        return ""
    line = f"study report: written to {sw.study_dir}/ when every run finished"
    if sw.report_sequential:
        line = (f"study report: written to {sw.study_dir}/ when every run the sequential design needs finished "
                f"(report.sequential: seed by seed; after the first look, only the arms of open claims)")
    if sw.report_selection is None:
        line += " (no learning-rate selection folder: report.selection is not set)"
    line += _folder_note(sw.report_selection, ", with the learning-rate selection", "the study report will fail")
    line += _folder_note(sw.report_prm_selection, "; the learned-PRM gate (claims 4 and 8)",
                         "the study report will say the gate could not be read")
    if sw.report_retired:
        line += f"; retired claims (report.retired): {', '.join(sorted(sw.report_retired, key=int))}"
    return line


def _folder_note(path: Optional[Path], what: str, if_not_folder: str) -> str:
    """``<what> from <path>`` and whether it exists yet (``if_not_folder`` when it is something else); ''
    without a path."""
    if path is None:
        return ""
    if not path.exists():
        return f"{what} from {path} (does not exist yet)"
    if not path.is_dir():
        return f"{what} from {path} (not a folder: {if_not_folder})"
    return f"{what} from {path}"


def format_plan(sw: Sweep, *, workers: Optional[int] = None) -> str:
    """The plan: budget, launcher, one row per run (id, algorithm, seed, varying fields, state)."""
    b = sw.budget
    out = [f"sweep {sw.name}: {len(sw.runs)} run(s) from {sw.source} -> {sw.sweep_dir}/"]
    if sw.description:
        out.append(f"  {sw.description.strip()}")
    points = {tuple(eval_points(r.config.budget, stage_samples(r.config.train.prompts_per_step,
                                                                r.config.sampling.samples_per_prompt)))
              for r in sw.runs}
    if len(points) == 1:
        (pts,) = points
        at = f"at {len(pts)} point(s): {', '.join(fmt_value(p) for p in pts)} {b['unit']}"
    else:
        at = f"at {b.get('eval_points')} point(s) (rounded to each run's stage boundaries)"
    out.append(f"budget: {fmt_value(b['amount'])} {b['unit']} per run; evaluated before training and {at}")
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
        if any(c not in flat for c in cols):  # a field config.yaml leaves out at its default (staleness 0): that value
            flat = {**settings(r.config_dict), **flat}
        rows.append([r.run_id, r.config.algo.name, str(r.config.seed)] + [fmt_value(flat.get(c)) for c in cols]
                    + [per_step(r.config), _STATE_NOTE.get(r.state, r.state)])
    out.append(table(headers, rows))
    todo = sum(r.state != "finished" for r in sw.runs)
    out.append(f"{todo} to run, {len(sw.runs) - todo} already finished")
    study = study_line(sw)
    if study:
        out.append(study)
    for wmsg in sw.warnings:
        out.append(f"warning: {wmsg}")
    return "\n".join(out)
