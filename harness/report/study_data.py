"""The runs of a study sweep as data: arms by seed, per-seed values, accuracy curves on the compute axes (samples, FLOPs, uncontended seconds).

Runs are grouped into study arms by `arm_of`: the algorithm name; ``<name>_iter`` for an
algorithm run with ``algorithm.ref_reset_every > 0`` (GRPO with reference resets is
``grpo_iter``); a learned reward model adds ``_<type>`` (``grpo_ps_prm``) and, for iterative RL
with R > 1 rounds, ``_r<R>`` (``grpo_ps_prm_r4``); PRIME's own implicit PRM adds nothing. Off-policy
training adds ``_k<k>`` for ``train.staleness`` k > 0 and ``_<correction>`` for an ``algorithm.correction``
other than none (``grpo_k8_token_tis``); LoRA adapters add ``_lora`` (``dr_grpo_lora``; full fine-tuning of
the same model is the plain name). One finished run per arm and seed, and one setting per arm: the runs of an arm
must agree on every setting in force but the seed (`run_settings`: names, paths, tracking, device and thread count
aside); a run that differs from the setting most of its arm's runs share (a tie: the smallest seed's) is excluded
and named with what differs (`off_setting`), never pooled with the others.

Compute axes (`axes_of`): ``samples`` always; ``flops`` when every evaluation row of the arm's
runs carries a FLOP counter (`FLOP_KEYS`), or every training row its own model FLOPs (`STAGE_FLOPS`,
summed in row order); ``seconds`` only when every run of the arm is
flagged as timed on an uncontended machine (`uncontended`: summary.json ``timing.uncontended:
true``, or sweep.json ``uncontended: true``): seconds measured beside other jobs say more about
the neighbours than about the algorithm.

The learning-rate selection (`find_selection_dir`, `load_selection`): the runs of a separate
sweep that trains each arm at candidate learning rates (and KL coefficients) and scores them on
the validation split (``final_val_eval``); its folder is the explicit one, else
``<sweep_dir>/selection``, else sweep.json's ``report.selection`` (relative to the sweep folder).
The study's own runs never include that subfolder.

The learned-PRM gate (`find_prm_selection_dir`, `prm_gate`): docs/study.md tests claims 4 and 8 with the
learned-PRM arms only when that arm's selected setting lifted mean validation accuracy at least
`PRM_GATE_POINTS` above its start; the selection's folder is ``<sweep_dir>/prm_selection``, else sweep.json's
``report.prm_selection``.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from harness.foundation.base import ConfigError
from harness.report.arms import CORRECTION_NAMES, RM_NAMES, arm_for, arm_name, arm_of  # noqa: F401 (re-exported)
from harness.report.aggregate import (knob_value, load_sweep_runs, run_settings, setting_difference,
                                      validation_selection)
from harness.report.problems import problem_values
from harness.rundir.layout import SUMMARY, read_json
from harness.rundir.read import RunData, is_number, is_run_dir, k_of, setup_records, split_metric

ARM_ORDER = ("grpo", "grpo_ps", "rft", "ppo", "grpo_iter", "dr_grpo", "rloo", "grpo_ps_prm", "grpo_ps_prm_r4",
             "prime", "dapo", "gspo", "cispo", "grpo_k1", "grpo_k8", "grpo_k8_token_tis", "dr_grpo_lora", "ppo_lora",
             "rft_lora")
FLOP_KEYS = ("flops",)
"""Row keys read as a cumulative FLOP counter on the evaluation rows."""
STAGE_FLOPS = "perf/flops"
"""A training row's own model FLOPs (`harness.train.flops`): summed in row order into the
cumulative counter of the evaluation rows when every training row carries it."""
CUMULATIVE_FLOPS = "flops (cumulative perf/flops)"
SELECTION_DIR = "selection"
"""The learning-rate selection's runs inside a study sweep folder (`find_selection_dir`)."""
PRM_SELECTION_DIR = "prm_selection"
"""The learned-PRM arm's selection runs inside a study sweep folder (`find_prm_selection_dir`)."""
PRM_ARM = "grpo_ps_prm"
"""The arm whose selection gates claims 4 and 8 (`prm_gate`)."""
PRM_GATE_POINTS = 3.0
"""The least gain (accuracy points, validation split, winner's mean over its start) with which the learned-PRM arm
counts as training (docs/study.md, "Study v3"), so that claims 4 and 8 are tested with it."""


@dataclass
class Study:
    """The finished runs of a sweep by arm and seed, and what the report needs to know about them."""
    sweep_dir: Path
    arms: "OrderedDict[str, dict[int, RunData]]"
    task: str
    ood: Optional[str]
    ks: dict = field(default_factory=dict)          # task -> largest K evaluated
    excluded: list = field(default_factory=list)     # "run_id (reason)"
    off_setting: list = field(default_factory=list)  # "run_id: what differs": excluded, not pooled into its arm
    bad_records: list = field(default_factory=list)  # "run_id: reason": excluded for their per-problem records
    sweep_json: dict = field(default_factory=dict)
    records_cache: dict = field(default_factory=dict)  # problems.problem_values' cache
    selection: Optional[dict] = None                  # `load_selection`'s, when a selection folder was found
    prm_gate: Optional[dict] = None                   # `prm_gate`'s, when sweep.json names a learned-PRM selection
    setup: list = field(default_factory=list)         # the setup records' ``setup_seconds`` (`setup_times`)
    setup_spans: list = field(default_factory=list)   # (start, end) of each setup record's setup (`setup_spans`)

    def runs(self) -> list:
        return [r for runs in self.arms.values() for r in runs.values()]


def load_study(sweep_dir) -> Study:
    """Finished runs grouped by arm and seed (a second finished run of an arm and seed, or a
    run without a seed, is excluded and listed); the in-domain task (the runs' configured
    task), the out-of-domain one (an evaluated task named ``*_ood``) and the largest K."""
    sweep_dir = Path(sweep_dir)
    runs = [r for r in load_sweep_runs(sweep_dir) if r.run_dir.name not in (SELECTION_DIR, PRM_SELECTION_DIR)]
    by_arm: dict[str, list] = {}
    for r in runs:
        if r.status == "finished" and r.seed is not None:
            by_arm.setdefault(arm_of(r), []).append(r)
    odd = {rid: why for rs in by_arm.values() for rid, why in off_setting(rs).items()}
    arms: dict[str, dict[int, RunData]] = {}
    excluded = []
    for r in runs:
        arm = arm_of(r)
        if r.status != "finished":
            excluded.append(f"{r.run_id} ({r.status})")
        elif r.run_id in odd:
            excluded.append(f"{r.run_id} (its settings differ from the other runs of {arm}: {odd[r.run_id]})")
        elif r.seed is None or r.seed in arms.get(arm, {}):
            excluded.append(f"{r.run_id} (no seed, or a second run of {arm} seed {r.seed})")
        else:
            arms.setdefault(arm, {})[r.seed] = r
    first = [a for a in ARM_ORDER if a in arms] + sorted(a for a in arms if a not in ARM_ORDER)
    task = next(iter(arms[first[0]].values())).task if first else "arith"
    cache: dict = {}
    bad = drop_bad_records(arms, task, cache)
    excluded += [f"{line.split(': ', 1)[0]} (per-problem records: {line.split(': ', 1)[1]})" for line in bad]
    order = [a for a in ARM_ORDER if a in arms] + sorted(a for a in arms if a not in ARM_ORDER)
    done = [r for a in order for r in arms[a].values()]
    ks: dict[str, int] = {}
    tasks = set()
    for r in done:
        for key in list(r.final_eval) + list(r.initial_eval):
            t, metric = split_metric(key)
            tasks.add(t)
            if k_of(metric):
                ks[t] = max(ks.get(t, 0), k_of(metric)[1])
    ood = f"{task}_ood" if f"{task}_ood" in tasks else next((t for t in sorted(tasks) if t.endswith("_ood")), None)
    try:
        sweep_json = read_json(sweep_dir / "sweep.json", {}) or {}  # bounded; a FIFO is never opened
    except OSError:
        sweep_json = {}
    return Study(sweep_dir=sweep_dir, arms=OrderedDict((a, dict(sorted(arms[a].items()))) for a in order),
                 task=task, ood=ood, ks=ks, excluded=excluded, bad_records=bad, records_cache=cache,
                 off_setting=[f"{rid}: {why}" for rid, why in odd.items()],
                 sweep_json=sweep_json, setup=setup_times(sweep_dir),
                 setup_spans=setup_spans(sweep_dir), prm_gate=prm_gate(sweep_dir, sweep_json))


def off_setting(runs: list) -> dict:
    """``{run_id: what differs}`` for each of ``runs`` (one arm's finished runs) whose settings in force
    (`harness.report.aggregate.run_settings`) are not the ones most of them share; a tie goes to the setting of the
    smallest seed. What differs: up to three keys as ``key=value (the arm's: value)``."""
    flats = {r.run_id: run_settings(r) for r in runs}
    votes: dict = {}
    for r in sorted(runs, key=lambda r: (r.seed if is_number(r.seed) else float("inf"), r.run_id)):
        key = repr(sorted(flats[r.run_id].items()))
        votes.setdefault(key, [0, r.run_id])[0] += 1
    if len(votes) < 2:
        return {}
    ref = flats[max(votes.values(), key=lambda v: v[0])[1]]   # max keeps the first (smallest seed) of a tie
    out = {}
    for r in runs:
        diff = setting_difference(flats[r.run_id], ref)
        if diff:
            out[r.run_id] = diff
    return out


def drop_bad_records(arms: dict, task: str, cache: dict) -> list[str]:
    """Take out of ``arms`` every run whose per-problem records (``eval/<task>_<step>.jsonl`` of its
    start and final evaluations) are there but cannot be trusted: a problem without a value, a mean
    that differs from the summary's accuracy (`harness.report.problems.problem_values`), or fewer
    problems than the other runs' (records cut short). Returns ``"<run id>: <why>"`` per run taken
    out; a run with no records at all stays (its claims resample seeds only, and the report says so)."""
    counts: dict = {}
    bad: dict = {}
    for seeds in arms.values():
        for r in seeds.values():
            for side in ("initial", "final"):
                vals, why = problem_values(r, task, "acc", side, cache)
                if vals is not None:
                    counts[(r.run_id, side)] = len(vals)
                elif ": no records eval/" not in why and ": no final evaluation row" not in why:
                    bad.setdefault(r.run_id, f"{side} evaluation: {why.removeprefix(r.run_id + ': ')}")
    for side in ("initial", "final"):
        most = max((n for (_, s), n in counts.items() if s == side), default=0)
        for (rid, s), n in counts.items():
            if s == side and n < most:
                bad.setdefault(rid, f"{side} evaluation: {n} problems' records, the other runs have {most} "
                                    f"(cut short)")
    for arm in list(arms):
        arms[arm] = {s: r for s, r in arms[arm].items() if r.run_id not in bad}
        if not arms[arm]:
            del arms[arm]
    return [f"{rid}: {why}" for rid, why in sorted(bad.items())]


def setup_times(sweep_dir: Path) -> list:
    """The ``setup_seconds`` of each setup record of the sweep (`harness.rundir.read.setup_records`)."""
    return [secs for _, secs in setup_records(sweep_dir)]


def setup_spans(sweep_dir: Path) -> list:
    """``(start, end)`` in epoch seconds of each setup record's setup: from its summary's ``started``
    for the sum of its ``setup_seconds`` (what the process did after its setup, if anything, is not
    the study's time); records without a start time are left out."""
    out = []
    for d, secs in setup_records(sweep_dir):
        t0 = (read_json(d / SUMMARY, {}) or {}).get("started")
        if is_number(t0):
            out.append((float(t0), float(t0) + sum(secs.values())))
    return out


def per_seed(runs: dict, value: Callable[[RunData], Optional[float]], scale: float = 1.0) -> dict:
    """``{seed: scale * value(run)}`` over the runs whose value is a finite number."""
    out = {}
    for seed, r in runs.items():
        v = value(r)
        if is_number(v) and np.isfinite(v):
            out[seed] = scale * float(v)
    return out


def final(metric: str) -> Callable[[RunData], Optional[float]]:
    return lambda r: r.final_eval.get(metric)


def initial(metric: str) -> Callable[[RunData], Optional[float]]:
    return lambda r: r.initial_eval.get(metric)


def peak_rss(r: RunData) -> Optional[float]:
    return r.peak["rss_mb"]


# --------------------------------------------------------------------------- compute axes


def uncontended(run: RunData, sweep_json: Optional[dict] = None) -> bool:
    """Whether the run's seconds were measured on an uncontended machine (see the module doc)."""
    timing = run.summary.get("timing")
    if isinstance(timing, dict) and timing.get("uncontended") is True:
        return True
    return bool(isinstance(sweep_json, dict) and sweep_json.get("uncontended") is True)


def _training_rows(run: RunData) -> list:
    return [row for row in run.rows if "perf/step_seconds" in row]


def flop_key(run: RunData, task: str) -> Optional[str]:
    """The FLOP counter every evaluation row of ``task`` carries (``flops``), or
    `CUMULATIVE_FLOPS` when every training row carries its own `STAGE_FLOPS` instead; else None."""
    key = f"eval/{task}/acc"
    rows = [row for row in run.rows if is_number(row.get(key))]
    found = next((k for k in FLOP_KEYS if rows and all(is_number(row.get(k)) for row in rows)), None)
    if found is None and rows:
        train = _training_rows(run)
        if train and all(is_number(row.get(STAGE_FLOPS)) for row in train):
            return CUMULATIVE_FLOPS
    return found


def _row_x(run: RunData, xk: str) -> list:
    """Per row of the run, its x value for counter ``xk`` (`CUMULATIVE_FLOPS`: the training rows'
    `STAGE_FLOPS` summed up to and including that row, in row order)."""
    if xk != CUMULATIVE_FLOPS:
        return [row.get(xk) for row in run.rows]
    out, total = [], 0.0
    for row in run.rows:
        if "perf/step_seconds" in row:
            total += float(row[STAGE_FLOPS])
        out.append(total)
    return out


def axes_of(study: Study, runs: dict) -> tuple:
    """``(axes, notes)``: the compute axes an arm's curves may use, and why the others are not."""
    axes, notes = ["samples"], []
    rs = list(runs.values())
    if rs and all(flop_key(r, study.task) for r in rs):
        axes.append("flops")
    if rs and all(uncontended(r, study.sweep_json) for r in rs):
        axes.append("seconds")
    else:
        notes.append("seconds: not used (runs not flagged as timed on an uncontended machine)")
    return axes, notes


def acc_curves(runs: dict, task: str, xkey: str) -> list[tuple]:
    """Per seed, ``(x, accuracy)`` at the run's evaluation rows, x the counter ``xkey``
    (``samples``, ``seconds`` or ``flops``: the run's FLOP counter); without evaluation rows,
    the summary's start and end."""
    key = f"eval/{task}/acc"
    curves = []
    for r in runs.values():
        xk = (flop_key(r, task) or "flops") if xkey == "flops" else xkey
        pts = [(x, row[key]) for x, row in zip(_row_x(r, xk), r.rows) if is_number(row.get(key)) and is_number(x)]
        if not pts:
            end = ((r.summary.get("budget") or {}).get("consumed") or {}).get(xkey)
            pts = [(0.0, r.initial_eval.get(f"{task}/acc")), (end, r.final_eval.get(f"{task}/acc"))]
            pts = [(x, y) for x, y in pts if is_number(x) and is_number(y)]
        if pts:
            curves.append((np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)))
    return curves


def samples_to_reach(run: RunData, task: str, target: float) -> Optional[float]:
    """Samples at which the run's greedy accuracy first reaches ``target`` (linear
    interpolation between evaluation points; None when it never does)."""
    curves = acc_curves({0: run}, task, "samples")
    if not curves:
        return None
    x, y = curves[0]
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    if y[0] >= target:
        return float(x[0])
    for i in range(1, len(x)):
        if y[i] >= target:
            return float(x[i - 1] + (target - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1]))
    return None


# --------------------------------------------------------------------------- learning-rate selection


def find_selection_dir(sweep_dir, selection_dir=None, sweep_json: Optional[dict] = None) -> tuple:
    """``(folder or None, how it was found)``: ``selection_dir`` when given (the CLI's
    ``--selection``); else ``<sweep_dir>/selection`` when that folder exists; else sweep.json's
    ``report.selection`` (a path relative to the sweep folder, or absolute) when that folder
    exists; else ``(None, why)``."""
    if selection_dir is not None:
        return Path(selection_dir), "given with --selection"
    folder, where = _study_folder(sweep_dir, sweep_json, SELECTION_DIR, "selection")
    return (folder, where) if where is not None else (None, "no selection folder")


def find_prm_selection_dir(sweep_dir, sweep_json: Optional[dict] = None) -> tuple:
    """``(folder or None, how it was found, or why not)`` of the learned-PRM gate's selection:
    ``<sweep_dir>/prm_selection`` when that folder exists, else sweep.json's ``report.prm_selection`` (relative
    to the sweep folder, or absolute) when that folder exists; ``(None, None)`` when neither is set (no gate)."""
    return _study_folder(sweep_dir, sweep_json, PRM_SELECTION_DIR, "prm_selection",
                         f" here (copy its runs into {Path(sweep_dir) / PRM_SELECTION_DIR}/)")


def _study_folder(sweep_dir, sweep_json, subdir: str, key: str, hint: str = "") -> tuple:
    """A folder the study report reads beside the runs: ``(<sweep_dir>/<subdir>, how)`` when it exists, else
    ``(sweep.json's report.<key>, how)`` (relative to the sweep folder, or absolute) when that is a folder;
    ``(None, why)`` when report.<key> names something else (``hint`` ends the sentence), ``(None, None)`` when
    neither is there."""
    sweep_dir = Path(sweep_dir)
    if (sweep_dir / subdir).is_dir():
        return sweep_dir / subdir, f"the sweep folder's {subdir}/"
    rep = sweep_json.get("report") if isinstance(sweep_json, dict) else None
    path = rep.get(key) if isinstance(rep, dict) else None
    if not (isinstance(path, str) and path):
        return None, None
    p = Path(path) if Path(path).is_absolute() else sweep_dir / path
    if p.is_dir():
        return p, f"sweep.json report.{key}"
    return None, f"sweep.json's report.{key} {path} is not a folder{hint}"


def prm_gate(sweep_dir, sweep_json: Optional[dict] = None) -> Optional[dict]:
    """The learned-PRM gate of claims 4 and 8 (docs/study.md): None when the sweep names no PRM selection;
    else ``{"passes": bool, "text": why}`` plus, when the selection could be read, its ``name``, the
    ``winner`` (``knobs`` = values), ``val_acc`` and ``start_val_acc`` (fractions) and ``gain`` (points).
    ``passes`` only when the `PRM_ARM` group's winner recorded its start and gained at least
    `PRM_GATE_POINTS`; a folder that is missing, unreadable or without that arm does not pass, and ``text``
    says which."""
    folder, where = find_prm_selection_dir(sweep_dir, sweep_json)
    if folder is None:
        return None if where is None else {"passes": False, "text": f"the learned-PRM gate could not be read: {where}"}
    try:
        sel = validation_selection(load_sweep_runs(folder), arm_of)
    except (FileNotFoundError, OSError) as e:
        return {"passes": False, "text": f"the learned-PRM gate could not be read: {e}"}
    group = next((g for g in sel["groups"] if g["group"] == PRM_ARM), None)
    if group is None:
        return {"passes": False, "text": f"the learned-PRM gate's selection ({folder.name}) has no finished "
                                         f"{arm_name(PRM_ARM)} run with a validation score"}
    knobs = ", ".join(f"{k} {v}" for k, v in zip(group["knobs"], group["winner"]))
    out = {"name": folder.name, "winner": knobs, "val_acc": group["val_acc"],
           "start_val_acc": group["start_val_acc"], "gain": None}
    if group["start_val_acc"] is None:
        return {**out, "passes": False, "text": f"the learned-PRM arm's selected setting ({knobs}; {folder.name}) "
                                                f"did not record its start's validation score, so its gain is unknown"}
    gain = 100.0 * (group["val_acc"] - group["start_val_acc"])
    out["gain"] = gain
    said = (f"the learned-PRM arm's selected setting ({knobs}; {folder.name}) scored "
            f"{100 * group['val_acc']:.1f}% on the validation split against its start's "
            f"{100 * group['start_val_acc']:.1f}%, a gain of {gain:+.1f} points")
    passes = round(gain, 9) >= PRM_GATE_POINTS
    return {**out, "passes": passes,
            "text": said + (f" (at least {PRM_GATE_POINTS:g} needed: it trains)" if passes else
                            f", under the {PRM_GATE_POINTS:g} points docs/study.md asks before claims 4 and 8 are "
                            f"tested with it")}


def load_selection(selection_dir) -> dict:
    """The selection runs of a folder (`find_selection_dir`), per study arm (`arm_of`):
    `aggregate.validation_selection` (every setting that varies within an arm is part of a candidate), plus
    ``"runs"`` (the folder's runs), ``"name"`` (the folder's name), ``"parts"`` (``[(selection sweep, runs)]``)
    and ``"disjoint"`` (how many runs were trained with ``task.disjoint_validation: true``).

    A folder that holds no run folders itself but one folder per selection sweep (a study whose arms' rates came
    from several selections: ``selection/lr_select/``, ``selection/objectives_lr/``, ...) is read sweep by sweep,
    each selecting its own arms; an arm two of them select is an error naming both (which one decided it cannot
    be told)."""
    folder = Path(selection_dir)
    parts = _selection_parts(folder)
    groups, skipped, runs, owner, counts = [], [], [], {}, []
    for name, sub in parts:
        got = load_sweep_runs(sub)
        counts.append((name, len(got)))
        sel = validation_selection(got, arm_of)
        for g in sel["groups"]:
            if g["group"] in owner:
                raise ConfigError(f"the selection folder {folder} selects {arm_name(g['group'])} ({g['group']}) in "
                                 f"both {owner[g['group']]}/ and {name}/: keep one of them")
            owner[g["group"]] = name
        groups += sel["groups"]
        skipped += [f"{name}/{x}" if len(parts) > 1 else x for x in sel["skipped"]]
        runs += got
    return {"groups": sorted(groups, key=lambda g: g["group"]), "skipped": skipped, "runs": runs,
            "name": folder.name, "parts": counts,
            "disjoint": sum(1 for r in runs if knob_value(r, "task.disjoint_validation") is True)}


def _selection_parts(folder: Path) -> list:
    """``[(name, folder)]`` of the selection sweeps in ``folder``: itself when it holds run folders (or nothing
    else: `load_sweep_runs` then says what it found), else each subfolder that holds run folders, by name."""
    if folder.is_dir() and not any(d.is_dir() and is_run_dir(d) for d in folder.iterdir()):
        subs = [d for d in sorted(folder.iterdir())
                if d.is_dir() and any(x.is_dir() and is_run_dir(x) for x in d.iterdir())]
        if subs:
            return [(d.name, d) for d in subs]
    return [(folder.name, folder)]


def selection_check(study: Study) -> list:
    """Per study arm: ``(arm, None)`` when its runs use the selection's winner, else ``(arm,
    text)`` saying what differs, or that the selection has no entry for the arm."""
    if study.selection is None:
        return []
    winners = {g["group"]: g for g in study.selection["groups"]}
    out = []
    for arm, runs in study.arms.items():
        g = winners.get(arm)
        if g is None:
            out.append((arm, "no selection entry (its learning rate was not selected here)"))
            continue
        diffs = []
        for k, w in zip(g["knobs"], g["winner"]):
            used = sorted({repr(knob_value(r, k)) for r in runs.values()})
            if used != [repr(w)]:
                diffs.append(f"{k} {', '.join(used)} (the selection's winner: {w!r})")
        out.append((arm, "mismatch: runs at " + "; ".join(diffs) if diffs else None))
    return out
