"""`harness report`: numbers checked against aggregates computed here from the files, file
outputs, missing metrics, and the HTML rendered by headless Chromium."""
from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from _fake_results import make_run, make_sweep
from harness.report.build import build_report
from harness.report.format import number, table
from harness.report.stats import mean_ci, t_quantile
from harness.report.tables import csv_column, format_cell, format_table

# two-sided 95% Student-t quantiles t_{0.975, df} (from tables), for the independent check
T975 = {1: 12.706204736174707, 2: 4.302652729749464, 3: 3.182446305284263, 4: 2.7764451051977987}
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return make_sweep(tmp_path_factory.mktemp("results"), "demo")


@pytest.fixture(scope="module")
def report(sweep, tmp_path_factory):
    return build_report(sweep, tmp_path_factory.mktemp("report"))


def independent(sweep: Path):
    """Per algorithm, the finished runs' summaries; per seed, the initial evals."""
    by_algo, start = {}, {}
    for d in sorted(sweep.iterdir()):
        s = json.loads((d / "summary.json").read_text())
        if s["status"] != "finished":
            continue
        by_algo.setdefault(s["algorithm"], []).append(s)
        start.setdefault(s["seed"], []).append(s["initial_eval"])
    return by_algo, start


def agg(values):
    values = [v for v in values if v is not None]
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return values[0], math.nan, 1
    return statistics.mean(values), T975[n - 1] * statistics.stdev(values) / math.sqrt(n), n


def check(df, row, col, expected):
    mean, half, n = expected
    assert df.at[row, (col, "n")] == n, (row, col)
    if n == 0:
        assert math.isnan(df.at[row, (col, "mean")])
        return
    assert df.at[row, (col, "mean")] == pytest.approx(mean, rel=1e-12, abs=1e-12), (row, col)
    if math.isnan(half):
        assert math.isnan(df.at[row, (col, "ci95")]), (row, col)
    else:
        assert df.at[row, (col, "ci95")] == pytest.approx(half, rel=1e-9, abs=1e-12), (row, col)


def test_t_quantiles_and_mean_ci():
    for df_, t in T975.items():
        assert t_quantile(0.975, df_) == pytest.approx(t, rel=1e-9)
    assert t_quantile(0.025, 5) == pytest.approx(-2.570581835636314, rel=1e-9)
    assert t_quantile(0.975, 1000) == pytest.approx(1.9623390808264074, rel=1e-8)
    m, h, n = mean_ci([0.5, 0.7, 0.6])
    assert (m, n) == (pytest.approx(0.6), 3) and h == pytest.approx(4.302652729749464 * 0.1 / math.sqrt(3))
    m, h, n = mean_ci([0.42, None, float("nan")])
    assert (m, n) == (0.42, 1) and math.isnan(h)
    assert mean_ci([])[2] == 0
    scipy_stats = pytest.importorskip("scipy.stats")
    for df_ in (1, 2, 3, 7, 29, 120):
        for p in (0.9, 0.975, 0.995):
            assert t_quantile(p, df_) == pytest.approx(scipy_stats.t.ppf(p, df_), rel=1e-9)


def test_table_matches_aggregates_computed_from_files(sweep, report):
    df = report["table"]
    by_algo, start = independent(sweep)
    assert list(df.index) == ["start", "grpo", "ppo", "rft"]
    for algo, sums in by_algo.items():
        fe = [s["final_eval"] for s in sums]
        check(df, algo, "arith/acc", agg([e["eval/arith/acc"] for e in fe]))
        check(df, algo, "gsm8k/acc", agg([e["eval/gsm8k/acc"] for e in fe]))
        check(df, algo, "arith/maj@8", agg([e.get("eval/arith/maj@8") for e in fe]))
        check(df, algo, "arith/pass@8", agg([e.get("eval/arith/pass@8") for e in fe]))
        check(df, algo, "peak_rss_mb", agg([s["peak"]["rss_mb"] for s in sums]))
        check(df, algo, "peak_rss_above_base_mb", agg([s["peak"]["rss_above_base_mb"] for s in sums]))
        check(df, algo, "wall_seconds", agg([s["wall_seconds"] for s in sums]))
        check(df, algo, "train_seconds", agg([s["budget"]["consumed"]["seconds"] for s in sums]))
        check(df, algo, "budget_consumed", agg([s["budget"]["consumed"]["samples"] for s in sums]))
        assert df.at[algo, ("seeds", "mean")] == len(sums)
    # the failed ppo seed is excluded: 2 seeds, values of the finished ones only
    assert df.at["ppo", ("arith/acc", "n")] == 2 and report["excluded"] == [
        d.name for d in sorted(sweep.iterdir()) if d.name.startswith("ppo-s2-")]
    # ppo was evaluated greedily only: no maj/pass; rft has a single seed: no interval
    assert math.isnan(df.at["ppo", ("arith/pass@8", "mean")])
    assert df.at["rft", ("arith/acc", "n")] == 1 and math.isnan(df.at["rft", ("arith/acc", "ci95")])
    # start row: initial evals averaged per seed, then over seeds
    per_seed = {seed: {k: statistics.mean(e[k] for e in evals if k in e) for k in {k for e in evals for k in e}}
                for seed, evals in start.items()}
    for col in ("arith/acc", "gsm8k/acc", "arith/maj@8", "arith/pass@8"):
        check(df, "start", col, agg([v.get(f"eval/{col}") for v in per_seed.values()]))
    assert math.isnan(df.at["start", ("peak_rss_mb", "mean")])
    # the largest K evaluated is the one reported
    assert df.attrs["ks"] == {"arith": 8} and "arith/maj@4" not in df.columns.get_level_values(0)


def test_output_files(sweep, report):
    df = report["table"]
    csv = pd.read_csv(report["csv"], index_col=0)
    assert list(csv.index) == list(df.index)
    for (m, s) in df.columns:
        np.testing.assert_allclose(csv[f"{csv_column(m)}_{s}"].to_numpy(float), df[(m, s)].to_numpy(float),
                                   rtol=1e-12)
    # accuracies are fractions in the CSV files and named so; other columns keep their names
    assert {"arith/acc_frac_mean", "arith/maj@8_frac_ci95", "wall_seconds_mean"} <= set(csv.columns)
    assert "arith/acc_mean" not in csv.columns and 0 < csv.at["grpo", "arith/acc_frac_mean"] < 1
    runs = pd.read_csv(report["runs_csv"])
    assert len(runs) == 7
    failed = runs[runs.status == "failed"]
    assert list(failed.run_id) == report["excluded"] and not failed.included.any()
    assert "fake out-of-memory" in failed.error.iloc[0]

    grpo = [json.loads((d / "summary.json").read_text())["final_eval"]["eval/arith/acc"]
            for d in sorted(sweep.iterdir()) if d.name.startswith("grpo-")]
    m, h, _ = agg(grpo)
    cell = f"{m * 100:.1f} ± {h * 100:.1f}"
    md = report["markdown"].read_text()
    assert f"| grpo | {cell} |" in md
    rft = json.loads(next(sweep.glob("rft-*/summary.json")).read_text())["final_eval"]["eval/arith/acc"]
    assert f"| rft | {rft * 100:.1f} |" in md  # single seed: value alone
    assert "budget: 1024 samples per run;" in md  # an integer budget prints as one (not 1024.0)
    assert "<div class='scroll'><table id='settings-table'" in report["html"].read_text()  # wide tables scroll
    for name in ("accuracy_vs_budget", "maj_pass_at_k", "peak_memory", "wall_clock", "reward_curves", "run_health"):
        assert f"](plots/{name}.png)" in md
    text = format_table(df)
    line = next(line for line in text.splitlines() if line.startswith("grpo"))
    assert cell in line and "±" in text and "95%" in text
    assert set(report["plots"]) == {"accuracy_vs_budget", "maj_pass_at_k", "peak_memory", "wall_clock",
                                    "reward_curves", "run_health"}
    import matplotlib.image as mpimg
    for p in report["plots"].values():
        img = mpimg.imread(p)
        assert img.shape[0] > 200 and img.shape[1] > 400 and img[..., :3].std() > 0.05  # a real figure


def test_cli_prints_table(sweep, tmp_path, capsys):
    from harness.cli.main import main

    assert main(["report", str(sweep), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["row", "arith", "acc"]
    assert {ln.split()[0] for ln in out.splitlines()[2:6]} == {"start", "grpo", "ppo", "rft"}
    assert (tmp_path / "r" / "report.html").exists() and "excluded (not finished)" in out
    # a results root instead of a sweep: a clear error naming the sweep
    assert main(["report", str(sweep.parent)]) == 2
    assert "demo" in capsys.readouterr().err


def test_missing_metrics_and_config_variants(tmp_path):
    # only greedy evaluation, a single seed, a run without peak memory or reward rows,
    # and two configs of the same algorithm
    make_run(tmp_path, "thin", "ppo", 0, 0)
    make_run(tmp_path, "thin", "grpo", 0, 0, overrides={"train": {"lr": 1e-5}})
    make_run(tmp_path, "thin", "grpo", 1, 0, overrides={"train": {"lr": 1e-5}})
    d = make_run(tmp_path, "thin", "grpo", 0, 0, overrides={"train": {"lr": 3e-4}})
    s = json.loads((d / "summary.json").read_text())
    s["peak"] = {}
    (d / "summary.json").write_text(json.dumps(s))
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows
                                             if not any(k.startswith(("perf/", "rollout/")) for k in r)))
    res = build_report(tmp_path / "thin")
    df = res["table"]
    assert list(df.index) == ["start", "grpo (train.lr=0.0003)", "grpo (train.lr=1e-05)", "ppo"]
    assert not any("@" in m for m in df.columns.get_level_values(0))  # no maj/pass columns at all
    assert "maj_pass_at_k" not in res["plots"] and "reward_curves" in res["plots"]
    assert df.at["grpo (train.lr=0.0003)", ("peak_rss_mb", "n")] == 0
    assert format_cell("peak_rss_mb", df.at["grpo (train.lr=0.0003)", ("peak_rss_mb", "mean")], math.nan) == "—"
    assert df.at["grpo (train.lr=1e-05)", ("arith/acc", "n")] == 2
    line = next(x for x in format_table(df).splitlines() if x.startswith("ppo"))
    assert "±" not in line  # single seed
    page = res["html"].read_text()
    assert "id='plot-maj_pass_at_k'" not in page and "id='plot-reward_curves'" in page
    assert "plots without data in this sweep: Maj@K and Pass@K" in page


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_html_renders_in_headless_chromium(sweep, report, tmp_path):
    df = report["table"]
    html_text = report["html"].read_text()
    # write image sizes into the DOM once everything has loaded, then dump the DOM
    probe = """<script>window.addEventListener('load', function () {
      var out = document.createElement('pre'); out.id = 'img-probe';
      out.textContent = JSON.stringify(Array.from(document.images).map(function (i) {
        return {id: i.id, w: i.naturalWidth, h: i.naturalHeight, complete: i.complete}; }));
      document.body.appendChild(out); });</script></body>"""
    page = tmp_path / "probe.html"
    page.write_text(html_text.replace("</body>", probe))
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", "--mute-audio", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(flags + ["--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=90).stdout
    assert "<table id=\"results-table\">" in dom
    probe_json = dom.split('<pre id="img-probe">')[1].split("</pre>")[0]
    imgs = {i["id"]: i for i in json.loads(probe_json.replace("&quot;", '"'))}
    assert set(imgs) == {f"plot-{n}" for n in report["plots"]}
    import matplotlib.image as mpimg
    for name, path in report["plots"].items():
        h, w = mpimg.imread(path).shape[:2]
        assert imgs[f"plot-{name}"]["complete"] and (imgs[f"plot-{name}"]["w"], imgs[f"plot-{name}"]["h"]) == (w, h)
    # table cells in the DOM carry the aggregate values
    for row in df.index:
        for col in ("arith/acc", "gsm8k/acc"):
            cell = format_cell(col, df.at[row, (col, "mean")], df.at[row, (col, "ci95")])
            assert f'data-row="{row}" data-col="{col}">{cell}</td>' in dom, (row, col, cell)
    assert 'data-row="ppo" data-col="arith/pass@8">—</td>' in dom
    assert "excluded from aggregates" in dom and report["excluded"][0] in dom

    shot = tmp_path / "report.png"
    subprocess.run(flags + ["--hide-scrollbars", f"--screenshot={shot}", "--window-size=1280,2400",
                            report["html"].as_uri()], capture_output=True, timeout=90)
    import matplotlib.image as mpimg
    img = mpimg.imread(shot)
    assert img.shape[:2] == (2400, 1280)
    # not a blank page: many non-white pixels (table text and the plots)
    assert (img[..., :3].mean(axis=2) < 0.9).mean() > 0.05


def test_shared_table_and_number_formatting():
    assert table(["a", "bb"], [["xyz", ""], ["1", "2"]]) == "a    bb\nxyz\n1    2"
    assert table(None, [("k", "v"), ("long", "w")]) == "k     v\nlong  w"
    assert table(["r", "n"], [["x", "10"]], "ruled", align="lr") == "r   n\n-  --\nx  10"
    assert table(["a|b"], [["c\nd"]], "markdown") == "| a\\|b |\n|---|\n| c d |"
    assert table(["<h>"], [["&"]], "html", table_attrs=" id='t'", row_attrs=[" class='x'"]) == \
        "<table id='t'><thead><tr><th>&lt;h&gt;</th></tr></thead><tbody><tr class='x'><td>&amp;</td></tr></tbody></table>"
    assert [number(v, "g", whole=True) for v in (4096.0, 1e-4, {"b": 1, "a": 2}, None)] == \
        ["4096", "0.0001", '{"a": 2, "b": 1}', "None"]
    assert [number(v, ".3g", large_spec=",.0f", int_spec=",", missing="-") for v in (None, 0.12345, 12345.6, 1234567)] \
        == ["-", "0.123", "12,346", "1,234,567"]
    assert number(float("nan"), ".1f", nonfinite="—") == "—" and number(np.int64(3), ".1f", int_spec=".1f") == "3.0"
