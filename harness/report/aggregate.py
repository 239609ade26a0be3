"""A sweep's runs as data: loading them, grouping them into table rows, and the aggregate DataFrame.

One row for the starting checkpoint ("start": each run's ``initial_eval`` averaged per seed)
and one per algorithm, or per algorithm and config when runs of one algorithm differ in config
keys other than seeds, names, paths and tracking (compared as effective configs: the
algorithm's preset-filled components written out). Only finished runs enter the aggregates;
each cell is `harness.report.stats.mean_ci` over the row's runs (seeds). `differing_settings`
lists the config fields that differ between rows, `paired_differences` each row's paired
difference over seeds from the first algorithm's row (`harness.report.stats.paired_diff_ci`).
"""
from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Optional

import numpy as np

from harness.config.schema import settings
from harness.foundation.base import flatten
from harness.report.arms import arm_of
from harness.report.format import value_text
from harness.report.problems import problem_values
from harness.report.stats import mean_ci, paired_diff_ci, problem_variance, t_quantile
from harness.rundir.read import RunData, is_number, is_run_dir, k_of, load_run, split_metric

_IGNORED_CFG = ("seed", "name", "output_dir", "device", "tracking.", "train.threads", "warmup.cache_dir")
PAIRED_SKIP = ("budget_consumed", "warmup_seconds")
"""Columns without a paired difference (the budget is matched; the warm-up is shared)."""


def _ignored(key: str) -> bool:
    return key.endswith("seed") or any(key == p or (p.endswith(".") and key.startswith(p)) for p in _IGNORED_CFG)


def run_settings(r: RunData) -> dict:
    """The run's effective config, flattened, less seeds, names, paths and tracking (its config
    as written when it cannot be resolved, e.g. a hand-edited summary: never an error). A field the file
    leaves out because it holds its default (``train.staleness`` 0, ``algorithm.correction`` none: the
    knobs that came later) reads as that default, so rows are never told apart by a gap."""
    return comparable_settings(r.config)


def comparable_settings(config: dict) -> dict:
    """`run_settings` of a config as a dict (a planned run's, before it ran)."""
    return {k: v for k, v in settings(config).items() if not _ignored(k)}


def setting_difference(a: dict, b: dict, most: int = 3) -> str:
    """What differs between two `comparable_settings` (``""`` when nothing): up to ``most`` keys as
    ``key=<a's> (the arm's: <b's>)``, then how many more."""
    keys = sorted(k for k in set(a) | set(b) if repr(a.get(k)) != repr(b.get(k)))
    text = ", ".join(f"{k}={value_text(a.get(k), missing='—')} (the arm's: {value_text(b.get(k), missing='—')})"
                     for k in keys[:most])
    return text + (f" and {len(keys) - most} more" if len(keys) > most else "")


def load_sweep_runs(sweep_dir: str | os.PathLike) -> list[RunData]:
    """The runs directly under a sweep directory (``<output_dir>/<name>/``). A run whose files
    cannot be read, or whose ``finished`` is not borne out, is among them with that status
    (``unreadable`` / ``unverified``) and the reason as its error: never an exception."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"no such sweep directory: {sweep_dir}")
    dirs = [d for d in sorted(sweep_dir.iterdir()) if d.is_dir() and is_run_dir(d)]
    if not dirs:
        sweeps = sorted(d.name for d in sweep_dir.iterdir()
                        if d.is_dir() and any(is_run_dir(x) for x in d.iterdir() if x.is_dir()))
        hint = f"; sweeps found there: {', '.join(sweeps)} (pass {sweep_dir}/<sweep>)" if sweeps else ""
        raise FileNotFoundError(f"no run directories (<run_id>/summary.json or metrics.jsonl) in {sweep_dir}{hint}")
    return [load_run(d) for d in dirs]


def group_runs(runs: list[RunData]) -> "OrderedDict[str, list[RunData]]":
    """Label -> runs. One group per algorithm; if runs of one algorithm differ in config keys
    other than seeds/names/paths/tracking, one group per distinct config, labelled by them."""
    by_algo: dict[str, list[RunData]] = {}
    for r in runs:
        by_algo.setdefault(r.algorithm, []).append(r)
    groups: "OrderedDict[str, list[RunData]]" = OrderedDict()
    for algo in sorted(by_algo):
        rs = by_algo[algo]
        flat = [run_settings(r) for r in rs]
        keys = sorted({k for f in flat for k in f})
        differing = [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]
        if not differing:
            groups[algo] = rs
            continue
        sub: dict[str, list[RunData]] = {}
        for r, f in zip(rs, flat):
            label = f"{algo} (" + ", ".join(f"{k}={f.get(k)}" for k in differing) + ")"
            sub.setdefault(label, []).append(r)
        for label in sorted(sub):
            groups[label] = sub[label]
    return groups


def _tasks_and_ks(runs: list[RunData]) -> tuple[list[str], dict[str, int]]:
    tasks: list[str] = []
    ks: dict[str, int] = {}
    first = runs[0].task if runs else None
    for r in runs:
        for src in (r.final_eval, r.initial_eval):
            for key in src:
                task, metric = split_metric(key)
                if task not in tasks:
                    tasks.append(task)
                kk = k_of(metric)
                if kk:
                    ks[task] = max(ks.get(task, 0), kk[1])
    tasks.sort(key=lambda t: (t != first, t))
    return tasks, ks


def per_seed_initial(runs: list[RunData]) -> list[dict[str, float]]:
    """Initial evaluations averaged over the runs of each seed (one dict per seed)."""
    by_seed: dict[object, list[dict]] = {}
    for r in runs:
        e = r.initial_eval
        if e:
            by_seed.setdefault(r.seed if r.seed is not None else r.run_id, []).append(e)
    out = []
    for evals in by_seed.values():
        keys = {k for e in evals for k in e}
        out.append({k: float(np.mean([e[k] for e in evals if k in e])) for k in keys})
    return out


def _metric_columns(tasks: list[str], ks: dict[str, int], runs: list[RunData]) -> list[str]:
    cols = []
    for t in tasks:
        cols.append(f"{t}/acc")
        if t in ks:
            cols += [f"{t}/maj@{ks[t]}", f"{t}/pass@{ks[t]}"]
    cols += ["peak_rss_mb", "peak_rss_above_base_mb"]
    if any((r.peak.get("cuda_mb") or 0) > 0 for r in runs):
        cols.append("peak_cuda_mb")
    cols += ["wall_seconds", "train_seconds"]
    if any(warmup_cost(r.summary) is not None for r in runs):
        cols.append("warmup_seconds")  # the shared warm-up's build time, apart from wall_seconds
    cols.append("budget_consumed")
    return cols


def _run_values(r: RunData) -> dict[str, Optional[float]]:
    v: dict[str, Optional[float]] = dict(r.final_eval)
    p = r.peak
    v.update({"peak_rss_mb": p["rss_mb"], "peak_rss_above_base_mb": p["rss_above_base_mb"],
              "peak_cuda_mb": p["cuda_mb"], "wall_seconds": r.whole_wall_seconds,
              "train_seconds": r.train_seconds, "budget_consumed": r.budget_consumed,
              "warmup_seconds": warmup_cost(r.summary)})
    return v


def warmup_cost(summary: dict) -> Optional[float]:
    """Seconds the run's starting warm-up checkpoint took to build, wherever it was built: by this
    run, by another run of the sweep, or by `harness quickstart` before the runs (its cache entry
    records its build time, ``summary["start"]["seconds"]``). Older summaries without it: the
    time the run itself spent on the warm-up (``warmup_seconds``: lock wait and build). None
    when the run started from no warm-up (a pretrained or untrained model)."""
    start = summary.get("start") if isinstance(summary.get("start"), dict) else {}
    if "cached" in start and is_number(start.get("seconds")):
        return float(start["seconds"])
    return float(summary["warmup_seconds"]) if is_number(summary.get("warmup_seconds")) else None


def build_table(runs: list[RunData]):
    """The aggregate table: index = 'start' + group labels; columns = MultiIndex
    (metric, stat) with stat in mean | ci95 | n. ``df.attrs`` carries budget_unit, tasks, ks."""
    import pandas as pd

    done = [r for r in runs if r.status == "finished"]
    tasks, ks = _tasks_and_ks(done)
    cols = _metric_columns(tasks, ks, done)
    groups = group_runs(done)
    rows: "OrderedDict[str, dict]" = OrderedDict()
    seeds = per_seed_initial(done)
    if seeds:
        rows["start"] = {c: mean_ci([s.get(c) for s in seeds]) for c in cols}
        rows["start"]["seeds"] = (float(len(seeds)), float("nan"), len(seeds))
    for label, rs in groups.items():
        vals = [_run_values(r) for r in rs]
        rows[label] = {c: mean_ci([v.get(c) for v in vals]) for c in cols}
        rows[label]["seeds"] = (float(len(rs)), float("nan"), len(rs))
    columns = pd.MultiIndex.from_tuples([(c, s) for c in cols + ["seeds"] for s in ("mean", "ci95", "n")],
                                        names=["metric", "stat"])
    data = [[row.get(c, (np.nan, np.nan, 0))[i] for c in cols + ["seeds"] for i in range(3)] for row in rows.values()]
    df = pd.DataFrame(data, index=pd.Index(list(rows), name="row"), columns=columns)
    for c in cols + ["seeds"]:
        df[(c, "n")] = df[(c, "n")].astype(int)
    units = [r.budget_unit for r in done] or [r.budget_unit for r in runs] or ["steps"]
    df.attrs.update({"budget_unit": max(set(units), key=units.count), "tasks": tasks, "ks": ks,
                     "groups": {k: [r.run_id for r in v] for k, v in groups.items()}})
    return df


def differing_settings(groups: "OrderedDict[str, list[RunData]]") -> tuple[list[str], dict[str, dict[str, str]]]:
    """The config fields (dotted, effective values) that differ between the table's rows, and
    each row's value of them: ``(keys, {label: {key: text}})``. A row whose runs disagree on a
    key shows every value, comma-separated. Seeds, names, paths and tracking are left out."""
    per_row = {label: [run_settings(r) for r in rs] for label, rs in groups.items()}
    keys = sorted({k for flats in per_row.values() for f in flats for k in f})
    text = {label: {k: ", ".join(dict.fromkeys(value_text(f.get(k), missing="—") for f in flats)) for k in keys}
            for label, flats in per_row.items()}
    differing = [k for k in keys if len({row[k] for row in text.values()}) > 1]
    return differing, {label: {k: row[k] for k in differing} for label, row in text.items()}


def per_seed_values(runs: list[RunData], column: str) -> dict:
    """Seed -> the runs' value of an aggregate column (mean over runs of one seed; runs without
    a seed or a finite value are left out)."""
    by_seed: dict = {}
    for r in runs:
        v = _run_values(r).get(column)
        if r.seed is not None and v is not None and np.isfinite(v):
            by_seed.setdefault(r.seed, []).append(float(v))
    return {s: float(np.mean(v)) for s, v in by_seed.items()}


def baseline_label(groups: "OrderedDict[str, list[RunData]]", algorithm: str) -> Optional[str]:
    """The row of ``algorithm``: the label equal to it, else the first ``"<algorithm> (<settings>)"`` one
    (None: no row of that algorithm)."""
    for lab in groups:
        if lab == algorithm:
            return lab
    return next((lab for lab in groups if lab.startswith(f"{algorithm} (")), None)


def paired_differences(groups: "OrderedDict[str, list[RunData]]", columns: list[str],
                       base: Optional[str] = None) -> tuple[str, dict]:
    """(the base row's label, {label: {column: paired_diff_ci(row, base)}}) for every other row: the
    mean over seeds of (row - base), each seed's runs against the same seed's, with the t-interval of
    those differences (n = the seeds both rows have; no interval for n < 2). ``base``: a row's label
    (default: the first row)."""
    labels = list(groups)
    if len(labels) < 2:
        return (labels[0] if labels else ""), {}
    base = labels[0] if base is None else base
    cols = [c for c in columns if c not in PAIRED_SKIP]
    return base, {lab: {c: paired_diff_ci(per_seed_values(groups[lab], c), per_seed_values(groups[base], c))
                        for c in cols} for lab in labels if lab != base}


def seeds_note(groups: "OrderedDict[str, list[RunData]]") -> str:
    """Number of seeds (and which) per row, and the interval method, as one report note."""
    rows = []
    for label, rs in groups.items():
        seeds = sorted({r.seed for r in rs if r.seed is not None})
        rows.append(f"{label}: n={len(rs)} run{'s' if len(rs) != 1 else ''} "
                    f"(seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds)) or '?'})")
    return ("seeds per row: " + "; ".join(rows) + ". Interval: two-sided 95% Student-t over seeds, "
            "t_{0.975, n-1} * s / sqrt(n) (s with ddof 1); n = 1 shows the value alone, without an interval. "
            "Differences between two algorithms: paired by seed (same warm-up, same prompts), the same "
            "t-interval of the per-seed differences.")


def _split_acc(r: RunData, key: str) -> Optional[tuple]:
    """``(task, accuracy)`` of summary ``key`` (``final_val_eval`` / ``initial_val_eval``): its ``eval/<task>/acc``
    of the run's own task, else the only ``eval/*/acc`` there; None without one."""
    val = r.summary.get(key)
    if not isinstance(val, dict):
        return None
    accs = {k.split("/")[1]: v for k, v in val.items()
            if k.startswith("eval/") and k.endswith("/acc") and k.count("/") == 2 and is_number(v)}
    if r.task in accs:
        return r.task, float(accs[r.task])
    return next(iter(accs.items())) if len(accs) == 1 else None


def select_by_validation(runs: list[RunData], over: str = "train.lr") -> list[dict]:
    """The plain report's view of `validation_selection`, runs grouped by study arm (`arms.arm_of`: the
    algorithm, with ``_lora`` for LoRA adapters, ``_k<k>`` for staleness, ``_prm`` for a learned PRM, ...):
    per arm with at least two candidates (one is no selection), the setting whose finished runs score best on
    the validation split. LoRA and full fine-tuning of one algorithm are two arms with a winner each, as their
    optima differ (LoRA's sits near 10x the full one's). The setting is the value of config key ``over``
    (default the learning rate), with every other setting that varies between the arm's runs beside it: a
    candidate is one combination, never a mean over the others.

    Returns one dict per arm: ``{"algorithm": the arm, "over", "best", "val_acc", "candidates": {value: mean
    val acc}, "split": "validation", "task"}``; where more than ``over`` varies, ``over`` names the settings
    (comma-separated), ``best`` maps each to its value and the candidates are keyed by their values' text.
    Where the winner's runs recorded their start's validation score (``initial_val_eval``), ``start_val_acc``
    is its mean over them; where the winning ``over`` value is the smallest or largest tried, ``edge`` says
    which. Ties go to the smaller values. Never looks at the test split."""
    out = []
    for g in validation_selection(runs, arm_of, first=over)["groups"]:
        if len(g["candidates"]) < 2:
            continue
        knobs, others = g["knobs"], len(g["knobs"]) > 1
        entry = {"algorithm": g["group"], "over": ", ".join(knobs),
                 "best": dict(zip(knobs, g["winner"])) if others else g["winner"][0],
                 "val_acc": g["val_acc"], "split": "validation", "task": g["task"]}
        if others:
            entry["candidates"] = {", ".join(value_text(v) for v in c["values"]): c["mean"] for c in g["candidates"]}
        else:
            entry["candidates"] = {c["values"][0]: c["mean"] for c in g["candidates"]}   # in ascending order
        if g["start_val_acc"] is not None:
            entry["start_val_acc"] = g["start_val_acc"]
        if g["edge"] is not None:
            entry["edge"] = g["edge"]
        if g["margin"] is not None:
            m = g["margin"]
            entry["margin"] = {**m, "runner_up": (dict(zip(knobs, m["runner_up"])) if others
                                                  else m["runner_up"][0])}
        out.append(entry)
    return out


def selection_notes(selection: list[dict]) -> list[str]:
    """One report note per arm: which setting won and on which split (its gain over the start's
    validation score, where recorded; a winner at the smallest or largest value tried, said)."""
    notes = []
    for s in selection:
        best = s["best"]
        won = (", ".join(f"{k}={value_text(v)}" for k, v in best.items()) if isinstance(best, dict)
               else f"{s['over']}={value_text(best)}")
        start = (f", start {s['start_val_acc']:.3f}, gain {100 * (s['val_acc'] - s['start_val_acc']):+.1f} points"
                 if "start_val_acc" in s else "")
        head = f"candidates ({s['over']}) " if isinstance(best, dict) else "candidates "
        first = s["over"].split(", ")[0]
        edge = (f"; the winner's {first} is the {s['edge']} tried: the optimum may lie "
                f"{'below' if s['edge'] == 'smallest' else 'above'} it" if s.get("edge") else "")
        notes.append(f"selection on the {s['task']} validation split (never the test split): {s['algorithm']} -> "
                     f"{won} (validation acc {s['val_acc']:.3f}{start}; {head}"
                     + ", ".join(f"{value_text(v)}: {a:.3f}" for v, a in s["candidates"].items()) + ")" + edge
                     + _margin_text(s.get("margin")))
    return notes


def _margin_text(m: Optional[dict]) -> str:
    """The note's sentence on the winner's lead over the runner-up (`_margin`), or "" without one."""
    if not m:
        return ""
    ru = m["runner_up"]
    ru = ", ".join(f"{k}={value_text(v)}" for k, v in ru.items()) if isinstance(ru, dict) else value_text(ru)
    over = (f"{m['problems']} validation problems x {m['seeds']} seeds" if m["seeds"] > 1 else
            f"{m['problems']} validation problems, one seed: the problems' sampling only, not the runs' own randomness")
    apart = ("" if m["lo"] > 0 else "; the interval includes 0: the winner is not separated from the runner-up")
    return (f"; ahead of the runner-up ({ru}) by {100 * m['diff']:+.1f} points, paired {100 * m['level']:.0f}% "
            f"interval [{100 * m['lo']:+.1f}, {100 * m['hi']:+.1f}] over {over}{apart}")


def knob_value(r: RunData, key: str):
    """A run's value of a config key as written, else its effective value (the preset's);
    None when neither has it."""
    v = flatten(r.config if isinstance(r.config, dict) else {}, keep_empty=True).get(key)
    return v if v is not None else run_settings(r).get(key)


def _sort_key(v):
    return (0, float(v), "") if is_number(v) else (1, 0.0, repr(v))


def _edge(rows: list, winner) -> Optional[str]:
    """"smallest" / "largest" when ``winner`` is that end of the first knob's values in ``rows`` (more than
    one value), else None."""
    values = sorted({c["values"][0] for c in rows}, key=_sort_key)
    if len(values) < 2:
        return None
    return "smallest" if winner == values[0] else "largest" if winner == values[-1] else None


def validation_selection(runs: list[RunData], group, first: str = "train.lr") -> dict:
    """The one learning-rate (and setting) selection on the validation split, for the plain report
    (`select_by_validation`) and the study (`study_data.load_selection`, by arm).

    Per group (``group(run)``), the candidate settings scored on the validation split: the mean over
    seeds of each candidate's ``final_val_eval`` ``eval/<task>/acc`` (finished runs only; a second run of a
    seed and candidate is ignored). A group's knobs are ``first`` (the learning rate) and, sorted, every
    other setting (`run_settings`) whose value varies between its runs: a candidate is one combination, never
    a pool over settings it does not name. Winner: the highest mean (compared to 12 decimals); ties to the
    smaller first knob, then the smaller next ones. Never reads a test-split metric.

    Returns ``{"groups": [{"group", "task", "knobs", "candidates": [{"values", "per_seed": {seed: acc},
    "mean", "n"}], "winner", "val_acc", "start_val_acc", "edge"}], "skipped": ["run_id (why)"]}``;
    ``start_val_acc`` is the mean of the winner's runs' ``initial_val_eval`` accuracy when every one of them
    recorded it, else None; ``edge`` is "smallest" / "largest" when the winner's ``first`` value is that end of
    the values its candidates tried (more than one), else None; ``margin`` the winner's lead over the runner-up
    with its interval (`_margin`), or None (one candidate, or no usable validation records)."""
    by: dict = {}
    skipped = []
    for r in runs:
        va = _split_acc(r, "final_val_eval") if r.status == "finished" else None
        if va is None:
            skipped.append(f"{r.run_id} ({r.status if r.status != 'finished' else 'no final_val_eval accuracy'})")
            continue
        by.setdefault(group(r), []).append((r, va))
    out = []
    for g in sorted(by):
        items = by[g]
        vals = [{**run_settings(r), first: knob_value(r, first)} for r, _ in items]
        names = sorted({k for v in vals for k in v} - {first})
        used = [first] + [k for k in names if len({repr(v.get(k)) for v in vals}) > 1]
        cands: dict = {}
        for (r, (_, acc)), v in zip(items, vals):
            seed = r.seed if r.seed is not None else r.run_id
            cands.setdefault(tuple(v.get(k) for k in used), {}).setdefault(seed, (r, acc))
        rows = []
        for key in sorted(cands, key=lambda t: tuple(_sort_key(x) for x in t)):
            per = dict(sorted(cands[key].items(), key=lambda kv: _sort_key(kv[0])))
            rows.append({"values": key, "per_seed": {s: acc for s, (_, acc) in per.items()},
                         "mean": float(np.mean([acc for _, acc in per.values()])), "n": len(per)})
        best = max(rows, key=lambda c: round(c["mean"], 12))   # rows in ascending knob order: the first max wins
        rest = [c for c in rows if c is not best]
        second = max(rest, key=lambda c: round(c["mean"], 12)) if rest else None
        starts = [_split_acc(r, "initial_val_eval") for r, _ in cands[best["values"]].values()]
        out.append({"group": g, "task": items[0][1][0], "knobs": used, "candidates": rows,
                    "winner": best["values"], "val_acc": best["mean"], "edge": _edge(rows, best["values"][0]),
                    "start_val_acc": (float(np.mean([s[1] for s in starts]))
                                      if starts and all(s is not None for s in starts) else None),
                    "margin": (_margin(cands[best["values"]], cands[second["values"]], items[0][1][0], second)
                               if second is not None else None)})
    return {"groups": out, "skipped": skipped}


def _margin(win: dict, other: dict, task: str, second: dict, level: float = 0.95) -> Optional[dict]:
    """The winner's lead over the runner-up on the validation split, paired by seed and problem (the
    validation records, `problems.problem_values`): the mean of the per-seed differences and its interval with
    the study's variance, s^2 / n over the seeds plus the problems' term (`stats.problem_variance`), on n - 1
    degrees of freedom; with one seed, var_p(D_p) / P on P - 1 (the problems' sampling only: one run cannot show
    its own randomness). ``win``/``other``: ``{seed: (run, acc)}``. None when a seed of both lacks usable records
    or the seeds scored different problems."""
    seeds = sorted(win.keys() & other.keys(), key=_sort_key)
    diffs, ids = [], None
    for sd in seeds:
        a, _ = problem_values(win[sd][0], task, "acc", "validation")
        b, _ = problem_values(other[sd][0], task, "acc", "validation")
        if a is None or b is None or a.keys() != b.keys() or (ids is not None and a.keys() != ids):
            return None
        ids = a.keys()
        diffs.append(np.array([a[p] - b[p] for p in sorted(ids)]))
    if not diffs or len(ids) < 2:
        return None
    n, n_p = len(diffs), len(ids)
    means = np.array([d.mean() for d in diffs])
    # problem_variance's one-seed case is var_p(D_p) / P itself (residual and problem effect not told apart)
    var = (float(means.var(ddof=1)) / n if n > 1 else 0.0) + problem_variance(diffs, crossed=True)["var"]
    df = n - 1 if n > 1 else n_p - 1
    half = t_quantile(0.5 + level / 2.0, df) * var ** 0.5
    mean = float(means.mean())
    return {"runner_up": second["values"], "runner_up_mean": second["mean"], "diff": mean, "lo": mean - half,
            "hi": mean + half, "seeds": n, "problems": n_p, "level": level}
