"""Matplotlib figures of a sweep: accuracy vs budget, Maj@K/Pass@K vs K, peak memory, wall-clock, rewards.

Each ``plot_*`` takes the row groups (label -> runs, see `harness.report.aggregate.group_runs`)
and a label -> colour map and returns a ``matplotlib.figure.Figure``, or None when the sweep
has no data for it. Accuracy is plotted in % (as in every table). Lines are means over seeds
with a t-interval band (`stats.mean_curve`); bars have t-interval error bars. A row of a
single seed has no interval, so it gets no band and no error bar. Maj@K and Pass@K share one
axis per data set (DeepSeekMath Fig. 7): the starting checkpoint dashed, each algorithm Maj@K
solid and Pass@K dotted, one colour per algorithm. The reward curve is a moving average over
:data:`SMOOTH_STAGES` training stages. Figures are built without pyplot (no global state, no
display needed); matplotlib is imported only when a figure is made.
"""
from __future__ import annotations

import math

import numpy as np

from harness.report.format import number
from harness.report.stats import mean_ci, mean_curve
from harness.rundir.read import is_number, k_of, split_metric

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
START_COLOR = "#555555"
PERCENT = 100.0
"""Accuracies are fractions in the run directories and plotted in %."""
SMOOTH_STAGES = 5
"""Window of the reward curve's moving average, in training stages (metrics rows)."""
KIND_STYLE = {"maj": ("-", "o"), "pass": (":", "^")}
"""Maj@K solid with circles, Pass@K dotted with triangles; the start is dashed (both kinds)."""
UNIT_LABELS = {"samples": "samples consumed", "tokens": "completion tokens consumed", "steps": "training steps",
               "seconds": "training wall-clock (s)"}
WALL_LABEL = "training wall-clock (s, evaluation excluded)"

PLOT_TITLES = {
    "accuracy_vs_budget": "Accuracy vs budget and vs wall-clock",
    "maj_pass_at_k": "Maj@K and Pass@K vs K (start dashed; Maj@K solid, Pass@K dotted)",
    "peak_memory": "Peak memory",
    "wall_clock": "Wall-clock",
    "reward_curves": f"Reward curves (moving average over {SMOOTH_STAGES} stages)",
    "run_health": f"Run health: why an arm learned or not (moving average over {SMOOTH_STAGES} stages)",
}
RUN_HEALTH = {
    "rollout/zero_variance_frac": "share of groups with one reward (no signal)",
    "train/clip_frac_low": "share of tokens clipped below (ratio < 1 - eps_low)",
    "train/clip_frac_high": "share of tokens clipped above (ratio > 1 + eps_high)",
    "train/ratio_p90": "90th percentile of the ratio (per sequence for GSPO)",
    "rollout/entropy_est": "entropy estimate (nats per token)",
    "train/grad_norm": "gradient norm (before clipping)",
    "rollout/truncated_frac": "share of completions cut at max_new_tokens",
    "offpolicy/staleness": "actual staleness (updates between sampling and learning)",
    "offpolicy/mismatch_kl": "KL(behaviour || learner) per token (sampler vs learner log-probs)",
    "offpolicy/ratio_max": "largest raw learner/behaviour ratio",
    "offpolicy/truncated_frac": "share of tokens whose IS weight was truncated",
    "offpolicy/masked_frac": "share of tokens masked by the correction",
}
"""The per-step metrics of the run-health figure, each one panel where some run logged it."""


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


def unit_label(unit: str) -> str:
    """Human x-axis label of a budget unit ("samples consumed", ...)."""
    return UNIT_LABELS.get(unit, f"budget consumed ({unit})")


def _thousands(ax) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"))


def _plot_band(ax, curve, label, color, marker=None, ls="-", scale=1.0, with_n=True, clip=None):
    """Mean line of ``curve`` (``stats.mean_curve``) and, over several seeds, its t-interval band,
    cut to the metric's range ``clip`` (an accuracy band never leaves 0-100%)."""
    if curve is None:
        return
    x, m, half, n = curve
    m = m * scale
    ax.plot(x, m, label=f"{label} (n={n})" if with_n else label, color=color, marker=marker, ms=4, ls=ls)
    ok = np.isfinite(half)
    if n > 1 and ok.any():
        h = np.where(ok, half, 0.0) * scale
        lo, hi = (m - h, m + h) if clip is None else (np.clip(m - h, *clip), np.clip(m + h, *clip))
        ax.fill_between(x, lo, hi, where=ok, color=color, alpha=0.18, lw=0)


def _run_curve(r, key, x_of, fallback=()):
    """(x, y) arrays of ``key`` over the rows of run ``r`` (x from ``x_of(row)``), else the
    ``fallback`` points; None without any point."""
    pts = [(x_of(row), row[key]) for row in r.rows if is_number(row.get(key))]
    pts = [(x, y) for x, y in pts if x is not None] or [(x, y) for x, y in fallback if x is not None and y is not None]
    if not pts:
        return None
    return np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)


def _wall_x(row):
    return float(row["seconds"]) if is_number(row.get("seconds")) else None


def _acc_curves(rs, task, x_kind):
    """Per run of ``rs``: accuracy of ``task`` against the budget counter or the training seconds
    (no eval rows: start and end from the summary)."""
    key = f"eval/{task}/acc"
    out = []
    for r in rs:
        x_of = r.counter if x_kind == "budget" else _wall_x
        end = r.budget_consumed if x_kind == "budget" else r.train_seconds
        fallback = [(0.0, r.initial_eval.get(f"{task}/acc")), (end, r.final_eval.get(f"{task}/acc"))]
        c = _run_curve(r, key, x_of, fallback)
        if c is not None:
            out.append(c)
    return out


def plot_accuracy_vs_budget(groups, tasks, unit, colors):
    """Per data set: greedy accuracy (%) vs budget consumed and, beside it, vs training wall-clock."""
    tasks = [t for t in tasks if any(f"eval/{t}/acc" in row for rs in groups.values() for r in rs for row in r.rows)
             or any(f"{t}/acc" in r.final_eval for rs in groups.values() for r in rs)]
    if not tasks:
        return None
    has_wall = unit != "seconds" and any(_wall_x(row) is not None for rs in groups.values() for r in rs
                                         for row in r.rows)
    panels = [("budget", unit_label(unit))] + ([("wall", WALL_LABEL)] if has_wall else [])
    fig = _figure(5.4 * len(panels), 3.8 * len(tasks))
    axes = fig.subplots(len(tasks), len(panels), squeeze=False)
    for i, task in enumerate(tasks):
        for j, (kind, xlabel) in enumerate(panels):
            ax = axes[i][j]
            for label, rs in groups.items():
                _plot_band(ax, mean_curve(_acc_curves(rs, task, kind)), label, colors[label], marker="o",
                           scale=PERCENT, clip=(0.0, 100.0))
            ax.set_title(f"{task}: greedy accuracy vs {'budget' if kind == 'budget' else 'wall-clock'}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("accuracy (%)")
            _thousands(ax)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    return fig


def _k_series(task, kind, evals):
    """(K values, mean %, half-width %, n) of ``task``'s ``kind``@K over the evaluations ``evals``
    (None without data)."""
    kvals = sorted({k_of(split_metric(m)[1])[1] for e in evals for m in e
                    if m.startswith(f"{task}/") and k_of(split_metric(m)[1]) and k_of(split_metric(m)[1])[0] == kind})
    if not kvals:
        return None
    stats = [mean_ci([e.get(f"{task}/{kind}@{k}") for e in evals]) for k in kvals]
    return (np.array(kvals, float), np.array([s[0] for s in stats]) * PERCENT,
            np.array([s[1] for s in stats]) * PERCENT, max(s[2] for s in stats))


def _k_legend(ax, entries):
    """Legend: one colour per row (with its n), then the line styles of the kinds."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, ls="--" if lab == "start" else "-", label=f"{lab} (n={n})")
               for lab, c, n in entries]
    handles += [Line2D([], [], color="#333", ls=ls, marker=mk, ms=4, label=f"{'Maj' if k == 'maj' else 'Pass'}@K")
                for k, (ls, mk) in KIND_STYLE.items()]
    ax.legend(handles=handles, fontsize=8, loc="best")


def plot_k_curves(groups, start_seeds, tasks, ks, colors):
    """Per data set one axis: Maj@K and Pass@K (%) vs K of the start (dashed) and each row (Maj solid, Pass dotted)."""
    tasks = [t for t in tasks if t in ks]
    if not tasks:
        return None
    fig = _figure(6.4 * len(tasks), 4.4)
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    series = [("start", START_COLOR, start_seeds)]
    series += [(label, colors[label], [r.final_eval for r in rs]) for label, rs in groups.items()]
    for ax, task in zip(axes, tasks):
        entries, no_data = [], []
        for label, color, evals in series:
            n_row = 0
            for kind, (ls, marker) in KIND_STYLE.items():
                s = _k_series(task, kind, evals)
                if s is None:
                    continue
                k, m, h, n = s
                n_row = max(n_row, n)
                _plot_band(ax, (k, m, h, n), f"{label} {kind}@K", color, marker=marker,
                           ls="--" if label == "start" else ls, with_n=False, clip=(0.0, 100.0))
            if n_row:
                entries.append((label, color, n_row))
            else:
                no_data.append(label)
        ax.set_xscale("log", base=2)
        ticks = sorted({2 ** i for i in range(int(math.log2(ks[task])) + 1)} | {ks[task]})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_title(f"{task}: Maj@K and Pass@K")
        ax.set_xlabel("K (samples per problem)")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
        if entries:
            _k_legend(ax, entries)
        if no_data:
            ax.text(0.99, 0.02, f"not evaluated: {', '.join(no_data)}", ha="right", va="bottom",
                    fontsize=8, color="#777", transform=ax.transAxes)
    return fig


def _bars(ax, labels, values_per_label, colors, ylabel, title):
    """One bar per row (mean over seeds); an error bar only where there are several seeds."""
    x = np.arange(len(labels))
    stats = [mean_ci(v) for v in values_per_label]
    m = np.array([s[0] for s in stats])
    h = np.array([s[1] if s[2] > 1 else math.nan for s in stats])
    ax.bar(x, np.nan_to_num(m), color=[colors[lab] for lab in labels], alpha=0.85)
    ok = np.isfinite(h) & np.isfinite(m)
    if ok.any():
        ax.errorbar(x[ok], m[ok], yerr=h[ok], fmt="none", ecolor="#222", capsize=4)
    for xi, mi, hi in zip(x, m, h):
        if np.isfinite(mi):
            ax.annotate(number(mi, ".0f" if mi >= 100 else ".1f"), (xi, mi + np.nan_to_num(hi)), ha="center", va="bottom",
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
    metrics = [("rss_above_base_mb", "peak RSS above base"), ("rss_mb", "peak RSS"), ("cuda_mb", "peak CUDA")]
    metrics = [(k, t) for k, t in metrics if any(r.peak.get(k) for rs in groups.values() for r in rs)]
    if not labels or not metrics:
        return None
    fig = _figure(4.2 * len(metrics), 3.6)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, (k, title) in zip(axes, metrics):
        _bars(ax, labels, [[r.peak.get(k) for r in groups[lab]] for lab in labels], colors, "memory (MiB)", title)
    return fig


def plot_wall_clock(groups, colors):
    labels = list(groups)
    if not labels:
        return None
    fig = _figure(8.4, 3.6)
    axes = fig.subplots(1, 2, squeeze=False)[0]
    _bars(axes[0], labels, [[r.whole_wall_seconds for r in groups[lab]] for lab in labels], colors, "wall-clock (s)",
          "wall-clock (total)")
    _bars(axes[1], labels, [[r.train_seconds for r in groups[lab]] for lab in labels], colors, "wall-clock (s)",
          "training time (evaluation excluded)")
    return fig


def moving_average(y, window: int = SMOOTH_STAGES) -> np.ndarray:
    """Trailing moving average: point i is the mean of points max(0, i-window+1)..i."""
    y = np.asarray(y, float)
    c = np.concatenate([[0.0], np.cumsum(y)])
    i = np.arange(1, y.size + 1)
    lo = np.maximum(0, i - window)
    return (c[i] - c[lo]) / (i - lo)


def _logged(groups, key: str) -> bool:
    return any(is_number(row.get(key)) for rs in groups.values() for r in rs for row in r.rows)


def _smoothed_bands(ax, groups, key, colors, window: int) -> None:
    """Per group: ``key`` against the budget counter, each run smoothed over ``window`` stages, then the mean and
    the band over seeds."""
    for label, rs in groups.items():
        curves = [c for c in (_run_curve(r, key, r.counter) for r in rs) if c is not None]
        _plot_band(ax, mean_curve([(x, moving_average(y, window)) for x, y in curves]), label, colors[label])


def plot_run_health(groups, unit, colors, window: int = SMOOTH_STAGES):
    """One panel per :data:`RUN_HEALTH` metric some run logged, against the budget (samples drawn, for a samples
    budget: what dynamic sampling throws away is on the axis too), smoothed per run, mean and band over seeds."""
    keys = [k for k in RUN_HEALTH if _logged(groups, k)]
    if not keys:
        return None
    cols = min(3, len(keys))
    rows = -(-len(keys) // cols)
    fig = _figure(4.6 * cols, 3.3 * rows)
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    for ax, key in zip(axes, keys):
        _smoothed_bands(ax, groups, key, colors, window)
        ax.set_title(RUN_HEALTH[key], fontsize=9)
        ax.set_xlabel(unit_label(unit), fontsize=8)
        _thousands(ax)
        ax.grid(alpha=0.3)
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    return fig


def plot_rewards(groups, unit, colors, key="rollout/reward_mean", window: int = SMOOTH_STAGES):
    """Mean rollout reward vs budget, each run smoothed over ``window`` stages, then mean and band over seeds."""
    if not _logged(groups, key):
        return None
    fig = _figure(6.4, 3.8)
    ax = fig.subplots()
    _smoothed_bands(ax, groups, key, colors, window)
    ax.set_title(f"mean rollout reward vs budget (moving average over {window} stages)")
    ax.set_xlabel(unit_label(unit))
    ax.set_ylabel("mean reward (0–1)")
    _thousands(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title=f"smoothed: {window}-stage moving average", title_fontsize=8)
    return fig


def figures(groups, start_seeds, tasks, ks, unit) -> "dict[str, object]":
    """Every report figure by name (PLOT_TITLES order); None for those without data."""
    colors = {label: COLORS[i % len(COLORS)] for i, label in enumerate(groups)}
    return {
        "accuracy_vs_budget": plot_accuracy_vs_budget(groups, tasks, unit, colors),
        "maj_pass_at_k": plot_k_curves(groups, start_seeds, tasks, ks, colors),
        "peak_memory": plot_memory(groups, colors),
        "wall_clock": plot_wall_clock(groups, colors),
        "reward_curves": plot_rewards(groups, unit, colors),
        "run_health": plot_run_health(groups, unit, colors),
    }
