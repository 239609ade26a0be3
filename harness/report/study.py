"""The DeepSeekMath small-study report of one sweep: Table 5, Figs. 5-7, the large-K check, compute curves and the claims' verdicts.

`build_study_report(sweep_dir, out_dir)` writes ``report.md``, ``claims.csv``, ``table5.csv``,
``compute_curves.csv`` and ``plots/*.png``. Runs are grouped into study arms by
`arms.arm_of`, one finished run per seed and arm. Table 5 and the figures show
two-sided Student-t intervals over seeds (`stats.mean_ci`); differences between two arms, or
an arm and its start, are paired by seed (`stats.paired_diff_ci`: the same seed means the same
warm-up and the same prompt order). The claims' verdicts come from `study_claims` and
`decisions` under a pre-stated `decisions.Design` (SESOI, alpha, Holm family, looks; docs/study.md),
never from text written by hand. Compute curves: `curvefit.study_curves` on samples (and FLOPs
where the runs count them; seconds only from runs flagged as timed on an uncontended machine).

report.md, claims.csv and table5.csv are a function of the run folders only (no path of this
machine, no clock, seeded bootstraps; CSV numbers to 10 significant digits): recomputed from the
same run folders they are byte-identical.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

from harness.report.aggregate import per_seed_initial
from harness.report.curvefit import N_BOOT, TOLERANCE, study_curves
from harness.report.decisions import Design
from harness.report.format import md_safe, plus_minus, table, value_text, with_interval
from harness.report.limits import is_cap
from harness.report.problems import gold_keys, guessing_floor
from harness.report.stats import mean_ci, mean_curve, paired_diff_ci
from harness.report.study_claims import (amendments, claims, claims_csv_rows, claims_markdown, study_title,
                                         unknown_retired)
from harness.report.study_data import (Study, acc_curves, arm_name, arm_of, axes_of, final, find_selection_dir,
                                       initial, load_selection, load_study, per_seed, selection_check, uncontended)
from harness.report.study_plots import colors_for, plot_accuracy, plot_fits, plot_k
from harness.rundir.outputs import check_output, staged
from harness.rundir.read import RunData, is_number

__all__ = ["build_study_report", "load_study", "table5", "large_k_check", "compute_curves", "run_seconds",
           "time_summary", "Design", "guessing_floors", "selection_markdown", "provenance_summary", "phase_walls"]

LEVEL = 0.95
DESIGN = Design()
"""The study's pre-stated decision rules (docs/study.md)."""


def design_of(sweep_json: dict) -> Design:
    """`DESIGN` with the cap the sweep file states (``report.cap``, recorded in sweep.json): the most seeds any arm
    is looked at. `DESIGN` itself when sweep.json states none (or something `limits.is_cap` refuses, as the sweep
    file would have been)."""
    rep = sweep_json.get("report") if isinstance(sweep_json, dict) else None
    cap = rep.get("cap") if isinstance(rep, dict) else None
    return dataclasses.replace(DESIGN, cap=cap) if is_cap(cap) else DESIGN


# --------------------------------------------------------------------------- where the time went


def run_seconds(r: RunData) -> dict:
    """Seconds of one run by phase. ``warmup``: building the supervised warm-up (summary
    ``setup_seconds.warmup_build``; older summaries: ``warmup_seconds``, or ``start.seconds``
    when this run trained it rather than loading the cache); ``warmup_wait``: waiting for a
    warm-up another run builds; ``train``: the budget counter ``seconds``; ``eval``: the start
    evaluation (``setup_seconds.initial_eval``) plus each later evaluation row's time: the span
    from the row before it to it (both ``time`` stamps: the trainer logs a training row, evaluates,
    then logs the evaluation row), else its ``eval/<task>/seconds`` (runs of before 2026-11-27
    recorded there only the greedy pass's seconds when the n samples were drawn on a subset);
    the start row too when there is no ``setup_seconds``; ``wall``: ``ended - started``, else
    ``wall_seconds`` plus the setup; ``other`` = wall - the rest."""
    setup = {k: float(v) for k, v in (r.summary.get("setup_seconds") or {}).items() if is_number(v)}
    start = r.summary.get("start") or {}
    if setup:
        warm, wait = setup.get("warmup_build", 0.0), setup.get("warmup_wait", 0.0)
    else:
        warm, wait = r.summary.get("warmup_seconds"), 0.0
        if not is_number(warm):
            warm = start.get("seconds") if start.get("cached") is False and is_number(start.get("seconds")) else 0.0
    ev, prev = setup.get("initial_eval", 0.0), None
    for row in r.rows:
        secs = [float(v) for k, v in row.items() if k.startswith("eval/") and k.endswith("/seconds") and is_number(v)]
        t = row.get("time") if is_number(row.get("time")) else None
        if secs and not (setup and not (r.counter(row) or 0) > 0):
            ev += t - prev if t is not None and prev is not None and t >= prev else sum(secs)
        prev = t if t is not None else prev
    t0, t1 = r.summary.get("started"), r.summary.get("ended")
    wall = float(t1 - t0) if is_number(t0) and is_number(t1) else (
        r.wall_seconds + sum(setup.values()) if r.wall_seconds is not None else None)
    out = {"warmup": float(warm), "warmup_wait": float(wait), "train": float(r.train_seconds or 0.0),
           "eval": float(ev), "wall": wall}
    out["other"] = max(0.0, wall - sum(out[k] for k in ("warmup", "warmup_wait", "train", "eval"))) \
        if wall is not None else None
    return out


def time_summary(study: Study) -> dict:
    """Sums over runs of `run_seconds`, and over the setup jobs (``setup_*``: warm-up built,
    waited for, start evaluation; `harness.report.study_data.setup_times`); the sweep's wall-clock from sweep.json
    (``started``/``start`` to ``finished``/``ended``/``updated``) when it records both, else the
    span from the first run's ``started`` to the last run's ``ended`` (summaries)."""
    keys = ("warmup", "warmup_wait", "train", "eval", "other", "wall")
    tot = {k: 0.0 for k in keys}
    tot["runs"], starts, ends, spans = 0, [], [], list(study.setup_spans)
    tot["setup_jobs"] = len(study.setup)
    for k, name in (("setup_warmup", "warmup_build"), ("setup_wait", "warmup_wait"), ("setup_eval", "initial_eval")):
        tot[k] = sum(s.get(name, 0.0) for s in study.setup)
    for runs in study.arms.values():
        for r in runs.values():
            s = run_seconds(r)
            tot["runs"] += 1
            for k in keys:
                tot[k] += s[k] or 0.0
            began, ended = r.summary.get("started"), r.summary.get("ended")
            starts += [began] if is_number(began) else []
            ends += [ended] if is_number(ended) else []
            if is_number(began) and is_number(ended) and ended >= began:
                spans.append((float(began), float(ended)))
    sj = study.sweep_json
    t0 = next((sj[k] for k in ("started", "start", "started_at") if is_number(sj.get(k))), None)
    t1 = next((sj[k] for k in ("finished", "ended", "end", "updated") if is_number(sj.get(k))), None)
    tot["sweep_wall"], tot["sweep_wall_from"] = None, None
    if t0 is not None and t1 is not None and t1 >= t0:
        tot["sweep_wall"], tot["sweep_wall_from"] = float(t1 - t0), "sweep.json"
    elif starts and ends and max(ends) >= min(starts):
        tot["sweep_wall"], tot["sweep_wall_from"] = float(max(ends) - min(starts)), "first run start to last run end"
    tot["parts"] = busy_parts(spans)
    tot["busy"] = sum(e - s for s, e in tot["parts"])
    return tot


PART_GAP_SECONDS = 300.0
"""An idle gap longer than this between the study's runs and setup jobs starts a new part."""


def busy_parts(spans: list) -> list:
    """The union of ``(start, end)`` intervals, as disjoint ``(start, end)`` parts in time order;
    intervals less than `PART_GAP_SECONDS` apart are one part (the gap counts in it)."""
    parts: list = []
    for s, e in sorted(spans):
        if parts and s <= parts[-1][1] + PART_GAP_SECONDS:
            parts[-1] = (parts[-1][0], max(parts[-1][1], e))
        else:
            parts.append((s, e))
    return parts


def _parts_text(parts: list) -> str:
    def utc(t):
        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    def span(s, e):
        a, b = utc(s), utc(e)
        return f"{a}-{b[11:] if b[:10] == a[:10] else b} UTC ({e - s:.0f} s)"
    return "; ".join(span(s, e) for s, e in parts)


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _records_line(study: Study) -> str:
    runs = study.runs()
    have = sum(1 for r in runs if (r.run_dir / "eval").is_dir() and any((r.run_dir / "eval").glob("*.jsonl")))
    if have == len(runs):
        return f"all {len(runs)} runs have per-problem evaluation records"
    return (f"{have} of {len(runs)} runs have per-problem evaluation records: claims on the others resample seeds "
            f"only (the test set's sampling is not counted there; say so per claim below)")


def _counted(values: list, missing: str = "not recorded") -> str:
    """``"a (3 runs); b (1 run)"`` over the distinct values (sorted as text), ``missing`` for None."""
    counts: dict = {}
    for v in values:
        t = missing if v is None or v == "" else str(v)
        counts[t] = counts.get(t, 0) + 1
    return "; ".join(f"{t} ({n} run{'s' if n != 1 else ''})" for t, n in sorted(counts.items()))


PROVENANCE_VERSIONS = ("torch", "transformers", "numpy", "scipy", "python")


def provenance_summary(runs: list) -> dict:
    """What the runs were made with, from each summary's ``provenance``: ``{"runs", "recorded",
    "commits": [(commit, clean, runs)], "cpu", "numerics", "versions": {name: text}}`` (texts:
    each distinct value with its number of runs)."""
    provs = []
    for r in runs:
        p = (r.summary or {}).get("provenance")
        provs.append(p if isinstance(p, dict) and p else None)
    rec = [p for p in provs if p is not None]
    commits: dict = {}
    for p in rec:
        code = p.get("code") if isinstance(p.get("code"), dict) else {}
        key = (str(code.get("commit") or "not a git checkout"),
               "unknown" if not code else ("dirty tree" if code.get("dirty") else "clean tree"))
        commits[key] = commits.get(key, 0) + 1
    sub = lambda p, k: p.get(k) if isinstance(p.get(k), dict) else {}
    return {"runs": len(runs), "recorded": len(rec),
            "commits": [(c, clean, n) for (c, clean), n in sorted(commits.items())],
            "cpu": _counted([sub(p, "cpu").get("model") for p in rec]),
            "numerics": _counted([sub(p, "numerics").get("mode") for p in rec]),
            "versions": {k: _counted([sub(p, "versions").get(k) for p in rec]) for k in PROVENANCE_VERSIONS}}


def _provenance_lines(label: str, runs: list) -> list[str]:
    p = provenance_summary(runs)
    if not p["recorded"]:
        return [f"- **{label} provenance:** not recorded ({p['runs']} runs from before provenance was recorded)"]
    head = f"- **{label} provenance** ({p['recorded']} of {p['runs']} runs record it"
    head += "):" if p["recorded"] == p["runs"] else "; the others predate it):"
    commits = p["commits"]
    ctext = (f"{commits[0][0]} ({commits[0][1]})" if len(commits) == 1 else
             f"{len(commits)} commits: " + "; ".join(f"{c} ({clean}): {n} run{'s' if n != 1 else ''}"
                                                    for c, clean, n in commits))
    vers = "; ".join(f"{k} {v}" for k, v in p["versions"].items())
    return [head, f"  - commit: {ctext}", f"  - CPU: {p['cpu']}", f"  - numerics: {p['numerics']}",
            f"  - versions: {vers}"]


def phase_walls(study: Study) -> dict:
    """Summed wall-clock seconds (`run_seconds` ``wall``) of the study's runs and of the
    selection's finished runs, each in all and per arm: ``{"study": (total, {arm: s}, runs),
    "selection": (total, {arm: s}, runs) or None}``."""
    def walls(pairs):
        per: dict = {}
        for arm, r in pairs:
            per[arm] = per.get(arm, 0.0) + (run_seconds(r)["wall"] or 0.0)
        return sum(per.values()), per, len(pairs)
    out = {"study": walls([(a, r) for a, rs in study.arms.items() for r in rs.values()]), "selection": None}
    if study.selection is not None:
        sel = [r for r in study.selection["runs"] if r.status == "finished"]
        pairs = [(arm_of(r), r) for r in sel]
        order = {a: i for i, a in enumerate(study.arms)}
        pairs.sort(key=lambda ar: (order.get(ar[0], len(order)), ar[0]))
        out["selection"] = walls(pairs)
    return out


def _walls_text(name: str, w) -> str:
    total, per, n = w
    return (f"{name}: {total:.0f} s over {n} runs (" + ", ".join(f"{arm_name(a)} {v:.0f} s" for a, v in per.items())
            + ")")


def header(study: Study, design: Design) -> list[str]:
    """The report's opening: the command, the runs' provenance, seeds, methods and the time
    (nothing of the machine that builds the report but the statistics' library versions)."""
    seeds = "; ".join(f"{a}: {len(rs)} ({', '.join(str(s) for s in rs)})" for a, rs in study.arms.items())
    t = time_summary(study)
    sweep_wall = f"{t['sweep_wall']:.0f} s ({t['sweep_wall_from']})" if t["sweep_wall"] is not None else \
        "not recorded (no start and end time in sweep.json or the summaries)"
    timed = [r for r in study.runs() if uncontended(r, study.sweep_json)]
    walls = phase_walls(study)
    sel_opt = f" --selection <folder {study.selection['name']}>" if study.selection is not None else ""
    setup = (f"; setup jobs (each seed's warm-up and start evaluation, built in a process of its own before the "
             f"runs): {t['setup_jobs']}, warm-up {t['setup_warmup']:.0f} s (plus {t['setup_wait']:.0f} s waiting), "
             f"start evaluation {t['setup_eval']:.0f} s") if t["setup_jobs"] else ""
    lines = [
        study_title(study), "",
        f"- **Command:** `harness report <sweep folder {study.sweep_dir.name}> --study{sel_opt} --output-dir <folder>`",
        *_provenance_lines("Runs'", study.runs()),
        *(_provenance_lines("Selection runs'", study.selection["runs"]) if study.selection is not None else []),
        f"- **Statistics computed with:** numpy {_version('numpy')}, scipy {_version('scipy')}",
        f"- **Seeds per algorithm (finished runs):** {seeds or 'none'}",
        f"- **In-domain set:** `{study.task}`; **out-of-domain set:** `{study.ood or 'not evaluated'}`",
        f"- **Per-problem records:** {_records_line(study)}",
        "- **Intervals in tables and figures:** 95% two-sided Student-t over seeds (t_{0.975, n-1} · s / √n); "
        "differences between two arms, or an arm and its start, are paired by seed (same seed = same warm-up and "
        "prompt order) and their interval is the t-interval of the per-seed differences. The claims add the "
        "hierarchical bootstrap over seeds × problems and decide with known error rates (section Claims).",
        f"- **Where the time went** (sum over {t['runs']} runs): warm-up {t['warmup']:.0f} s (plus "
        f"{t['warmup_wait']:.0f} s waiting for a shared warm-up), RL training {t['train']:.0f} s, evaluation "
        f"{t['eval']:.0f} s, other {t['other']:.0f} s; runs' wall-clock {t['wall']:.0f} s{setup}; the sweep's "
        f"wall-clock: {sweep_wall}; the machine's time on them (the union of the runs' and setup jobs' intervals): "
        + (f"{t['busy']:.0f} s in {len(t['parts'])} part{'s' if len(t['parts']) != 1 else ''} (a part ends at an "
           f"idle gap over {PART_GAP_SECONDS / 60:.0f} min): {_parts_text(t['parts'])}" if t["parts"] else
           "not recorded") + f". Timed on an uncontended machine: {len(timed)} of {len(study.runs())} runs "
        "(the others' seconds are not used as a compute axis).",
        "- **Wall time per phase** (runs' wall-clock seconds, summed): "
        + (_walls_text("learning-rate selection", walls["selection"]) if walls["selection"] else
           "learning-rate selection: no selection runs in this report")
        + "; " + _walls_text("study", walls["study"]),
    ]
    if study.bad_records:
        lines.append(f"- **Runs excluded for incomplete or inconsistent per-problem records** (every claim, table "
                     f"and figure leaves them out; a verdict may differ from a report with them): "
                     f"{'; '.join(study.bad_records)}")
    if study.off_setting:
        lines.append(f"- **Runs excluded for settings that differ from their arm's other runs** (an arm pools the "
                     f"seeds of one setting; every claim, table and figure leaves them out): "
                     f"{'; '.join(study.off_setting)}")
    if study.excluded:
        lines.append(f"- **Excluded runs:** {', '.join(study.excluded)}")
    return lines + [""]


# --------------------------------------------------------------------------- Table 5


def _has_valid_acc(study: Study, task) -> bool:
    """Whether any run carries ``<task>/valid_acc`` (greedy correct with every step valid)."""
    return bool(task) and any(is_number(r.final_eval.get(f"{task}/valid_acc"))
                              or is_number(r.initial_eval.get(f"{task}/valid_acc")) for r in study.runs())


def table5(study: Study) -> list[dict]:
    """Per arm: greedy accuracy (%) at the start and after RL, in-domain and out-of-domain,
    mean and CI over seeds, and the paired gain; the same for the valid-step accuracy
    (``valid_acc``, columns ``<set>_valid_*``) of a set whose runs carry it."""
    rows = []
    metrics = [(p, t, m) for p, t in (("id", study.task), ("ood", study.ood))
               for m in ("acc", "valid_acc") if m == "acc" or _has_valid_acc(study, t)]
    for arm, runs in study.arms.items():
        row = {"algorithm": arm, "seeds": len(runs)}
        for set_prefix, task, metric in metrics:
            prefix = set_prefix if metric == "acc" else f"{set_prefix}_valid"
            key = f"{task}/{metric}"
            a = per_seed(runs, final(key), 100.0) if task else {}
            b = per_seed(runs, initial(key), 100.0) if task else {}
            for name, vals in (("start", b), ("after", a)):
                m, h, n = mean_ci(vals.values(), LEVEL)
                row.update({f"{prefix}_{name}_mean": m, f"{prefix}_{name}_ci95": h, f"{prefix}_{name}_n": n})
            d = paired_diff_ci(a, b, LEVEL)
            row.update({f"{prefix}_gain_mean": d["mean"], f"{prefix}_gain_lo": d["lo"], f"{prefix}_gain_hi": d["hi"],
                        f"{prefix}_gain_n": d["n"]})
        rows.append(row)
    return rows


def table5_markdown(study: Study, rows: list[dict]) -> list[str]:
    sets = [("id", study.task or "in-domain"), ("ood", study.ood or "OOD")]
    heads, cols = ["algorithm", "seeds"], []
    for p, name in sets:
        heads += [f"{name} start", f"{name} after RL", "paired gain"]
        cols.append(p)
        if rows and f"{p}_valid_start_mean" in rows[0]:
            heads += [f"{name} valid start", f"{name} valid after RL", "paired gain (valid)"]
            cols.append(f"{p}_valid")
    body = []
    for r in rows:
        cells = [arm_name(r["algorithm"]), r["seeds"]]
        for p in cols:
            gain = {"mean": r[f"{p}_gain_mean"], "lo": r[f"{p}_gain_lo"], "hi": r[f"{p}_gain_hi"],
                    "n": r[f"{p}_gain_n"], "half": r[f"{p}_gain_hi"] - r[f"{p}_gain_mean"]}
            cells += [plus_minus(r[f"{p}_start_mean"], r[f"{p}_start_ci95"]),
                      plus_minus(r[f"{p}_after_mean"], r[f"{p}_after_ci95"]), with_interval(gain)]
        body.append(cells)
    valid = ("; **valid**: greedy correct and every step of the derivation valid (the task's process rewards "
             "all 1: `valid_acc`), beside the accuracy for each set whose runs record it") if any(
        c.endswith("_valid") for c in cols) else ""
    return ["## Table 5 analogue: greedy accuracy before and after RL (%)", "",
            "Mean ± 95% CI over seeds; the start is each arm's own starting checkpoint (its runs' "
            "`initial_eval`); the gain is paired by seed, shown as mean [95% CI] in points" + valid + ".", "",
            table(heads, body, style="markdown"), ""]


# --------------------------------------------------------------------------- guessing floor


def guessing_floors(study: Study) -> list[dict]:
    """Per evaluation set (in-domain, out-of-domain): the guessing floor (`problems.guessing_floor`:
    the accuracy of always answering the set's most frequent gold answer, from the runs'
    per-problem records, every run's problems pooled) and per arm the mean over seeds of the
    greedy accuracy, of acc − valid_acc (correct answers over an invalid derivation) at the start
    and after RL, and of the accuracy after RL above the floor (all in points)."""
    out = []
    for task in [t for t in (study.task, study.ood) if t]:
        golds: dict = {}
        for r in study.runs():
            for i, g in gold_keys(r, task, study.records_cache).items():
                golds.setdefault(i, g)
        fl = guessing_floor(golds)
        row = {"task": task, "floor": fl, "arms": []}
        for arm, runs in study.arms.items():
            a = {}
            for side, get in (("start", initial), ("after", final)):
                acc = per_seed(runs, get(f"{task}/acc"), 100.0)
                val = per_seed(runs, get(f"{task}/valid_acc"), 100.0)
                both = sorted(set(acc) & set(val))
                a[f"{side}_acc"] = float(np.mean(list(acc.values()))) if acc else None
                a[f"{side}_invalid"] = float(np.mean([acc[s] - val[s] for s in both])) if both else None
            a["above_floor"] = a["after_acc"] - 100.0 * fl["floor"] if fl and a["after_acc"] is not None else None
            row["arms"].append({"algorithm": arm, **a})
        out.append(row)
    return out


def _pts(v, sign: bool = False) -> str:
    return "—" if v is None else format(v, "+.1f" if sign else ".1f")


def guessing_floor_markdown(study: Study, rows: list[dict]) -> list[str]:
    lines = ["## Guessing floor and valid steps", "",
             "**Guessing floor**: the accuracy of the best constant answer, the share of a set's problems whose gold "
             "answer (its answer key) is the set's most frequent one, from the per-problem records. **Correct, step "
             "invalid**: acc − valid_acc, the share of problems answered correctly by greedy decoding over a "
             "derivation with an invalid step, at the start and after RL. Means over seeds, in points.", ""]
    for row in rows:
        fl, task = row["floor"], row["task"]
        if fl is None:
            lines += [f"`{task}`: no per-problem records with gold answers: no guessing floor.", ""]
            continue
        lines += [f"**`{task}`**: guessing floor {100 * fl['floor']:.1f}% ({fl['count']} of {fl['problems']} problems "
                  f"have the most frequent gold answer, {fl['answer']}).", ""]
        body = [[arm_name(a["algorithm"]), _pts(a["start_acc"]), _pts(a["start_invalid"]), _pts(a["after_acc"]),
                 _pts(a["after_invalid"]), _pts(a["above_floor"], True)] for a in row["arms"]]
        lines += [table(["algorithm", "start acc", "start: correct, step invalid", "after RL acc",
                         "after RL: correct, step invalid", "after RL − floor"], body, style="markdown"), ""]
        if task == study.ood:
            g = next((a for a in row["arms"] if a["algorithm"] == "grpo"), None) or (row["arms"] or [None])[0]
            if g is not None and g["above_floor"] is not None:
                lines += [f"Out-of-domain: {arm_name(g['algorithm'])}'s accuracy after RL, {g['after_acc']:.1f}%, is "
                          f"{g['above_floor']:+.1f} points above the guessing floor of {100 * fl['floor']:.1f}% (the "
                          f"start: {_pts(g['start_acc'])}%, "
                          f"{_pts(None if g['start_acc'] is None else g['start_acc'] - 100 * fl['floor'], True)} "
                          "points).", ""]
    return lines


# --------------------------------------------------------------------------- large-K check


def _cross(start: list, arm: list, ks: list) -> object:
    """The smallest K at which start > arm, when start <= arm at K = 1; 'from K=1' when the
    start is above already at K = 1; None when it never crosses."""
    if start[0] > arm[0]:
        return "from K=1"
    return next((k for k, s, a in zip(ks, start, arm) if s > a), None)


def valid_pass_prefix(study: Study, task: str) -> str:
    """``"valid_"`` when every run carries ``<task>/valid_pass@K`` for K = 1..n at the start and
    the end (the large-K check then counts valid-step solutions only), else ``""``."""
    n = study.ks.get(task)
    ok = bool(n) and all(is_number(e.get(f"{task}/valid_pass@{k}")) for r in study.runs()
                         for e in (r.initial_eval, r.final_eval) for k in range(1, n + 1))
    return "valid_" if ok else ""


def large_k_check(study: Study, task: str) -> list[dict]:
    """Per arm: does the start's pass@K cross above the arm's as K grows, and at which K, on
    the means over seeds and per seed; and the paired pass@n difference arm - start. Over
    valid-step solutions (``valid_pass@K``) when every run carries them (`valid_pass_prefix`)."""
    n = study.ks.get(task)
    out = []
    if not n:
        return out
    ks = list(range(1, n + 1))
    v = valid_pass_prefix(study, task)
    for arm, runs in study.arms.items():
        fin = {k: per_seed(runs, final(f"{task}/{v}pass@{k}")) for k in ks}
        ini = {k: per_seed(runs, initial(f"{task}/{v}pass@{k}")) for k in ks}
        seeds = sorted(set.intersection(*[set(fin[k]) & set(ini[k]) for k in ks]))
        if not seeds:
            out.append({"algorithm": arm, "n": n, "seeds": [], "mean_cross": None, "per_seed": {}, "diff_at_n": None,
                        "metric": f"{v}pass"})
            continue
        ms = [float(np.mean([ini[k][s] for s in seeds])) for k in ks]
        ma = [float(np.mean([fin[k][s] for s in seeds])) for k in ks]
        per = {s: _cross([ini[k][s] for k in ks], [fin[k][s] for k in ks], ks) for s in seeds}
        d = paired_diff_ci({s: 100 * fin[n][s] for s in seeds}, {s: 100 * ini[n][s] for s in seeds}, LEVEL)
        out.append({"algorithm": arm, "n": n, "seeds": seeds, "mean_cross": _cross(ms, ma, ks), "per_seed": per,
                    "diff_at_n": d, "start_mean": ms, "arm_mean": ma, "metric": f"{v}pass"})
    return out


def large_k_markdown(study: Study) -> list[str]:
    lines = ["## Large-K check: does the start's Pass@K overtake RL's?", "",
             "Crossing K: the smallest K at which the start's pass@K exceeds the arm's, given that the "
             "arm is at or above the start at K = 1 ('from K=1' when the start is above already at "
             "K = 1; 'never' when it does not cross up to K = n). On the means over seeds, and per seed "
             "(paired: the same seed's start and run). Last column: paired pass@n difference arm − start "
             "in points, mean [95% CI].", ""]
    for task in [t for t in (study.task, study.ood) if t]:
        rows = large_k_check(study, task)
        if not rows:
            lines += [f"`{task}`: no pass@K evaluated.", ""]
            continue
        body = [[arm_name(r["algorithm"]), len(r["seeds"]), _k_text(r["mean_cross"]),
                 ", ".join(f"s{s}: {_k_text(k)}" for s, k in r["per_seed"].items()) or "—",
                 with_interval(r["diff_at_n"]) if r["diff_at_n"] else "no data"] for r in rows]
        metric = rows[0]["metric"]
        what = ("valid-step solutions only (valid_pass@K: a sample with an invalid step counts as wrong)"
                if metric == "valid_pass" else
                "all correct answers: the runs carry no valid_pass@K (older evaluator), so invalid derivations count")
        lines += [f"**`{task}`** (K = 1..{rows[0]['n']}; {what})", "",
                  table(["algorithm", "seeds", "crossing K (means)", "crossing K per seed",
                         f"{metric}@{rows[0]['n']} arm − start"], body, style="markdown"), ""]
    return lines


def _k_text(k) -> str:
    return "never" if k is None else str(k)


# --------------------------------------------------------------------------- learning-rate selection


def _knob(k: str) -> str:
    return {"train.lr": "lr", "algorithm.kl_coef": "beta (kl_coef)", "algorithm.beta": "beta"}.get(k, k)


def _selection_parts_text(sel: dict) -> str:
    """`` holding N selection sweeps (a: k runs, ...)`` when the folder holds more than one, else ''."""
    parts = sel.get("parts") or []
    if len(parts) < 2:
        return ""
    return (f", holding {len(parts)} selection sweeps, each selecting its own arms ("
            + ", ".join(f"`{n}`: {k} runs" for n, k in parts) + ")")


def selection_markdown(study: Study, where: str) -> list[str]:
    """The learning-rate selection table (every candidate per arm with its per-seed validation
    accuracies, mean, seeds and the winner) and the check of the study's arms against it."""
    head = ["## Learning-rate selection (validation split)", ""]
    sel = study.selection
    if sel is None:
        return head + [f"The learning rates were not selected in this report ({where}).", ""]
    groups = sel["groups"]
    task = groups[0]["task"] if groups else study.task
    lines = head + [
        f"Selection runs: folder `{sel['name']}` ({where}){_selection_parts_text(sel)}; {len(sel['runs'])} runs, "
        f"{sel['disjoint']} trained with `task.disjoint_validation: true`. Each arm (named as the study names it) "
        f"was trained at every candidate; a candidate's score is its runs' `final_val_eval` `eval/{task}/acc` "
        "(the validation split), averaged over seeds; the winner has the highest mean, ties to the smaller "
        "learning rate (then the smaller beta). The selection reads only the validation split, never the test "
        "split's results. Accuracies in %.", ""]
    body = []
    for g in groups:
        for c in g["candidates"]:
            body.append([arm_name(g["group"]),
                         ", ".join(f"{_knob(k)} {value_text(v)}" for k, v in zip(g["knobs"], c["values"])),
                         ", ".join(f"s{s}: {100 * a:.1f}" for s, a in c["per_seed"].items()), f"{100 * c['mean']:.2f}",
                         c["n"], "**winner**" if c["values"] == g["winner"] else ""])
    lines += [table(["arm", "candidate", "validation acc per seed", "mean", "seeds", ""], body, style="markdown")
              if body else "No selection run has a validation accuracy.", ""]
    if sel["skipped"]:
        lines += [f"- not scored (no validation accuracy, or not finished): {', '.join(sel['skipped'])}"]
    for g in groups:
        edge = g["edge"]
        if edge:
            lines.append(f"- {arm_name(g['group'])}: the winner is at the {edge} learning rate tried "
                         f"({value_text(g['winner'][0])}): the optimum may lie {'below' if edge == 'smallest' else 'above'} it")
    for arm, text in selection_check(study):
        lines.append(f"- {arm_name(arm)} ({arm}): " + (text or "runs at the selection's winner"))
    return lines + [""]


# --------------------------------------------------------------------------- compute curves

AXIS_LABELS = {"samples": "samples (completions drawn)", "flops": "training FLOPs (the runs' counter)",
               "seconds": "training seconds (uncontended runs; evaluation excluded)"}


def compute_curves(study: Study, n_boot: int = N_BOOT, seed: int = 0, tolerance: float = TOLERANCE) -> list[dict]:
    """Per arm and compute axis (`study_data.axes_of`): the ScaleRL fit of the in-domain mean
    accuracy curve, ``n_boot`` bootstrap resamples over seeds, the parameters that are not
    identified, and the extrapolation check on the last (held-out) point with ``tolerance``."""
    out = []
    for arm, runs in study.arms.items():
        axes, _ = axes_of(study, runs)
        for axis in axes:
            row = {"algorithm": arm, "axis": axis}
            curves = acc_curves(runs, study.task, axis)
            try:
                cs = study_curves(curves, n_boot=n_boot, seed=seed, level=LEVEL, tolerance=tolerance)
            except ValueError as e:
                out.append({**row, "error": str(e)})
                continue
            f, ex = cs.fit, cs.extrapolation
            mc = mean_curve(curves)
            row.update({"_fit": f, "_mean": (mc[0], mc[1])})
            row.update({"seeds": cs.n_seeds, "n_points": f.n_points, "r0": f.r0, "a": f.a, "b": f.b, "c_mid": f.c_mid,
                        "n_boot": cs.n_boot, "sse": f.sse})
            for k in ("a", "b", "c_mid"):
                lo, hi = cs.intervals.get(k, (float("nan"), float("nan")))
                row.update({f"{k}_lo": lo, f"{k}_hi": hi, f"{k}_boot_at_bound": cs.boot_at_bounds.get(k, float("nan"))})
            row["unidentified"] = "; ".join(f"{k}: {why}" for k, why in cs.flags.items())
            row.update({"extrap_fit_upto": ex["fit_upto"], "extrap_at": ex["at"], "extrap_predicted": ex["predicted"],
                        "extrap_observed": ex["observed"], "extrap_error": ex["error"],
                        "extrap_tolerance": ex["tolerance"],
                        "extrap_passed": "" if ex["passed"] is None else ("pass" if ex["passed"] else "fail"),
                        "extrap_reason": ex.get("reason", "")})
            out.append(row)
    return out


def _curve_cell(r: dict, k: str, spec: str, scale: float = 1.0) -> str:
    v, lo, hi = (scale * r[k], scale * r[f"{k}_lo"], scale * r[f"{k}_hi"])
    text = f"{v:{spec}} [{lo:{spec}}, {hi:{spec}}]" if np.isfinite(lo) else f"{v:{spec}}"
    return text + (" (unidentified)" if f"{k}:" in r["unidentified"] else "")


def compute_curves_markdown(study: Study, rows: list[dict]) -> list[str]:
    body = []
    for r in rows:
        name = arm_name(r["algorithm"])
        if "error" in r:
            body.append([name, r["axis"], "—", "—", "—", "—", "—", f"no fit: {r['error']}"])
            continue
        if np.isfinite(r["extrap_error"]):
            ex = (f"{r['extrap_passed']}: {100 * r['extrap_predicted']:.1f} predicted vs {100 * r['extrap_observed']:.1f} "
                  f"observed at {r['extrap_at']:.4g} (fit on C ≤ {r['extrap_fit_upto']:.4g}; error "
                  f"{100 * r['extrap_error']:+.2f})")
        else:
            ex = f"not checked: {r['extrap_reason']}"
        body.append([name, r["axis"], f"{r['seeds']} / {r['n_points']}", f"{100 * r['r0']:.1f}",
                     _curve_cell(r, "a", ".1f", 100.0), _curve_cell(r, "b", ".2f"), _curve_cell(r, "c_mid", ".4g"), ex])
    notes = sorted({n for runs in study.arms.values() for n in axes_of(study, runs)[1]})
    n_boot = next((r["n_boot"] for r in rows if "n_boot" in r), 0)
    tol = next((r["extrap_tolerance"] for r in rows if "extrap_tolerance" in r), TOLERANCE)
    flagged = [f"{arm_name(r['algorithm'])} ({r['axis']}): {r['unidentified']}" for r in rows if r.get("unidentified")]
    return ["## Compute curves (ScaleRL fit)", "",
            "R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) fitted to the mean in-domain greedy accuracy over "
            "seeds; C = samples, training FLOPs where the runs count them, training seconds only for runs flagged "
            "as timed on an uncontended machine. R0 = the accuracy at C = 0 (fixed); bounds A ∈ [R0, 1], "
            "B ∈ [0.05, 20], C_mid ∈ [min C / 100, max C × 100]. Fit: a grid over log B × log C_mid with A in "
            f"closed form, refined by successively finer grids. Intervals: 95% percentile bootstrap over seeds "
            f"({n_boot:,} resamples: seeds with replacement, the mean curve refitted; seeded generator). A "
            "parameter is **unidentified** when its estimate sits on a bound, or more than 2.5% of the bootstrap "
            "refits do (its interval reaches the bound). **Extrapolation check:** fitted on the points with C ≤ half "
            "the last C, predicted at the last (held-out) point; it passes when |predicted − observed| ≤ "
            f"{100 * tol:.1f} accuracy points.", "",
            table(["algorithm", "C", "seeds / points", "R0 (%)", "A (%) [95%]", "B [95%]", "C_mid [95%]",
                   "extrapolation to the held-out last point"], body, style="markdown"), "",
            *[f"- {n}" for n in notes],
            f"- unidentified: {'; '.join(flagged) if flagged else 'none'}", ""]


# --------------------------------------------------------------------------- figures and the report

FIGURES = {
    "fig5_accuracy": "Fig. 5 analogue: greedy accuracy vs samples (FLOPs, uncontended seconds where recorded), every algorithm",
    "fig6_iterative": "Fig. 6 analogue: iterative GRPO vs GRPO (the same data, those two only)",
    "fig7_maj_pass_at_k": "Fig. 7 analogue: Maj@K and Pass@K, K = 1..n, one axis per data set",
    "compute_curves": "Compute curves: mean in-domain accuracy and the fitted R(C) on each compute axis",
}


def _accuracy_panels(study: Study, arms: list[str]) -> list[tuple]:
    panels = []
    for task in [t for t in (study.task, study.ood) if t]:
        for axis in ("samples", "flops", "seconds"):
            series = {a: acc_curves(study.arms[a], task, axis) for a in arms
                      if a in study.arms and axis in axes_of(study, study.arms[a])[0]}
            if series:
                panels.append((f"{task}: accuracy vs {axis}", AXIS_LABELS[axis], series))
    return panels


def figures(study: Study, curve_rows: list[dict]) -> dict:
    """name -> Figure (or None without data) for `FIGURES`."""
    colors = colors_for(study.arms)
    start = per_seed_initial([r for runs in study.arms.values() for r in runs.values()])
    k_panels = [(f"{t}: Maj@K (solid/o) and Pass@K (dotted/^); start dashed", t, study.ks.get(t, 0), start,
                 {a: [r.final_eval for r in runs.values()] for a, runs in study.arms.items()})
                for t in (study.task, study.ood) if t]
    fit_panels = [(f"{study.task}: fitted compute curves vs {axis}", AXIS_LABELS[axis],
                   {r["algorithm"]: (*r["_mean"], r["_fit"]) for r in curve_rows if r["axis"] == axis and "_fit" in r})
                  for axis in ("samples", "flops", "seconds")]
    return {"fig5_accuracy": plot_accuracy(_accuracy_panels(study, list(study.arms)), colors),
            "fig6_iterative": plot_accuracy(_accuracy_panels(study, ["grpo", "grpo_iter"]), colors),
            "fig7_maj_pass_at_k": plot_k(k_panels, colors),
            "compute_curves": plot_fits(fit_panels, colors)}


def figures_markdown(plots: dict) -> list[str]:
    lines = ["## Figures", "",
             "Lines: means over seeds; bands and error bars: 95% t-intervals over seeds. Pass@K is the unbiased "
             "estimator 1 − C(n−c, K)/C(n, K) from n samples per problem; Maj@K is the exact expectation over "
             "all K-subsets of the n samples (not a random draw of subsets); both are averaged over problems.", ""]
    for name, title in FIGURES.items():
        lines += [f"### {title}", "", f"![{name}](plots/{name}.png)" if name in plots else "no data for this figure", ""]
    return lines


def _write_csv(path: Path, rows: list[dict]) -> None:
    keys = [k for k in (rows[0] if rows else {}) if not k.startswith("_")]
    for r in rows[1:]:
        keys += [k for k in r if k not in keys and not k.startswith("_")]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows([{k: _cell(v) for k, v in r.items() if not k.startswith("_")} for r in rows])


def _cell(v):
    """A CSV cell: floats to 10 significant digits (the same bytes on every machine for values
    that agree to that), NaN as empty."""
    if isinstance(v, (float, np.floating)):
        return "" if not np.isfinite(v) else format(float(v), ".10g")
    return v


def build_study_report(sweep_dir, out_dir=None, n_boot: int = N_BOOT, seed: int = 0,
                       design: Design | None = None, selection_dir=None) -> Path:
    """Write the study report of a finished sweep into ``out_dir`` (default
    ``<sweep_dir>/study``): report.md, claims.csv, table5.csv, compute_curves.csv and
    plots/*.png. ``n_boot``/``seed``: the compute curves' bootstrap; ``design``: the claims'
    decision rules (default: `design_of` the sweep.json, `DESIGN` with the sweep file's ``report.cap``);
    ``selection_dir``: the learning-rate selection's runs
    (default: ``<sweep_dir>/selection``, else sweep.json's ``report.selection``; see
    `study_data.find_selection_dir`). Returns the path of report.md."""
    study = load_study(sweep_dir)
    design = design or design_of(study.sweep_json)
    if not study.arms:
        raise FileNotFoundError(f"no finished runs with a seed in {sweep_dir}")
    sel_dir, where = find_selection_dir(sweep_dir, selection_dir, study.sweep_json)
    if sel_dir is not None:
        study.selection = load_selection(sel_dir)
    out = Path(out_dir) if out_dir is not None else Path(sweep_dir) / "study"
    check_output(out, "report --study", "study folder")  # replaced whole: never a folder of someone else's files
    for line in study.bad_records + study.off_setting:  # said on stderr as in the report's header
        print(f"harness report: warning: run {line}: excluded from the study", file=sys.stderr)
    t5, curve_rows, claim_rows = table5(study), compute_curves(study, n_boot, seed), claims(study, design)
    figs = figures(study, curve_rows)
    with staged(out) as stage:  # written beside the old report, moved into place whole
        (stage / "plots").mkdir()
        plots = {}
        for name, fig in figs.items():
            if fig is not None:
                fig.savefig(stage / "plots" / f"{name}.png", format="png", metadata={"Software": None})
                plots[name] = out / "plots" / f"{name}.png"
        _write_csv(stage / "table5.csv", t5)
        _write_csv(stage / "claims.csv", claims_csv_rows(claim_rows))
        _write_csv(stage / "compute_curves.csv", curve_rows)
        lines = (header(study, design) + selection_markdown(study, where) + table5_markdown(study, t5)
                 + guessing_floor_markdown(study, guessing_floors(study)) + figures_markdown(plots)
                 + large_k_markdown(study) + compute_curves_markdown(study, curve_rows)
                 + claims_markdown(claim_rows, design, amendments(study), unknown_retired(study, claim_rows)))
        (stage / "report.md").write_text(md_safe("\n".join(lines)))
    return out / "report.md"
