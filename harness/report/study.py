"""The DeepSeekMath small-study report of one sweep: Table 5, Figs. 5-7, the large-K check, compute curves and the claims.

`build_study_report(sweep_dir, out_dir)` writes ``report.md``, ``claims.csv``, ``table5.csv``,
``compute_curves.csv`` and ``plots/*.png``. Runs are grouped into study arms by
`arm_of` (the algorithm name; GRPO with ``algorithm.ref_reset_every > 0`` is iterative GRPO,
``grpo_iter``), one finished run per seed and arm. Every interval is a two-sided Student-t
interval over seeds (`stats.mean_ci`); every difference between two arms, or between an
arm and its starting checkpoint, is paired by seed (`stats.paired_diff_ci`: the same seed
means the same warm-up and the same prompt order). Every verdict comes from
`stats.verdict` (or the stated rule built on it), never from text written by hand.
"""
from __future__ import annotations

import csv
import os
import platform
from collections import OrderedDict
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from algorithms.presets import DISPLAY_NAMES
from harness.report.aggregate import load_sweep_runs, per_seed_initial
from harness.report.curvefit import study_curves
from harness.report.study_plots import colors_for, plot_accuracy, plot_fits, plot_k
from harness.report.format import plus_minus, table, with_interval
from harness.report.stats import mean_ci, mean_curve, paired_diff_ci, verdict
from harness.rundir.layout import read_json
from harness.rundir.read import RunData, is_number, k_of, split_metric

ARM_ORDER = ("grpo", "grpo_ps", "rft", "ppo", "grpo_iter", "dr_grpo", "rloo")
LEVEL = 0.95


@dataclass
class Study:
    """The finished runs of a sweep by arm and seed, and what the report needs to know about them."""
    sweep_dir: Path
    arms: "OrderedDict[str, dict[int, RunData]]"
    task: str
    ood: Optional[str]
    ks: dict = field(default_factory=dict)          # task -> largest K evaluated
    excluded: list = field(default_factory=list)     # "run_id (reason)"
    sweep_json: dict = field(default_factory=dict)


def arm_of(run: RunData) -> str:
    """The study arm of a run: its algorithm name (``grpo_iter`` for the iterative-GRPO preset),
    or ``<name>_iter`` for an algorithm run with ``algorithm.ref_reset_every > 0`` (so GRPO with
    reference resets is ``grpo_iter`` too)."""
    if run.algorithm.endswith("_iter"):
        return run.algorithm
    alg = run.config.get("algorithm")
    reset = alg.get("ref_reset_every") if isinstance(alg, dict) else None
    return f"{run.algorithm}_iter" if is_number(reset) and reset > 0 else run.algorithm


def load_study(sweep_dir) -> Study:
    """Finished runs grouped by arm and seed (a second finished run of an arm and seed, or a
    run without a seed, is excluded and listed); the in-domain task (the runs' configured
    task), the out-of-domain one (an evaluated task named ``*_ood``) and the largest K."""
    sweep_dir = Path(sweep_dir)
    runs = load_sweep_runs(sweep_dir)
    arms: dict[str, dict[int, RunData]] = {}
    excluded = []
    for r in runs:
        arm = arm_of(r)
        if r.status != "finished":
            excluded.append(f"{r.run_id} ({r.status})")
        elif r.seed is None or r.seed in arms.get(arm, {}):
            excluded.append(f"{r.run_id} (no seed, or a second run of {arm} seed {r.seed})")
        else:
            arms.setdefault(arm, {})[r.seed] = r
    order = [a for a in ARM_ORDER if a in arms] + sorted(a for a in arms if a not in ARM_ORDER)
    done = [r for a in order for r in arms[a].values()]
    task = done[0].task if done else "arith"
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
                 task=task, ood=ood, ks=ks, excluded=excluded, sweep_json=sweep_json)


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


# --------------------------------------------------------------------------- where the time went


def run_seconds(r: RunData) -> dict:
    """Seconds of one run by phase. ``warmup``: building the supervised warm-up (summary
    ``setup_seconds.warmup_build``; older summaries: ``warmup_seconds``, or ``start.seconds``
    when this run trained it rather than loading the cache); ``warmup_wait``: waiting for a
    warm-up another run builds; ``train``: the budget counter ``seconds``; ``eval``: the start
    evaluation (``setup_seconds.initial_eval``) plus the evaluation rows' ``eval/<task>/seconds``
    (all of them without ``setup_seconds``); ``wall``: ``ended - started``, else
    ``wall_seconds`` plus the setup; ``other`` = wall - the rest."""
    setup = {k: float(v) for k, v in (r.summary.get("setup_seconds") or {}).items() if is_number(v)}
    start = r.summary.get("start") or {}
    if setup:
        warm, wait = setup.get("warmup_build", 0.0), setup.get("warmup_wait", 0.0)
    else:
        warm, wait = r.summary.get("warmup_seconds"), 0.0
        if not is_number(warm):
            warm = start.get("seconds") if start.get("cached") is False and is_number(start.get("seconds")) else 0.0
    ev = sum(float(v) for row in r.rows for k, v in row.items()
             if k.startswith("eval/") and k.endswith("/seconds") and is_number(v)
             and not (setup and not (r.counter(row) or 0) > 0))
    ev += setup.get("initial_eval", 0.0)
    t0, t1 = r.summary.get("started"), r.summary.get("ended")
    wall = float(t1 - t0) if is_number(t0) and is_number(t1) else (
        r.wall_seconds + sum(setup.values()) if r.wall_seconds is not None else None)
    out = {"warmup": float(warm), "warmup_wait": float(wait), "train": float(r.train_seconds or 0.0),
           "eval": float(ev), "wall": wall}
    out["other"] = max(0.0, wall - sum(out[k] for k in ("warmup", "warmup_wait", "train", "eval"))) \
        if wall is not None else None
    return out


def time_summary(study: Study) -> dict:
    """Sums over runs of `run_seconds`; the sweep's wall-clock from sweep.json
    (``started``/``start`` to ``finished``/``ended``/``updated``) when it records both, else the
    span from the first run's ``started`` to the last run's ``ended`` (summaries)."""
    keys = ("warmup", "warmup_wait", "train", "eval", "other", "wall")
    tot = {k: 0.0 for k in keys}
    tot["runs"], starts, ends = 0, [], []
    for runs in study.arms.values():
        for r in runs.values():
            s = run_seconds(r)
            tot["runs"] += 1
            for k in keys:
                tot[k] += s[k] or 0.0
            starts += [r.summary["started"]] if is_number(r.summary.get("started")) else []
            ends += [r.summary["ended"]] if is_number(r.summary.get("ended")) else []
    sj = study.sweep_json
    t0 = next((sj[k] for k in ("started", "start", "started_at") if is_number(sj.get(k))), None)
    t1 = next((sj[k] for k in ("finished", "ended", "end", "updated") if is_number(sj.get(k))), None)
    tot["sweep_wall"], tot["sweep_wall_from"] = None, None
    if t0 is not None and t1 is not None and t1 >= t0:
        tot["sweep_wall"], tot["sweep_wall_from"] = float(t1 - t0), "sweep.json"
    elif starts and ends and max(ends) >= min(starts):
        tot["sweep_wall"], tot["sweep_wall_from"] = float(max(ends) - min(starts)), "first run start to last run end"
    return tot


def header(study: Study, out_dir: Path) -> list[str]:
    """The report's opening: the command, the machine, seeds, interval method and the time."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    seeds = "; ".join(f"{a}: {len(rs)} ({', '.join(str(s) for s in rs)})" for a, rs in study.arms.items())
    t = time_summary(study)
    sweep_wall = f"{t['sweep_wall']:.0f} s ({t['sweep_wall_from']})" if t["sweep_wall"] is not None else \
        "not recorded (no start and end time in sweep.json or the summaries)"
    lines = [
        f"# DeepSeekMath small study: {study.sweep_dir.name}", "",
        f"- **Command:** `harness report {study.sweep_dir} --study --output-dir {out_dir}`",
        f"- **Machine that built this report:** {platform.platform()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, torch {torch_version}",
        f"- **Seeds per algorithm (finished runs):** {seeds or 'none'}",
        f"- **In-domain set:** `{study.task}`; **out-of-domain set:** `{study.ood or 'not evaluated'}`",
        "- **Intervals:** 95% two-sided Student-t over seeds (t_{0.975, n-1} · s / √n); differences "
        "between two arms, or an arm and its start, are paired by seed (same seed = same warm-up and "
        "prompt order) and their interval is the t-interval of the per-seed differences.",
        f"- **Where the time went** (sum over {t['runs']} runs): warm-up {t['warmup']:.0f} s (plus "
        f"{t['warmup_wait']:.0f} s waiting for a shared warm-up), RL training {t['train']:.0f} s, evaluation "
        f"{t['eval']:.0f} s, other {t['other']:.0f} s; runs' wall-clock {t['wall']:.0f} s; the sweep's "
        f"wall-clock: {sweep_wall}.",
    ]
    if study.excluded:
        lines.append(f"- **Excluded runs:** {', '.join(study.excluded)}")
    return lines + [""]


# --------------------------------------------------------------------------- Table 5


def table5(study: Study) -> list[dict]:
    """Per arm: greedy accuracy (%) at the start and after RL, in-domain and out-of-domain,
    mean and CI over seeds, and the paired gain."""
    rows = []
    for arm, runs in study.arms.items():
        row = {"algorithm": arm, "seeds": len(runs)}
        for prefix, task in (("id", study.task), ("ood", study.ood)):
            key = f"{task}/acc"
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
    heads = ["algorithm", "seeds", f"{study.task} start", f"{study.task} after RL", "paired gain",
             f"{study.ood or 'OOD'} start", f"{study.ood or 'OOD'} after RL", "paired gain"]
    body = []
    for r in rows:
        cells = [DISPLAY_NAMES.get(r["algorithm"], r["algorithm"]), r["seeds"]]
        for p in ("id", "ood"):
            gain = {"mean": r[f"{p}_gain_mean"], "lo": r[f"{p}_gain_lo"], "hi": r[f"{p}_gain_hi"],
                    "n": r[f"{p}_gain_n"], "half": r[f"{p}_gain_hi"] - r[f"{p}_gain_mean"]}
            cells += [plus_minus(r[f"{p}_start_mean"], r[f"{p}_start_ci95"]),
                      plus_minus(r[f"{p}_after_mean"], r[f"{p}_after_ci95"]), with_interval(gain)]
        body.append(cells)
    return ["## Table 5 analogue: greedy accuracy before and after RL (%)", "",
            "Mean ± 95% CI over seeds; the start is each arm's own starting checkpoint (its runs' "
            "`initial_eval`); the gain is paired by seed, shown as mean [95% CI] in points.", "",
            table(heads, body, style="markdown"), ""]


# --------------------------------------------------------------------------- large-K check


def _cross(start: list, arm: list, ks: list) -> object:
    """The smallest K at which start > arm, when start <= arm at K = 1; 'from K=1' when the
    start is above already at K = 1; None when it never crosses."""
    if start[0] > arm[0]:
        return "from K=1"
    return next((k for k, s, a in zip(ks, start, arm) if s > a), None)


def large_k_check(study: Study, task: str) -> list[dict]:
    """Per arm: does the start's pass@K cross above the arm's as K grows, and at which K, on
    the means over seeds and per seed; and the paired pass@n difference arm - start."""
    n = study.ks.get(task)
    out = []
    if not n:
        return out
    ks = list(range(1, n + 1))
    for arm, runs in study.arms.items():
        fin = {k: per_seed(runs, final(f"{task}/pass@{k}")) for k in ks}
        ini = {k: per_seed(runs, initial(f"{task}/pass@{k}")) for k in ks}
        seeds = sorted(set.intersection(*[set(fin[k]) & set(ini[k]) for k in ks]))
        if not seeds:
            out.append({"algorithm": arm, "n": n, "seeds": [], "mean_cross": None, "per_seed": {}, "diff_at_n": None})
            continue
        ms = [float(np.mean([ini[k][s] for s in seeds])) for k in ks]
        ma = [float(np.mean([fin[k][s] for s in seeds])) for k in ks]
        per = {s: _cross([ini[k][s] for k in ks], [fin[k][s] for k in ks], ks) for s in seeds}
        d = paired_diff_ci({s: 100 * fin[n][s] for s in seeds}, {s: 100 * ini[n][s] for s in seeds}, LEVEL)
        out.append({"algorithm": arm, "n": n, "seeds": seeds, "mean_cross": _cross(ms, ma, ks), "per_seed": per,
                    "diff_at_n": d, "start_mean": ms, "arm_mean": ma})
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
        body = [[DISPLAY_NAMES.get(r["algorithm"], r["algorithm"]), len(r["seeds"]), _k_text(r["mean_cross"]),
                 ", ".join(f"s{s}: {_k_text(k)}" for s, k in r["per_seed"].items()) or "—",
                 with_interval(r["diff_at_n"]) if r["diff_at_n"] else "no data"] for r in rows]
        lines += [f"**`{task}`** (K = 1..{rows[0]['n']})", "",
                  table(["algorithm", "seeds", "crossing K (means)", "crossing K per seed",
                         f"pass@{rows[0]['n']} arm − start"], body, style="markdown"), ""]
    return lines


def _k_text(k) -> str:
    return "never" if k is None else str(k)


# --------------------------------------------------------------------------- compute curves


def acc_curves(runs: dict, task: str, xkey: str) -> list[tuple]:
    """Per seed, ``(x, accuracy)`` at the run's evaluation rows, x the counter ``xkey``
    (``samples`` or ``seconds``); without evaluation rows, the summary's start and end."""
    key = f"eval/{task}/acc"
    curves = []
    for r in runs.values():
        pts = [(row[xkey], row[key]) for row in r.rows if is_number(row.get(key)) and is_number(row.get(xkey))]
        if not pts:
            end = ((r.summary.get("budget") or {}).get("consumed") or {}).get(xkey)
            pts = [(0.0, r.initial_eval.get(f"{task}/acc")), (end, r.final_eval.get(f"{task}/acc"))]
            pts = [(x, y) for x, y in pts if is_number(x) and is_number(y)]
        if pts:
            curves.append((np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)))
    return curves


def compute_curves(study: Study, n_boot: int = 200, seed: int = 0) -> list[dict]:
    """Per arm and compute axis (samples, seconds): the ScaleRL fit of the in-domain mean
    accuracy curve, bootstrap intervals and the extrapolation check (`curvefit.study_curves`)."""
    out = []
    for arm, runs in study.arms.items():
        for axis in ("samples", "seconds"):
            row = {"algorithm": arm, "axis": axis}
            try:
                cs = study_curves(acc_curves(runs, study.task, axis), n_boot=n_boot, seed=seed, level=LEVEL)
            except ValueError as e:
                out.append({**row, "error": str(e)})
                continue
            f, ex = cs.fit, cs.extrapolation
            mc = mean_curve(acc_curves(runs, study.task, axis))
            row.update({"_fit": f, "_mean": (mc[0], mc[1])})
            row.update({"seeds": cs.n_seeds, "r0": f.r0, "a": f.a, "b": f.b, "c_mid": f.c_mid, "n_boot": cs.n_boot,
                        "sse": f.sse, "n_points": f.n_points, "extrap_at": ex["at"], "extrap_fit_upto": ex["fit_upto"],
                        "extrap_predicted": ex["predicted"], "extrap_observed": ex["observed"],
                        "extrap_error": ex["error"], "extrap_reason": ex.get("reason", "")})
            for k in ("a", "b", "c_mid"):
                lo, hi = cs.intervals.get(k, (float("nan"), float("nan")))
                row.update({f"{k}_lo": lo, f"{k}_hi": hi})
            out.append(row)
    return out


def compute_curves_markdown(rows: list[dict]) -> list[str]:
    body = []
    for r in rows:
        name = DISPLAY_NAMES.get(r["algorithm"], r["algorithm"])
        if "error" in r:
            body.append([name, r["axis"], "—", "—", "—", "—", f"no fit: {r['error']}"])
            continue
        iv = lambda k, s, v=r: f"{v[k]:{s}} [{v[k + '_lo']:{s}}, {v[k + '_hi']:{s}}]" if np.isfinite(v[k + "_lo"]) \
            else f"{v[k]:{s}}"
        ex = (f"{100 * r['extrap_predicted']:.1f} vs {100 * r['extrap_observed']:.1f} "
              f"(error {100 * r['extrap_error']:+.2f})" if np.isfinite(r["extrap_error"]) else r["extrap_reason"])
        a = {k: 100 * r[k] for k in ("a", "a_lo", "a_hi")}
        body.append([name, r["axis"], f"{100 * r['r0']:.1f}", iv("a", ".1f", a), iv("b", ".2f"), iv("c_mid", ".4g"), ex])
    return ["## Compute curves (ScaleRL fit)", "",
            "R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) fitted to the mean in-domain greedy accuracy over "
            "seeds, C = samples or training seconds; R0 = the accuracy at C = 0 (fixed), A ∈ [R0, 1]. Fit: a "
            "grid over B and C_mid with A in closed form, then a Nelder-Mead refine. Intervals: 95% "
            "percentile bootstrap over seeds (seeds resampled with replacement, mean curve refitted, "
            "seeded RNG). Extrapolation: fitted on the points with C ≤ half the final C, predicted at the "
            "final C, vs the observed mean there (accuracy in %, error in points).", "",
            table(["algorithm", "C", "R0 (%)", "A (%) [95%]", "B [95%]", "C_mid [95%]",
                   "extrapolated final vs observed"], body, style="markdown"), ""]


# --------------------------------------------------------------------------- claims

RULE_SIMPLE = ("reproduced when the paired 95% CI of the difference lies wholly on the expected side of 0, "
               "contradicted when it lies wholly on the other side, otherwise (or with fewer than 2 pairs) "
               "inconclusive (`stats.verdict`)")
RULE_MAJ_PASS = ("reproduced when the paired CI of the maj@n gain (after RL − start) lies wholly above 0 and the "
                 "CI of the pass@n gain does not (it includes 0 or lies below); contradicted when the pass@n gain's "
                 "CI lies wholly above 0 or the maj@n gain's wholly below 0; otherwise inconclusive")


def maj_pass_verdict(maj: dict, pas: dict) -> str:
    """The verdict on 'RL lifts Maj@K but not Pass@K' from the paired gains at K = n."""
    vm, vp = verdict(maj, 1), verdict(pas, 1)
    if vp == "reproduced" or vm == "contradicted":
        return "contradicted"
    return "reproduced" if vm == "reproduced" else "inconclusive"


def _claim(study: Study, cid: str, claim: str, comparison: str, parts: list[tuple], rule, rule_text: str) -> dict:
    """One claim: ``parts`` = ``(what, arm_a, value_a, arm_b, value_b, scale, unit)``, each a
    paired difference ``scale * (value_a(run of arm_a) - value_b(run of arm_b))`` by seed;
    ``rule(diffs) -> verdict``. An arm not in the sweep makes the row 'not run'."""
    row = {"id": cid, "claim": claim, "comparison": comparison, "rule": rule_text, "parts": []}
    missing = sorted({p[i] for p in parts for i in (1, 3) if p[i] not in study.arms})
    if missing:
        return {**row, "not_run": missing, "verdict": "inconclusive"}
    for what, arm_a, va, arm_b, vb, scale, unit in parts:
        d = paired_diff_ci(per_seed(study.arms[arm_a], va, scale), per_seed(study.arms[arm_b], vb, scale), LEVEL)
        row["parts"].append({**d, "what": what, "unit": unit})
    return {**row, "not_run": [], "verdict": rule(row["parts"])}


def _policy_sizes(study: Study, arms: tuple) -> str:
    sizes = []
    for a in arms:
        vals = {(r.summary.get("params") or {}).get("policy") for r in study.arms.get(a, {}).values()}
        sizes.append(f"{a} {', '.join(str(v) for v in sorted(vals, key=str))}")
    return "policy parameters: " + "; ".join(sizes)


def claims(study: Study) -> list[dict]:
    """The six claims of the study, each with its paired differences and verdict."""
    t, o, n = study.task, study.ood or f"{study.task}_ood", study.ks.get(study.task, 0)
    acc, simple = f"{t}/acc", (lambda parts: verdict(parts[0], 1))
    return [
        _claim(study, "1", "GRPO+PS > GRPO+OS", f"grpo_ps − grpo: final {acc} (points)",
               [(acc, "grpo_ps", final(acc), "grpo", final(acc), 100.0, "points")], simple, RULE_SIMPLE),
        _claim(study, "2", "GRPO > online RFT", f"grpo − rft: final {acc} (points)",
               [(acc, "grpo", final(acc), "rft", final(acc), 100.0, "points")], simple, RULE_SIMPLE),
        _claim(study, "3", "RL lifts Maj@K but not Pass@K (GRPO)",
               f"grpo after RL − its start: {t}/maj@{n} and {t}/pass@{n} (points)",
               [(f"maj@{n}", "grpo", final(f"{t}/maj@{n}"), "grpo", initial(f"{t}/maj@{n}"), 100.0, "points"),
                (f"pass@{n}", "grpo", final(f"{t}/pass@{n}"), "grpo", initial(f"{t}/pass@{n}"), 100.0, "points")],
               lambda p: maj_pass_verdict(*p), RULE_MAJ_PASS),
        _claim(study, "4", "Iterative RL helps (iterative GRPO > GRPO)", f"grpo_iter − grpo: final {acc} (points)",
               [(acc, "grpo_iter", final(acc), "grpo", final(acc), 100.0, "points")], simple, RULE_SIMPLE),
        _claim(study, "5", "GRPO needs less memory than PPO at equal policy size",
               f"grpo − ppo: peak RSS (MiB; expected < 0); {_policy_sizes(study, ('grpo', 'ppo'))}",
               [("peak rss_mb", "grpo", peak_rss, "ppo", peak_rss, 1.0, "MiB")],
               lambda parts: verdict(parts[0], -1), RULE_SIMPLE + "; expected side: below 0"),
        _claim(study, "6", "RL improves out-of-domain too (GRPO)", f"grpo after RL − its start: {o}/acc (points)",
               [(f"{o}/acc", "grpo", final(f"{o}/acc"), "grpo", initial(f"{o}/acc"), 100.0, "points")],
               simple, RULE_SIMPLE),
    ]


def claims_csv_rows(rows: list[dict]) -> list[dict]:
    """One CSV row per paired difference of each claim (a 'not run' claim: one row without numbers)."""
    out = []
    for c in rows:
        base = {"id": c["id"], "claim": c["claim"], "comparison": c["comparison"], "verdict": c["verdict"]}
        if c["not_run"] or not c["parts"]:
            out.append({**base, "what": "not run: " + ", ".join(c["not_run"]), "unit": "", "mean_diff": "",
                        "ci95_lo": "", "ci95_hi": "", "ci95_half": "", "n_pairs": 0, "seeds": ""})
            continue
        for p in c["parts"]:
            out.append({**base, "what": p["what"], "unit": p["unit"], "mean_diff": p["mean"], "ci95_lo": p["lo"],
                        "ci95_hi": p["hi"], "ci95_half": p["half"], "n_pairs": p["n"],
                        "seeds": " ".join(str(s) for s in p["seeds"])})
    return out


def claims_markdown(rows: list[dict]) -> list[str]:
    body = []
    for c in rows:
        if c["not_run"]:
            body.append([c["claim"], c["comparison"], f"not run ({', '.join(c['not_run'])})", "—", 0, c["verdict"]])
            continue
        many = len(c["parts"]) > 1
        lab = lambda p: f"{p['what']}: " if many else ""
        mean = "; ".join(lab(p) + (f"{p['mean']:+.2f}" if p["n"] else "no data") for p in c["parts"])
        ci = "; ".join(lab(p) + (f"[{p['lo']:+.2f}, {p['hi']:+.2f}]" if np.isfinite(p["half"]) else "—")
                       for p in c["parts"])
        body.append([c["claim"], c["comparison"], mean, ci, "; ".join(str(p["n"]) for p in c["parts"]), c["verdict"]])
    by_rule: dict[str, list[str]] = {}
    for c in rows:
        by_rule.setdefault(c["rule"], []).append(c["id"])
    rules = [f"- claim{'s' if len(ids) > 1 else ''} {', '.join(ids)}: {rule}" for rule, ids in by_rule.items()]
    return ["## Claims", "",
            "Verdicts are computed from the data: paired by seed, 95% two-sided t-interval of the per-seed "
            "differences. Differences in accuracy points (× 100) unless marked MiB.", "",
            table(["claim", "comparison", "paired mean diff", "95% CI", "n pairs", "verdict"], body, style="markdown"),
            "", "Verdict rules:", *rules, ""]


# --------------------------------------------------------------------------- figures and the report

FIGURES = {
    "fig5_accuracy": "Fig. 5 analogue: greedy accuracy vs samples and vs training seconds, every algorithm",
    "fig6_iterative": "Fig. 6 analogue: iterative GRPO vs GRPO (the same data, those two only)",
    "fig7_maj_pass_at_k": "Fig. 7 analogue: Maj@K and Pass@K, K = 1..n, one axis per data set",
    "compute_curves": "Compute curves: mean in-domain accuracy and the fitted R(C), vs samples and vs seconds",
}


def _accuracy_panels(study: Study, arms: list[str]) -> list[tuple]:
    panels = []
    for task in [t for t in (study.task, study.ood) if t]:
        for axis, xlabel in (("samples", "samples (completions drawn)"),
                             ("seconds", "training wall-clock seconds (budget counter; evaluation excluded)")):
            series = {a: acc_curves(study.arms[a], task, axis) for a in arms if a in study.arms}
            panels.append((f"{task}: accuracy vs {axis}", xlabel, series))
    return panels


def figures(study: Study, curve_rows: list[dict]) -> dict:
    """name -> Figure (or None without data) for `FIGURES`."""
    colors = colors_for(study.arms)
    start = per_seed_initial([r for runs in study.arms.values() for r in runs.values()])
    k_panels = [(f"{t}: Maj@K (solid/o) and Pass@K (dotted/^); start dashed", t, study.ks.get(t, 0), start,
                 {a: [r.final_eval for r in runs.values()] for a, runs in study.arms.items()})
                for t in (study.task, study.ood) if t]
    fit_panels = [(f"{study.task}: fitted compute curves vs {axis}", axis,
                   {r["algorithm"]: (*r["_mean"], r["_fit"]) for r in curve_rows if r["axis"] == axis and "_fit" in r})
                  for axis in ("samples", "seconds")]
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
        w.writerows(rows)


def build_study_report(sweep_dir, out_dir=None, n_boot: int = 200, seed: int = 0) -> Path:
    """Write the study report of a finished sweep into ``out_dir`` (default
    ``<sweep_dir>/study``): report.md, claims.csv, table5.csv, compute_curves.csv and
    plots/*.png. Returns the path of report.md."""
    study = load_study(sweep_dir)
    if not study.arms:
        raise FileNotFoundError(f"no finished runs with a seed in {sweep_dir}")
    out = Path(out_dir) if out_dir is not None else Path(sweep_dir) / "study"
    (out / "plots").mkdir(parents=True, exist_ok=True)
    t5, curve_rows, claim_rows = table5(study), compute_curves(study, n_boot, seed), claims(study)
    plots = {}
    for name, fig in figures(study, curve_rows).items():
        if fig is not None:
            fig.savefig(out / "plots" / f"{name}.png", format="png")
            plots[name] = out / "plots" / f"{name}.png"
    _write_csv(out / "table5.csv", t5)
    _write_csv(out / "claims.csv", claims_csv_rows(claim_rows))
    _write_csv(out / "compute_curves.csv", curve_rows)
    lines = (header(study, out) + table5_markdown(study, t5) + figures_markdown(plots) + large_k_markdown(study)
             + compute_curves_markdown(curve_rows) + claims_markdown(claim_rows))
    (out / "report.md").write_text("\n".join(lines))
    return out / "report.md"
