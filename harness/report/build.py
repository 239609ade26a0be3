"""`harness report RESULTS_DIR/<sweep> [--out DIR]`: paper-style comparison of a sweep.

Writes ``report.md``, ``report.html`` (plots embedded as base64 PNG, so the file stands
alone), ``table.csv`` (the aggregate table), ``runs.csv`` (one row per run) and
``plots/*.png`` into ``--out`` (default ``<sweep>/report/``).

The table has one row for the starting checkpoint and one per algorithm (per algorithm
*and* config, when a sweep holds several configs of one algorithm: the label then names the
keys that differ). Columns: greedy accuracy per task, maj@K and pass@K at the largest K
evaluated, peak memory, wall-clock and budget consumed.

Statistics: each cell is the mean over seeds ± the half-width of a two-sided 95% Student-t
confidence interval, ``t_{0.975, n-1} * s / sqrt(n)`` with ``s`` the sample standard
deviation (ddof=1) over the ``n`` runs (seeds) of that row. With a single seed the value is
shown alone (no interval). Only runs with status ``finished`` enter the aggregates; failed
(and still-running) runs are listed in the runs table, marked, and excluded. The starting
checkpoint row uses each run's ``initial_eval`` (evaluation before any RL update): runs that
share a seed start from the same checkpoint, so their initial evaluations are averaged
per seed first and the interval is over seeds. A metric a run did not log (e.g. pass@k of a
run evaluated greedily only) is left out of that cell's mean; a cell with no value shows "—".
"""
from __future__ import annotations

import base64
import html
import io
import math
import os
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Optional

import numpy as np

from harness.rundir.read import RunData, flatten, is_run_dir, k_of, load_run, split_metric

STAT_NOTE = ("mean ± 95% CI over seeds (two-sided Student-t, n-1 dof: t·s/√n); a single seed "
             "shows the value alone; failed/unfinished runs are excluded")

# ---------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """CDF of Student's t distribution."""
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Inverse CDF of Student's t (bisection; no scipy needed)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def mean_ci(values, level: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width of the two-sided t-interval, n) over the finite values; the
    half-width is NaN for n < 2, everything is NaN for n = 0."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    n = int(v.size)
    if n == 0:
        return float("nan"), float("nan"), 0
    mean = float(v.mean())
    if n < 2:
        return mean, float("nan"), n
    half = t_quantile(0.5 + level / 2.0, n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
    return mean, half, n


# ---------------------------------------------------------------------------------------------
# loading and grouping
# ---------------------------------------------------------------------------------------------
_IGNORED_CFG = ("seed", "name", "output_dir", "device", "tracking.", "train.threads", "warmup.cache_dir")


def _ignored(key: str) -> bool:
    return key.endswith("seed") or any(key == p or (p.endswith(".") and key.startswith(p)) for p in _IGNORED_CFG)


def load_sweep(sweep_dir: str | os.PathLike) -> list[RunData]:
    """The runs directly under a sweep directory (``<output_dir>/<name>/``)."""
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
        flat = [{k: v for k, v in flatten(r.config).items() if not _ignored(k)} for r in rs]
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


def _per_seed_initial(runs: list[RunData]) -> list[dict[str, float]]:
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
    cols += ["wall_seconds", "train_seconds", "budget_consumed"]
    return cols


def _run_values(r: RunData) -> dict[str, Optional[float]]:
    v: dict[str, Optional[float]] = dict(r.final_eval)
    p = r.peak
    v.update({"peak_rss_mb": p["rss_mb"], "peak_rss_above_base_mb": p["rss_above_base_mb"],
              "peak_cuda_mb": p["cuda_mb"], "wall_seconds": r.wall_seconds,
              "train_seconds": r.train_seconds, "budget_consumed": r.budget_consumed})
    return v


def build_table(runs: list[RunData]):
    """The aggregate table: index = 'start' + group labels; columns = MultiIndex
    (metric, stat) with stat in mean | ci95 | n. ``df.attrs`` carries budget_unit, tasks, ks."""
    import pandas as pd

    done = [r for r in runs if r.status == "finished"]
    tasks, ks = _tasks_and_ks(done)
    cols = _metric_columns(tasks, ks, done)
    groups = group_runs(done)
    rows: "OrderedDict[str, dict]" = OrderedDict()
    seeds = _per_seed_initial(done)
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


# ---------------------------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------------------------
def display_name(metric: str, unit: str = "steps") -> str:
    names = {"peak_rss_mb": "peak RSS (MB)", "peak_rss_above_base_mb": "RSS above base (MB)",
             "peak_cuda_mb": "peak CUDA (MB)", "wall_seconds": "wall-clock (s)",
             "train_seconds": "train time (s)", "budget_consumed": f"budget ({unit})", "seeds": "n"}
    if metric in names:
        return names[metric]
    task, m = split_metric(metric)
    return f"{task} {m} (%)"


def _is_pct(metric: str) -> bool:
    return "/" in metric


def format_cell(metric: str, mean: float, half: float) -> str:
    if mean is None or not np.isfinite(mean):
        return "—"
    if metric == "seeds":
        return str(int(mean))
    if _is_pct(metric):
        scale, fmt = 100.0, "{:.1f}"
    elif metric.endswith("_mb"):
        scale, fmt = 1.0, "{:.0f}"
    elif metric == "budget_consumed":
        scale, fmt = 1.0, ("{:.0f}" if float(mean).is_integer() else "{:.1f}")
    else:
        scale, fmt = 1.0, "{:.1f}"
    s = fmt.format(mean * scale)
    if half is not None and np.isfinite(half) and not (metric == "budget_consumed" and half == 0):
        s += " ± " + (fmt if metric != "budget_consumed" else "{:.1f}").format(half * scale)
    return s


def formatted_table(df):
    """The table as strings with display headers (what the Markdown/HTML/terminal show)."""
    import pandas as pd

    unit = df.attrs.get("budget_unit", "steps")
    metrics = list(dict.fromkeys(df.columns.get_level_values(0)))
    out = pd.DataFrame(index=df.index)
    for m in metrics:
        out[display_name(m, unit)] = [format_cell(m, df.at[i, (m, "mean")], df.at[i, (m, "ci95")]) for i in df.index]
    return out


def format_table(df, note: bool = True) -> str:
    """Aligned plain-text table for a terminal."""
    f = formatted_table(df)
    header = [f.index.name or ""] + list(f.columns)
    body = [[str(i)] + list(r) for i, r in zip(f.index, f.itertuples(index=False))]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) if j == 0 else str(c).rjust(w)  # noqa: E731
                                   for j, (c, w) in enumerate(zip(cells, widths)))
    lines = [line(header), "  ".join("-" * w for w in widths)] + [line(b) for b in body]
    if note:
        lines.append(f"({STAT_NOTE})")
    return "\n".join(lines)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    out = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------
_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
START_COLOR = "#555555"


def _mean_curve(curves: list[tuple[np.ndarray, np.ndarray]]):
    """Pointwise mean and t-interval half-width of several (x, y) curves. Identical x grids
    are averaged point by point; otherwise curves are interpolated onto the union of their
    x values inside the common x range."""
    cleaned = []
    for x, y in curves:
        x, y = np.asarray(x, float), np.asarray(y, float)
        ok = np.isfinite(x) & np.isfinite(y)
        x, y = x[ok], y[ok]
        if x.size == 0:
            continue
        order = np.argsort(x, kind="stable")
        x, y = x[order], y[order]
        ux, idx = np.unique(x[::-1], return_index=True)  # last value at a repeated x
        cleaned.append((ux, y[::-1][idx]))
    if not cleaned:
        return None
    same = all(c[0].shape == cleaned[0][0].shape and np.allclose(c[0], cleaned[0][0]) for c in cleaned)
    if same:
        grid = cleaned[0][0]
        ys = np.stack([c[1] for c in cleaned])
    else:
        lo = max(c[0][0] for c in cleaned)
        hi = min(c[0][-1] for c in cleaned)
        allx = np.unique(np.concatenate([c[0] for c in cleaned]))
        grid = allx[(allx >= lo) & (allx <= hi)] if hi > lo else allx
        ys = np.stack([np.interp(grid, c[0], c[1]) for c in cleaned])
    stats = [mean_ci(ys[:, j]) for j in range(ys.shape[1])]
    return grid, np.array([s[0] for s in stats]), np.array([s[1] for s in stats]), len(cleaned)


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


def _plot_band(ax, curve, label, color, marker=None):
    if curve is None:
        return
    x, m, half, n = curve
    ax.plot(x, m, label=f"{label} (n={n})", color=color, marker=marker, ms=4)
    if n > 1:
        h = np.nan_to_num(half)
        ax.fill_between(x, m - h, m + h, color=color, alpha=0.18, lw=0)


def plot_accuracy_vs_budget(groups, tasks, unit, colors):
    tasks = [t for t in tasks if any(f"eval/{t}/acc" in row for rs in groups.values() for r in rs for row in r.rows)
             or any(f"{t}/acc" in r.final_eval for rs in groups.values() for r in rs)]
    if not tasks:
        return None
    fig = _figure(5.2 * len(tasks), 3.8)
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks):
        key = f"eval/{task}/acc"
        for label, rs in groups.items():
            curves = []
            for r in rs:
                pts = [(r.counter(row), row[key]) for row in r.rows if key in row and r.counter(row) is not None]
                if not pts:  # no eval rows: start and end from the summary
                    pts = [(0.0, r.initial_eval.get(f"{task}/acc")), (r.budget_consumed, r.final_eval.get(f"{task}/acc"))]
                    pts = [(x, y) for x, y in pts if x is not None and y is not None]
                if pts:
                    curves.append((np.array([p[0] for p in pts]), np.array([p[1] for p in pts])))
            _plot_band(ax, _mean_curve(curves), label, colors[label], marker="o")
        ax.set_title(f"{task}: greedy accuracy vs budget")
        ax.set_xlabel(f"budget consumed ({unit})")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def plot_k_curves(groups, start_seeds, tasks, ks, colors):
    tasks = [t for t in tasks if t in ks]
    if not tasks:
        return None
    fig = _figure(10.0, 3.6 * len(tasks))
    axes = fig.subplots(len(tasks), 2, squeeze=False)
    for row, task in enumerate(tasks):
        for col, kind in enumerate(("maj", "pass")):
            ax = axes[row][col]
            series = [("start", START_COLOR, "s", start_seeds)]
            series += [(label, colors[label], "o", [r.final_eval for r in rs]) for label, rs in groups.items()]
            no_data = []
            for label, color, marker, evals in series:
                kvals = sorted({k_of(split_metric(m)[1])[1] for e in evals for m in e
                                if m.startswith(f"{task}/") and k_of(split_metric(m)[1])
                                and k_of(split_metric(m)[1])[0] == kind})
                if not kvals:
                    no_data.append(label)
                    continue
                stats = [mean_ci([e.get(f"{task}/{kind}@{k}") for e in evals]) for k in kvals]
                m = np.array([s[0] for s in stats])
                h = np.array([s[1] for s in stats])
                n = max(s[2] for s in stats)
                ax.errorbar(kvals, m, yerr=np.where(np.isfinite(h), h, 0.0) if n > 1 else None,
                            label=f"{label} (n={n})", color=color, marker=marker, ms=4, capsize=3,
                            ls="--" if label == "start" else "-")
            ax.set_xscale("log", base=2)
            ticks = sorted({2 ** i for i in range(int(math.log2(ks[task])) + 1)} | {ks[task]})
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
            ax.set_title(f"{task}: {'Maj' if kind == 'maj' else 'Pass'}@K")
            ax.set_xlabel("K (samples per problem)")
            ax.set_ylabel(f"{kind}@K")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
            if no_data:
                ax.text(0.99, 0.02, f"not evaluated: {', '.join(no_data)}", ha="right", va="bottom",
                        fontsize=8, color="#777", transform=ax.transAxes)
    return fig


def _bars(ax, labels, values_per_label, colors, ylabel, title):
    x = np.arange(len(labels))
    stats = [mean_ci(v) for v in values_per_label]
    m = np.array([s[0] for s in stats])
    h = np.array([s[1] if s[2] > 1 else 0.0 for s in stats])
    ax.bar(x, np.nan_to_num(m), yerr=np.nan_to_num(h), color=[colors[lab] for lab in labels], capsize=4, alpha=0.85)
    for xi, mi, hi in zip(x, m, h):
        if np.isfinite(mi):
            ax.annotate(f"{mi:.0f}" if mi >= 100 else f"{mi:.1f}", (xi, mi + np.nan_to_num(hi)), ha="center", va="bottom",
                        fontsize=8, xytext=(0, 2), textcoords="offset points")
        else:
            ax.annotate("n/a", (xi, 0), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, labels, rotation=15 if max(len(lb) for lb in labels) > 8 else 0, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.margins(y=0.12)
    ax.grid(axis="y", alpha=0.3)


def plot_memory(groups, colors):
    labels = list(groups)
    metrics = [("rss_above_base_mb", "peak RSS above base (MB)"), ("rss_mb", "peak RSS (MB)"),
               ("cuda_mb", "peak CUDA (MB)")]
    metrics = [(k, t) for k, t in metrics if any(r.peak.get(k) for rs in groups.values() for r in rs)]
    if not labels or not metrics:
        return None
    fig = _figure(4.2 * len(metrics), 3.6)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, (k, title) in zip(axes, metrics):
        _bars(ax, labels, [[r.peak.get(k) for r in groups[lab]] for lab in labels], colors, "MB", title)
    return fig


def plot_wall_clock(groups, colors):
    labels = list(groups)
    if not labels:
        return None
    fig = _figure(8.4, 3.6)
    axes = fig.subplots(1, 2, squeeze=False)[0]
    _bars(axes[0], labels, [[r.wall_seconds for r in groups[lab]] for lab in labels], colors, "seconds",
          "wall-clock (total)")
    _bars(axes[1], labels, [[r.train_seconds for r in groups[lab]] for lab in labels], colors, "seconds",
          "training time (evaluation excluded)")
    return fig


def plot_rewards(groups, unit, colors, key="rollout/reward_mean"):
    if not any(key in row for rs in groups.values() for r in rs for row in r.rows):
        return None
    fig = _figure(6.4, 3.8)
    ax = fig.subplots()
    for label, rs in groups.items():
        curves = []
        for r in rs:
            pts = [(r.counter(row), row[key]) for row in r.rows if key in row and r.counter(row) is not None]
            if pts:
                curves.append((np.array([p[0] for p in pts]), np.array([p[1] for p in pts])))
        _plot_band(ax, _mean_curve(curves), label, colors[label])
    ax.set_title("mean rollout reward vs budget")
    ax.set_xlabel(f"budget consumed ({unit})")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


PLOT_TITLES = {
    "accuracy_vs_budget": "Accuracy vs budget",
    "maj_pass_at_k": "Maj@K and Pass@K vs K (start vs each algorithm)",
    "peak_memory": "Peak memory",
    "wall_clock": "Wall-clock",
    "reward_curves": "Reward curves",
}


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def _runs_frame(runs: list[RunData], tasks: list[str]):
    import pandas as pd

    recs = []
    for r in runs:
        rec = {"run_id": r.run_id, "algorithm": r.algorithm, "seed": r.seed, "status": r.status,
               "included": r.status == "finished"}
        for t in tasks:
            rec[f"{t}/acc"] = r.final_eval.get(f"{t}/acc")
        rec.update({"peak_rss_mb": r.peak["rss_mb"], "peak_rss_above_base_mb": r.peak["rss_above_base_mb"],
                    "peak_cuda_mb": r.peak["cuda_mb"], "wall_seconds": r.wall_seconds,
                    "budget_unit": r.budget_unit, "budget_consumed": r.budget_consumed,
                    "error": r.error or ""})
        recs.append(rec)
    return pd.DataFrame(recs)


def _runs_display(runs_df, tasks):
    header = ["run", "algorithm", "seed", "status"] + [f"{t} acc (%)" for t in tasks] + \
             ["peak RSS (MB)", "wall-clock (s)", "budget", "note"]
    rows = []
    for _, r in runs_df.iterrows():
        note = "" if r["included"] else ("excluded from aggregates" + (f": {r['error']}" if r["error"] else ""))
        fmt = lambda v, f: "—" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f.format(v)  # noqa
        rows.append([r["run_id"], r["algorithm"], "" if r["seed"] is None or r["seed"] != r["seed"] else int(r["seed"]),
                     r["status"]] + [fmt(r[f"{t}/acc"] * 100 if r[f"{t}/acc"] is not None else None, "{:.1f}")
                                     for t in tasks] +
                    [fmt(r["peak_rss_mb"], "{:.0f}"), fmt(r["wall_seconds"], "{:.1f}"),
                     fmt(r["budget_consumed"], "{:.0f}") + f" {r['budget_unit']}", note])
    return header, rows


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:0.9em;margin:8px 0}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
thead th{background:#f3f3f3}
tr.start td{background:#fafafa;font-style:italic}
tr.failed td{color:#a00}
.note{color:#555;font-size:0.9em}
figure{margin:12px 0} figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:0.9em}
"""


def _html_table(df, fdf, table_id: str) -> str:
    cols = list(dict.fromkeys(df.columns.get_level_values(0)))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in [fdf.index.name or ""] + list(fdf.columns))
    body = []
    for idx in fdf.index:
        cls = ' class="start"' if idx == "start" else ""
        cells = [f'<td data-row="{html.escape(str(idx))}" data-col="row">{html.escape(str(idx))}</td>']
        for m, disp in zip(cols, fdf.columns):
            cells.append(f'<td data-row="{html.escape(str(idx))}" data-col="{html.escape(m)}">'
                         f"{html.escape(str(fdf.at[idx, disp]))}</td>")
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return (f'<table id="{table_id}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def build_report(sweep_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> dict:
    """Write report.md, report.html, table.csv, runs.csv and plots/*.png for one sweep.

    Returns ``{"table": DataFrame, "runs": DataFrame, "markdown": Path, "html": Path,
    "csv": Path, "runs_csv": Path, "plots": {name: Path}, "out_dir": Path,
    "excluded": [run_id, ...]}``."""
    sweep_dir = Path(sweep_dir)
    runs = load_sweep(sweep_dir)
    out = Path(out_dir) if out_dir is not None else sweep_dir / "report"
    (out / "plots").mkdir(parents=True, exist_ok=True)

    df = build_table(runs)
    tasks, ks, unit = df.attrs["tasks"], df.attrs["ks"], df.attrs["budget_unit"]
    done = [r for r in runs if r.status == "finished"]
    groups = group_runs(done)
    colors = {label: _COLORS[i % len(_COLORS)] for i, label in enumerate(groups)}
    start_seeds = _per_seed_initial(done)

    figs = OrderedDict([
        ("accuracy_vs_budget", plot_accuracy_vs_budget(groups, tasks, unit, colors)),
        ("maj_pass_at_k", plot_k_curves(groups, start_seeds, tasks, ks, colors)),
        ("peak_memory", plot_memory(groups, colors)),
        ("wall_clock", plot_wall_clock(groups, colors)),
        ("reward_curves", plot_rewards(groups, unit, colors)),
    ])
    plots: "OrderedDict[str, Path]" = OrderedDict()
    pngs: dict[str, bytes] = {}
    for name, fig in figs.items():
        if fig is None:
            continue
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        pngs[name] = buf.getvalue()
        path = out / "plots" / f"{name}.png"
        path.write_bytes(pngs[name])
        plots[name] = path
    missing = [PLOT_TITLES[n] for n, f in figs.items() if f is None]

    # tables
    fdf = formatted_table(df)
    runs_df = _runs_frame(runs, tasks)
    excluded = [r.run_id for r in runs if r.status != "finished"]
    flat = df.copy()
    flat.columns = [f"{m}_{s}" for m, s in df.columns]
    csv_path, runs_csv = out / "table.csv", out / "runs.csv"
    flat.to_csv(csv_path)
    runs_df.to_csv(runs_csv, index=False)
    sweep = runs[0].sweep if runs else sweep_dir.name
    amounts = sorted({(r.summary.get("budget") or {}).get("amount") for r in runs} - {None})
    budget_line = (f"budget: {', '.join(str(a) for a in amounts)} {unit} per run; " if amounts else "") + \
        f"{len(done)} of {len(runs)} runs finished"
    k_line = ", ".join(f"{t}: K={k}" for t, k in ks.items()) or "no maj@k/pass@k evaluated"
    notes = [STAT_NOTE + ".",
             "start = the starting checkpoint (each run's evaluation before any RL update, averaged per seed).",
             f"maj@K / pass@K at the largest K evaluated ({k_line}); accuracy is greedy.",
             "memory: peak resident set size (RSS) of the run, and the same minus the process baseline the trainer "
             "records (RSS above base); "
             "wall-clock includes evaluation, train time does not.",
             budget_line + "."]
    if excluded:
        notes.append(f"excluded from aggregates (not finished): {', '.join(excluded)}.")
    if missing:
        notes.append(f"plots without data in this sweep: {', '.join(missing)}.")

    # markdown
    hdr, rrows = _runs_display(runs_df, tasks)
    md = [f"# Report: {sweep}", "", f"Sweep directory: `{sweep_dir}`", "",
          _md_table([fdf.index.name or ""] + list(fdf.columns), [[i] + list(r) for i, r in zip(fdf.index, fdf.values)]),
          ""] + [f"- {n}" for n in notes] + [""]
    for name, path in plots.items():
        md += [f"## {PLOT_TITLES[name]}", "", f"![{PLOT_TITLES[name]}](plots/{path.name})", ""]
    md += ["## Runs", "", _md_table(hdr, rrows), ""]
    md_path = out / "report.md"
    md_path.write_text("\n".join(md))

    # html
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Report: {html.escape(sweep)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>Report: {html.escape(sweep)}</h1>",
             f"<p class='note'>Sweep directory: <code>{html.escape(str(sweep_dir))}</code></p>",
             "<h2>Results</h2>", _html_table(df, fdf, "results-table"),
             "<ul class='note'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"]
    for name in plots:
        b64 = base64.b64encode(pngs[name]).decode()
        parts.append(f"<h2>{html.escape(PLOT_TITLES[name])}</h2><figure>"
                     f"<img id='plot-{name}' class='plot' alt='{html.escape(PLOT_TITLES[name])}' "
                     f"src='data:image/png;base64,{b64}'>"
                     f"<figcaption>plots/{name}.png</figcaption></figure>")
    rows_html = []
    for (_, r), cells in zip(runs_df.iterrows(), rrows):
        cls = "" if r["included"] else " class='failed'"
        rows_html.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    parts.append("<h2>Runs</h2><table id='runs-table'><thead><tr>" +
                 "".join(f"<th>{html.escape(h)}</th>" for h in hdr) + "</tr></thead><tbody>" +
                 "".join(rows_html) + "</tbody></table>")
    parts.append("</body></html>")
    html_path = out / "report.html"
    html_path.write_text("\n".join(parts))
    return {"table": df, "runs": runs_df, "markdown": md_path, "html": html_path, "csv": csv_path,
            "runs_csv": runs_csv, "plots": dict(plots), "out_dir": out, "excluded": excluded}


def _cmd_report(args) -> int:
    try:
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
    except ImportError as e:
        print(f"harness report: {e.name} is not installed (pip install 'grpo-harness[report]')", file=sys.stderr)
        return 2
    res = build_report(args.sweep_dir, args.out)
    print(format_table(res["table"]))
    print(f"\nwrote {res['html']}, {res['markdown']}, {res['csv']}, {res['runs_csv']} and "
          f"{len(res['plots'])} plots in {res['out_dir'] / 'plots'}")
    if res["excluded"]:
        print(f"excluded (not finished): {', '.join(res['excluded'])}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="paper-style table and plots (Markdown, HTML, CSV) for one sweep",
        description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("sweep_dir", help="a sweep directory: RESULTS_DIR/<name>")
    p.add_argument("--out", default=None, help="output directory (default: <sweep_dir>/report)")
    p.set_defaults(func=_cmd_report)
