"""The report's plots as a reader sees them: accuracy in %, Maj@K and Pass@K overlaid on one axis
per data set (start dashed, Maj solid, Pass dotted), a smoothed reward curve that says its
window, accuracy vs wall-clock beside accuracy vs budget, no band or error bar for a single
seed (checked on the matplotlib objects), and report.html opened in headless Chromium with
every plot image loaded and not blank."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from _fake_results import make_sweep
from harness.report.aggregate import build_table, group_runs, load_sweep_runs, per_seed_initial
from harness.report.build import build_report
from harness.report.plots import COLORS, PLOT_TITLES, SMOOTH_STAGES, figures, moving_average

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return make_sweep(tmp_path_factory.mktemp("results"), "demo")


@pytest.fixture(scope="module")
def figs(sweep):
    runs = load_sweep_runs(sweep)
    df = build_table(runs)
    done = [r for r in runs if r.status == "finished"]
    groups = group_runs(done)
    return figures(groups, per_seed_initial(done), df.attrs["tasks"], df.attrs["ks"], df.attrs["budget_unit"]), groups


def _color(label, groups):
    import matplotlib.colors as mc

    return mc.to_rgba(COLORS[list(groups).index(label)])


def _bands(ax):
    from matplotlib.collections import PolyCollection

    return [c for c in ax.collections if isinstance(c, PolyCollection)]


def test_accuracy_in_percent_beside_wall_clock(figs):
    f, groups = figs
    axes = f["accuracy_vs_budget"].axes
    assert len(axes) == 4                      # (arith, gsm8k) x (budget, wall-clock)
    assert {ax.get_ylabel() for ax in axes} == {"accuracy (%)"}
    assert [ax.get_xlabel() for ax in axes[:2]] == ["samples consumed", "training wall-clock (s, evaluation excluded)"]
    for ax in axes:
        ys = np.concatenate([ln.get_ydata() for ln in ax.get_lines()])
        assert ys.max() > 1.5                  # percent, not a fraction
    grpo = next(ln for ln in axes[0].get_lines() if ln.get_label().startswith("grpo"))
    assert grpo.get_label() == "grpo (n=3)" and grpo.get_ydata()[-1] == pytest.approx(
        100 * np.mean([r.final_eval["arith/acc"] for r in groups["grpo"]]), abs=1e-9)
    # rft has one seed: no band in its colour; grpo (3 seeds) has one
    band_colors = [tuple(b.get_facecolor()[0][:3]) for b in _bands(axes[0])]
    assert tuple(_color("grpo", groups)[:3]) in band_colors
    assert tuple(_color("rft", groups)[:3]) not in band_colors


def test_maj_and_pass_share_one_axis_per_data_set(figs):
    f, groups = figs
    axes = f["maj_pass_at_k"].axes
    assert len(axes) == 1                      # only arith has K-curves
    ax = axes[0]
    assert ax.get_ylabel() == "accuracy (%)" and ax.get_xlabel() == "K (samples per problem)"
    styles = {ln.get_label(): ln.get_linestyle() for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert styles["start maj@K"] == styles["start pass@K"] == "--"
    for algo in ("grpo", "rft"):
        assert styles[f"{algo} maj@K"] == "-" and styles[f"{algo} pass@K"] == ":"
    assert not any(k.startswith("ppo") for k in styles)       # ppo evaluated greedily only
    assert "not evaluated: ppo" in [t.get_text() for t in ax.texts]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["start (n=3)", "grpo (n=3)", "rft (n=1)", "Maj@K", "Pass@K"]
    ys = np.concatenate([ln.get_ydata() for ln in ax.get_lines()])
    assert 30 < ys.min() and ys.max() <= 100
    band_colors = [tuple(b.get_facecolor()[0][:3]) for b in _bands(ax)]
    assert band_colors.count(tuple(_color("grpo", groups)[:3])) == 2   # a band for maj and one for pass
    assert tuple(_color("rft", groups)[:3]) not in band_colors


def test_reward_curve_smoothed_with_window_stated(figs):
    f, groups = figs
    ax = f["reward_curves"].axes[0]
    assert f"moving average over {SMOOTH_STAGES} stages" in ax.get_title()
    assert f"moving average over {SMOOTH_STAGES} stages" in PLOT_TITLES["reward_curves"]
    assert ax.get_xlabel() == "samples consumed" and ax.get_ylabel() == "mean reward (0–1)"
    rft = next(ln for ln in ax.get_lines() if ln.get_label() == "rft (n=1)")
    run = groups["rft"][0]
    raw = [row["rollout/reward_mean"] for row in run.rows if "rollout/reward_mean" in row]
    np.testing.assert_allclose(rft.get_ydata(), moving_average(raw, SMOOTH_STAGES))
    np.testing.assert_allclose(moving_average([1, 2, 3, 4, 5, 6], 3), [1, 1.5, 2, 3, 4, 5])


def test_single_seed_bars_have_no_error_bar(figs):
    f, groups = figs
    for name, unit in (("peak_memory", "memory (MiB)"), ("wall_clock", "wall-clock (s)")):
        for ax in f[name].axes:
            assert ax.get_ylabel() == unit
            # error bars only for the rows with several seeds (grpo: 3, ppo: 2), not for rft (1)
            segs = [s for c in ax.collections for s in c.get_segments()] if ax.collections else []
            assert len(segs) == 2, (name, ax.get_title())


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_report_page_in_headless_chromium(sweep, tmp_path):
    res = build_report(sweep, tmp_path / "report")
    page_html = res["html"].read_text()
    assert "Maj@K and Pass@K vs K (start dashed; Maj@K solid, Pass@K dotted)" in page_html
    probe = """<script>window.addEventListener('load', function () {
      var out = document.createElement('pre'); out.id = 'img-probe';
      out.textContent = JSON.stringify(Array.from(document.images).map(function (i) {
        return {id: i.id, w: i.naturalWidth, h: i.naturalHeight, complete: i.complete}; }));
      document.body.appendChild(out); });</script></body>"""
    page = tmp_path / "probe.html"
    page.write_text(page_html.replace("</body>", probe))
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--mute-audio",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(flags + ["--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=90).stdout
    probe_json = dom.split('<pre id="img-probe">')[1].split("</pre>")[0]
    imgs = {i["id"]: i for i in json.loads(probe_json.replace("&quot;", '"'))}
    assert set(imgs) == {f"plot-{n}" for n in res["plots"]} == {f"plot-{n}" for n in PLOT_TITLES}
    import matplotlib.image as mpimg
    for name, path in res["plots"].items():
        assert path.exists()
        h, w = mpimg.imread(path).shape[:2]
        assert imgs[f"plot-{name}"]["complete"] and (imgs[f"plot-{name}"]["w"], imgs[f"plot-{name}"]["h"]) == (w, h)
    # report.md links the same files
    md = res["markdown"].read_text()
    for name, path in res["plots"].items():
        assert f"(plots/{path.name})" in md and (res["out_dir"] / "plots" / path.name).is_file()
    # one screenshot of the Maj/Pass figure alone: it renders, and it is not blank
    single = tmp_path / "kcurve.html"
    single.write_text(f"<!doctype html><body style='margin:0'><img src='{res['plots']['maj_pass_at_k'].as_uri()}'>"
                      "</body>")
    shot = tmp_path / "kcurve.png"
    subprocess.run(flags + ["--hide-scrollbars", f"--screenshot={shot}", "--window-size=800,600",
                            "--allow-file-access-from-files", single.as_uri()], capture_output=True, timeout=90)
    img = mpimg.imread(shot)
    assert img.shape[:2] == (600, 800)
    dark = img[..., :3].mean(axis=2) < 0.9
    assert dark.mean() > 0.02                  # lines, labels, legend
