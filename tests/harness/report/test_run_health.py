"""The report's run-health figure (issue 45): one panel per per-step diagnostic some run logged, against the
budget, each run smoothed as the reward curve is, mean over seeds; and the runs table's budget cell, which says
how many of the samples drawn the updates used where dynamic sampling dropped some."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from _fake_results import make_sweep
from harness.report.aggregate import group_runs, load_sweep_runs
from harness.report.plots import COLORS, RUN_HEALTH, SMOOTH_STAGES, moving_average, plot_run_health
from harness.report.tables import runs_display, samples_used


def _with_health(sweep):
    """Add clip fractions (below, above) to every metrics row of every run: a known value per row."""
    for d in sorted(p for p in sweep.iterdir() if p.is_dir()):
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        for i, r in enumerate(rows):
            if "train/loss" in r or "rollout/reward_mean" in r:
                r["train/clip_frac_low"], r["train/clip_frac_high"] = 0.01 * (i % 7), 0.02 * (i % 3)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_run_health_panels_are_the_logged_metrics_smoothed_over_the_budget(tmp_path):
    sweep = make_sweep(tmp_path, "demo")
    groups = group_runs([r for r in load_sweep_runs(sweep) if r.status == "finished"])
    colors = {label: COLORS[i] for i, label in enumerate(groups)}
    only = plot_run_health(groups, "samples", colors)  # the fake runs log the gradient norm only
    assert [ax.get_title() for ax in only.axes if ax.get_visible()] == [RUN_HEALTH["train/grad_norm"]]
    assert plot_run_health({k: [] for k in groups}, "samples", colors) is None  # nothing logged: no figure
    _with_health(sweep)
    groups = group_runs([r for r in load_sweep_runs(sweep) if r.status == "finished"])
    fig = plot_run_health(groups, "samples", colors)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == [RUN_HEALTH[k] for k in ("train/clip_frac_low", "train/clip_frac_high",
                                                                        "train/grad_norm")]  # RUN_HEALTH's order
    assert {ax.get_xlabel() for ax in axes} == {"samples consumed"}
    run = groups["rft"][0]  # one seed: the line is that run's smoothed curve
    raw = [row["train/clip_frac_high"] for row in run.rows if "train/clip_frac_high" in row]
    line = next(ln for ln in axes[1].get_lines() if ln.get_label() == "rft (n=1)")
    np.testing.assert_allclose(line.get_ydata(), moving_average(raw, SMOOTH_STAGES))
    xs = [run.counter(row) for row in run.rows if "train/clip_frac_high" in row]
    np.testing.assert_allclose(line.get_xdata(), xs)


def test_budget_cell_says_how_many_samples_the_updates_used():
    assert samples_used({"budget": {"samples_drawn": 32768, "samples_used": 24576}}) == 24576
    assert samples_used({"budget": {"samples_drawn": 32768, "samples_used": 32768}}) is None
    assert samples_used({"budget": {}}) is None and samples_used({}) is None
    df = pd.DataFrame([{"run_id": "dapo-s0", "algorithm": "dapo", "seed": 0, "status": "finished", "included": True,
                        "peak_rss_mb": 1.0, "wall_seconds": 2.0, "budget_consumed": 32768, "budget_unit": "samples",
                        "samples_used": 24576, "error": ""},
                       {"run_id": "grpo-s0", "algorithm": "grpo", "seed": 0, "status": "finished", "included": True,
                        "peak_rss_mb": 1.0, "wall_seconds": 2.0, "budget_consumed": 32768, "budget_unit": "samples",
                        "samples_used": None, "error": ""}])
    _, rows = runs_display(df, [])
    assert rows[0][-2] == "32768 samples (24,576 used)" and rows[1][-2] == "32768 samples"
