"""Figures of the DeepSeekMath small-study report (Figs. 5-7 analogues and the compute-curve fits), from plain data.

The functions take already-shaped data (label -> per-seed curves, label -> K-curves, label ->
fitted curves) and return a ``matplotlib.figure.Figure`` built without pyplot (Agg, no
display); `harness.report.study` shapes the data and saves the figures. Bands and error bars
are 95% Student-t intervals over seeds (`stats.mean_curve`, `stats.mean_ci`).
"""
from __future__ import annotations

import numpy as np

from harness.report.plots import COLORS, START_COLOR
from harness.report.stats import mean_ci, mean_curve


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


def _clip_percent(ax) -> None:
    """Keep a percentage axis within [-5, 105] (t-intervals over two seeds run far outside)."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(max(lo, -5.0), min(hi, 105.0))


def colors_for(labels) -> dict:
    """A fixed colour per label, in order."""
    return {label: COLORS[i % len(COLORS)] for i, label in enumerate(labels)}


def plot_accuracy(panels: list[tuple], colors: dict):
    """One axis per panel ``(title, xlabel, {label: [(x, y) per seed]})``: the mean over seeds
    with its t-interval band; two panels per row. None when no panel has data."""
    panels = [p for p in panels if any(p[2].values())]
    if not panels:
        return None
    rows = (len(panels) + 1) // 2
    fig = _figure(10.5, 3.8 * rows)
    axes = fig.subplots(rows, 2, squeeze=False).ravel()
    for ax, (title, xlabel, series) in zip(axes, panels):
        for label, curves in series.items():
            mc = mean_curve(curves) if curves else None
            if mc is None:
                continue
            x, m, half, n = mc
            ax.plot(x, 100 * m, label=f"{label} (n={n})", color=colors[label], marker="o", ms=3)
            if n > 1:
                h = 100 * np.nan_to_num(half)
                ax.fill_between(x, np.clip(100 * m - h, 0, 100), np.clip(100 * m + h, 0, 100), color=colors[label],
                                alpha=0.18, lw=0)  # an accuracy band stays within 0-100%
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("greedy accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        _clip_percent(ax)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return fig


def _k_stats(evals: list[dict], key: str, ks: list[int]):
    stats = [mean_ci([e.get(key.format(k=k)) for e in evals]) for k in ks]
    keep = [i for i, s in enumerate(stats) if s[2] > 0]
    return ([ks[i] for i in keep], np.array([100 * stats[i][0] for i in keep]),
            np.array([100 * stats[i][1] if stats[i][2] > 1 and np.isfinite(stats[i][1]) else 0.0 for i in keep]))


def plot_k(panels: list[tuple], colors: dict):
    """Maj@K and Pass@K on ONE axis per panel ``(title, task, n, start_evals, {label:
    final_evals})`` (evals: one flat ``{"<task>/<metric>": v}`` dict per seed): the start
    dashed, each arm's Maj@K solid and Pass@K dotted, log2 K axis, t-interval error bars."""
    from matplotlib.colors import to_rgba

    panels = [p for p in panels if p[2]]
    if not panels:
        return None
    fig = _figure(6.0 * len(panels), 4.4)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, task, n, start, arms) in zip(axes, panels):
        ks = list(range(1, n + 1))
        series = [("start", START_COLOR, start, ("--", "--"))]
        series += [(label, colors[label], ev, ("-", ":")) for label, ev in arms.items()]
        for label, color, evals, styles in series:
            for kind, ls, marker in (("maj", styles[0], "o"), ("pass", styles[1], "^")):
                x, m, h = _k_stats(evals, f"{task}/{kind}@{{k}}", ks)
                if x:
                    ax.errorbar(x, m, yerr=h, color=color, ls=ls, marker=marker, ms=3, capsize=2, lw=1.2,
                                ecolor=to_rgba(color, 0.35), elinewidth=0.8,
                                label=f"{label} {'Maj' if kind == 'maj' else 'Pass'}@K (n={len(evals)})")
        ax.set_xscale("log", base=2)
        ticks = sorted({2 ** i for i in range(int(np.log2(n)) + 1)} | {n})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("K (samples per problem)")
        ax.set_ylabel("Maj@K / Pass@K (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
        _clip_percent(ax)
    return fig


def plot_fits(panels: list[tuple], colors: dict):
    """One axis per panel ``(title, xlabel, {label: (x, mean_y, fit)})``: the mean points and
    the fitted curve (``fit.predict``) through them, extended to twice the last C."""
    panels = [p for p in panels if p[2]]
    if not panels:
        return None
    fig = _figure(5.4 * len(panels), 4.0)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, xlabel, series) in zip(axes, panels):
        for label, (x, m, fit) in series.items():
            ax.plot(x, 100 * np.asarray(m), "o", color=colors[label], ms=3)
            grid = np.linspace(0.0, 2.0 * float(np.max(x)), 200)
            ax.plot(grid, 100 * fit.predict(grid), "-", color=colors[label], lw=1.2,
                    label=f"{label}: A={100 * fit.a:.1f}%, B={fit.b:.2f}, C_mid={fit.c_mid:.3g}")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("greedy accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig
