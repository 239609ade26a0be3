"""The DeepSeekMath small-study report of one sweep: Table 5, Figs. 5-7, the large-K check, compute curves and the claims' verdicts.

`build_study_report(sweep_dir, out_dir)` writes ``report.md``, ``claims.csv``, ``table5.csv``,
``compute_curves.csv`` and ``plots/*.png``. Runs are grouped into study arms by
`study_data.arm_of`, one finished run per seed and arm. Table 5 and the figures show
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
from importlib import metadata
from pathlib import Path

import numpy as np

from harness.report.aggregate import per_seed_initial
from harness.report.build import provenance_lines
from harness.report.curvefit import N_BOOT, TOLERANCE, study_curves
from harness.report.decisions import Design
from harness.report.format import plus_minus, table, with_interval
from harness.report.stats import mean_ci, mean_curve, paired_diff_ci
from harness.report.study_claims import claims, claims_csv_rows, claims_markdown
from harness.report.study_data import (Study, acc_curves, arm_name, axes_of, final, initial, load_study, per_seed,
                                       uncontended)
from harness.report.study_plots import colors_for, plot_accuracy, plot_fits, plot_k
from harness.rundir.read import RunData, is_number

__all__ = ["build_study_report", "load_study", "table5", "large_k_check", "compute_curves", "run_seconds",
           "time_summary", "Design"]

LEVEL = 0.95
DESIGN = Design()
"""The study's pre-stated decision rules (docs/study.md)."""


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


def header(study: Study, design: Design) -> list[str]:
    """The report's opening: the command, the runs' provenance, seeds, methods and the time
    (nothing of the machine that builds the report but the statistics' library versions)."""
    seeds = "; ".join(f"{a}: {len(rs)} ({', '.join(str(s) for s in rs)})" for a, rs in study.arms.items())
    t = time_summary(study)
    sweep_wall = f"{t['sweep_wall']:.0f} s ({t['sweep_wall_from']})" if t["sweep_wall"] is not None else \
        "not recorded (no start and end time in sweep.json or the summaries)"
    timed = [r for r in study.runs() if uncontended(r, study.sweep_json)]
    lines = [
        f"# DeepSeekMath small study: {study.sweep_dir.name}", "",
        f"- **Command:** `harness report <sweep folder {study.sweep_dir.name}> --study --output-dir <folder>`",
        "- **Runs' provenance:** " + "; ".join(line.removeprefix("provenance: ")
                                               for line in provenance_lines(study.runs())),
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
        f"{t['eval']:.0f} s, other {t['other']:.0f} s; runs' wall-clock {t['wall']:.0f} s; the sweep's "
        f"wall-clock: {sweep_wall}. Timed on an uncontended machine: {len(timed)} of {len(study.runs())} runs "
        "(the others' seconds are not used as a compute axis).",
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
        cells = [arm_name(r["algorithm"]), r["seeds"]]
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
        body = [[arm_name(r["algorithm"]), len(r["seeds"]), _k_text(r["mean_cross"]),
                 ", ".join(f"s{s}: {_k_text(k)}" for s, k in r["per_seed"].items()) or "—",
                 with_interval(r["diff_at_n"]) if r["diff_at_n"] else "no data"] for r in rows]
        lines += [f"**`{task}`** (K = 1..{rows[0]['n']})", "",
                  table(["algorithm", "seeds", "crossing K (means)", "crossing K per seed",
                         f"pass@{rows[0]['n']} arm − start"], body, style="markdown"), ""]
    return lines


def _k_text(k) -> str:
    return "never" if k is None else str(k)


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
                       design: Design | None = None) -> Path:
    """Write the study report of a finished sweep into ``out_dir`` (default
    ``<sweep_dir>/study``): report.md, claims.csv, table5.csv, compute_curves.csv and
    plots/*.png. ``n_boot``/``seed``: the compute curves' bootstrap; ``design``: the claims'
    decision rules (default `DESIGN`). Returns the path of report.md."""
    design = design or DESIGN
    study = load_study(sweep_dir)
    if not study.arms:
        raise FileNotFoundError(f"no finished runs with a seed in {sweep_dir}")
    out = Path(out_dir) if out_dir is not None else Path(sweep_dir) / "study"
    (out / "plots").mkdir(parents=True, exist_ok=True)
    t5, curve_rows, claim_rows = table5(study), compute_curves(study, n_boot, seed), claims(study, design)
    plots = {}
    for name, fig in figures(study, curve_rows).items():
        if fig is not None:
            fig.savefig(out / "plots" / f"{name}.png", format="png", metadata={"Software": None})
            plots[name] = out / "plots" / f"{name}.png"
    _write_csv(out / "table5.csv", t5)
    _write_csv(out / "claims.csv", claims_csv_rows(claim_rows))
    _write_csv(out / "compute_curves.csv", curve_rows)
    lines = (header(study, design) + table5_markdown(study, t5) + figures_markdown(plots) + large_k_markdown(study)
             + compute_curves_markdown(study, curve_rows) + claims_markdown(claim_rows, design))
    (out / "report.md").write_text("\n".join(lines))
    return out / "report.md"
