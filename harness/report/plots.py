"""Matplotlib figures of a sweep: accuracy vs budget, Maj@K/Pass@K vs K, peak memory, wall-clock, rewards.

Each ``plot_*`` takes the row groups (label -> runs, see `harness.report.aggregate.group_runs`)
and a label -> colour map and returns a ``matplotlib.figure.Figure``, or None when the sweep
has no data for it. Lines are means over seeds with a t-interval band (`stats.mean_curve`),
bars and K-curves have t-interval error bars. Figures are built without pyplot (no global
state, no display needed); matplotlib is imported only when a figure is made.
"""
from __future__ import annotations

import math

import numpy as np

from harness.report.format import number
from harness.report.stats import mean_ci, mean_curve
from harness.rundir.read import k_of, split_metric

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
START_COLOR = "#555555"

PLOT_TITLES = {
    "accuracy_vs_budget": "Accuracy vs budget",
    "maj_pass_at_k": "Maj@K and Pass@K vs K (start vs each algorithm)",
    "peak_memory": "Peak memory",
    "wall_clock": "Wall-clock",
    "reward_curves": "Reward curves",
}


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
            _plot_band(ax, mean_curve(curves), label, colors[label], marker="o")
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
        _plot_band(ax, mean_curve(curves), label, colors[label])
    ax.set_title("mean rollout reward vs budget")
    ax.set_xlabel(f"budget consumed ({unit})")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
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
    }
