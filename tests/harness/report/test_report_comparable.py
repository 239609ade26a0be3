"""The report says what it compares: the config fields that differ between rows (effective values, so
GRPO and PPO differ in their algorithm components and per-algorithm learning rates show), the seeds and
the interval method, paired differences over seeds from the first algorithm, no interval for one seed,
and wall-clock figures from ``wall_seconds`` with the shared warm-up shown apart."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from _fake_results import make_run
from harness.report.aggregate import group_runs, load_sweep_runs, paired_differences, warmup_cost
from harness.report.build import build_report
from harness.report.stats import mean_ci, paired_diff_ci
from harness.report.tables import format_cell, format_diff, formatted_table

LRS = {"grpo": 4e-4, "ppo": 3e-4, "rft": 2e-4}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """grpo and ppo over seeds 0-2, rft on seed 0 only; one learning rate per algorithm."""
    root = tmp_path_factory.mktemp("results")
    for algo, seeds in (("grpo", (0, 1, 2)), ("ppo", (0, 1, 2)), ("rft", (0,))):
        for seed in seeds:
            make_run(root, "cmp", algo, seed, 0, overrides={"train": {"lr": LRS[algo]}})
    return root / "cmp"


@pytest.fixture(scope="module")
def report(sweep, tmp_path_factory):
    return build_report(sweep, tmp_path_factory.mktemp("report"))


def _summaries(sweep: Path) -> dict:
    out: dict = {}
    for d in sorted(sweep.iterdir()):
        s = json.loads((d / "summary.json").read_text())
        out.setdefault(s["algorithm"], {})[s["seed"]] = s
    return out


def test_settings_that_differ_list_per_algorithm_lr_and_components(report):
    md = report["markdown"].read_text()
    assert "## Settings that differ between rows" in md
    title, tid, (header, rows) = next(s for s in report["sections"] if s[1] == "settings-table")
    by_row = {r[0]: dict(zip(header, r)) for r in rows}
    assert set(by_row) == {"grpo", "ppo", "rft"}
    assert [by_row[a]["train.lr"] for a in ("grpo", "ppo", "rft")] == ["0.0004", "0.0003", "0.0002"]
    # effective values: the components the presets fill differ visibly
    assert (by_row["grpo"]["algorithm.advantage"], by_row["ppo"]["algorithm.advantage"]) == ("grpo", "gae")
    assert by_row["ppo"]["algorithm.kl_placement"] == "reward" and by_row["rft"]["algorithm.kl_placement"] == "none"
    # nothing that is the same in every row, and no seeds / paths / tracking
    assert "algorithm.clip_eps" not in header and "seed" not in header and "output_dir" not in header
    assert 'id=\'settings-table\'' in report["html"].read_text()


def test_notes_state_seeds_and_interval_method(report):
    md = report["markdown"].read_text()
    assert "grpo: n=3 runs (seeds 0, 1, 2)" in md and "rft: n=1 run (seed 0)" in md
    assert "Student-t" in md and "paired by seed" in md


def test_paired_differences_vs_first_algorithm(sweep, report):
    title, _, (header, rows) = next(s for s in report["sections"] if s[1] == "paired-table")
    assert title.startswith("Paired differences vs grpo")
    by_row = {r[0]: dict(zip(header, r)) for r in rows}
    assert set(by_row) == {"ppo − grpo", "rft − grpo"}
    s = _summaries(sweep)
    acc = {a: {seed: v["final_eval"]["eval/arith/acc"] for seed, v in runs.items()} for a, runs in s.items()}
    d = paired_diff_ci(acc["ppo"], acc["grpo"])
    assert d["n"] == 3
    want = ("-" if d["mean"] < 0 else "+") + format_cell("arith/acc", abs(d["mean"]), d["half"]) + " (n=3)"
    assert by_row["ppo − grpo"]["arith acc (points)"] == want
    # the paired interval is the t-interval of the per-seed differences, not of the two marginals
    diffs = [acc["ppo"][k] - acc["grpo"][k] for k in (0, 1, 2)]
    assert d["half"] == pytest.approx(mean_ci(diffs)[1])
    # rft has one seed in common with grpo: a difference, no interval
    assert "±" not in by_row["rft − grpo"]["arith acc (points)"]
    assert by_row["rft − grpo"]["arith acc (points)"].endswith("(n=1)")
    base, diffs_ = paired_differences(group_runs([r for r in load_sweep_runs(sweep)]), ["wall_seconds"])
    assert base == "grpo" and diffs_["ppo"]["wall_seconds"]["seeds"] == [0, 1, 2]


def test_single_seed_row_shows_no_interval(report):
    fdf = formatted_table(report["table"])
    assert not any("±" in str(c) for c in fdf.loc["rft"])
    assert any("±" in str(c) for c in fdf.loc["grpo"])


def test_wall_clock_comes_from_wall_seconds_without_the_warmup(tmp_path):
    """A seed that built the shared warm-up (or waited for its lock) records it as warmup_seconds, apart
    from wall_seconds: the report's wall-clock is the mean of wall_seconds, the warm-up its own column,
    and the wall-clock interval stays above zero."""
    warm = {0: 300.0, 1: 0.0, 2: 0.5}  # seed 0 trained the warm-up, the others found it cached
    for seed in (0, 1, 2):
        d = make_run(tmp_path, "wu", "grpo", seed, 0)
        s = json.loads((d / "summary.json").read_text())
        s["warmup_seconds"] = warm[seed]
        (d / "summary.json").write_text(json.dumps(s))
    res = build_report(tmp_path / "wu")
    df = res["table"]
    walls = [json.loads((d / "summary.json").read_text())["wall_seconds"] for d in sorted((tmp_path / "wu").iterdir())
             if (d / "summary.json").exists()]
    mean, half, n = mean_ci(walls)
    assert df.at["grpo", ("wall_seconds", "mean")] == pytest.approx(mean) and n == 3
    assert df.at["grpo", ("wall_seconds", "ci95")] == pytest.approx(half)
    assert mean - half > 0  # the 300 s warm-up would have sent the interval below zero
    assert df.at["grpo", ("warmup_seconds", "mean")] == pytest.approx(sum(warm.values()) / 3)
    assert "warm-up (s)" in formatted_table(df).columns
    assert "warmup_seconds" in res["runs"].columns
    # the warm-up has no paired difference (it is shared, not the algorithm's cost)
    assert "warm-up" not in " ".join(h for s in res["sections"] for h in s[2][0])


def test_no_warmup_column_when_runs_do_not_record_it(report):
    assert "warmup_seconds" not in set(report["table"].columns.get_level_values(0))


def test_warmup_built_before_the_runs_shows_its_build_time(tmp_path):
    """`harness quickstart` builds the warm-up before the sweep: every run then finds it cached and
    spends ~0 s on it, but the cache entry records its 41.5 s build, which is what the column shows
    (the same for each run that starts from it); a run from no warm-up has none."""
    for seed, spent in ((0, 0.0), (1, 0.01)):
        d = make_run(tmp_path, "qs", "grpo", seed, 0)
        s = json.loads((d / "summary.json").read_text())
        s["warmup_seconds"] = spent
        s["start"] = {"source": "results/_cache/warmup/tiny-abc", "cached": True, "seconds": 41.5, "steps": 600}
        (d / "summary.json").write_text(json.dumps(s))
    res = build_report(tmp_path / "qs")
    assert res["table"].at["grpo", ("warmup_seconds", "mean")] == pytest.approx(41.5)
    assert list(res["runs"]["warmup_seconds"]) == [41.5, 41.5]
    assert warmup_cost({"start": {"source": "HuggingFaceTB/SmolLM2"}}) is None
    assert warmup_cost({"start": {"source": "x"}, "warmup_seconds": 2.0}) == 2.0  # an older summary


def test_a_paired_difference_of_rates_keeps_its_negative_side():
    """A difference of accuracies may be negative: its interval is never cut at 0 as an accuracy's
    is. Seeds differ by +0.5, -1.0, +0.5 points: mean 0, s = 0.866, t(0.975, 2) = 4.303,
    half-width 2.15 points."""

    d = paired_diff_ci({0: 0.730, 1: 0.720, 2: 0.710}, {0: 0.725, 1: 0.730, 2: 0.705})
    assert abs(d["half"] - 4.302653 * 0.00866025 / 3 ** 0.5) < 1e-6
    assert format_diff("final_eval.eval/arith/acc", d) == "+0.0 ± 2.2 (n=3)"
    # an accuracy's own interval is still cut at 0%
    assert format_cell("final_eval.eval/arith/acc", 0.01, 0.03) == "1.0 [0.0, 4.0]"


def test_a_baseline_takes_the_paired_differences_from_its_row(sweep, tmp_path):
    """`harness report --baseline ppo` (or the sweep file's report.baseline, recorded in sweep.json): every
    other row minus PPO's, paired by seed; a baseline given on the command line that matches no row is refused
    before anything is written; one recorded in sweep.json that matches no finished run is a note."""
    from harness.cli.main import main as cli_main
    from harness.foundation.base import ConfigError
    res = build_report(sweep, tmp_path / "a", baseline="ppo")
    title, _, (header, rows) = next(s for s in res["sections"] if s[1] == "paired-table")
    assert title.startswith("Paired differences vs ppo")
    by_row = {r[0]: dict(zip(header, r)) for r in rows}
    assert set(by_row) == {"grpo − ppo", "rft − ppo"}
    acc = {a: {seed: v["final_eval"]["eval/arith/acc"] for seed, v in runs.items()}
           for a, runs in _summaries(sweep).items()}
    d = paired_diff_ci(acc["grpo"], acc["ppo"])
    want = ("-" if d["mean"] < 0 else "+") + format_cell("arith/acc", abs(d["mean"]), d["half"]) + " (n=3)"
    assert by_row["grpo − ppo"]["arith acc (points)"] == want
    with pytest.raises(ConfigError, match="--baseline 'dapo' matches no row of finished runs"):
        build_report(sweep, tmp_path / "b", baseline="dapo")
    assert not (tmp_path / "b").exists()
    assert cli_main(["report", str(sweep), "--output-dir", str(tmp_path / "c"), "--baseline", "ppo"]) == 0
    assert "Paired differences vs ppo" in (tmp_path / "c" / "report.md").read_text()
    # recorded by harness sweep
    (sweep / "sweep.json").write_text(json.dumps({"name": "cmp", "report": {"study": False, "baseline": "rft"}}))
    try:
        res = build_report(sweep, tmp_path / "d")
        assert next(s for s in res["sections"] if s[1] == "paired-table")[0].startswith("Paired differences vs rft")
        (sweep / "sweep.json").write_text(json.dumps({"name": "cmp", "report": {"study": False, "baseline": "dapo"}}))
        md = build_report(sweep, tmp_path / "e")["markdown"].read_text()
        assert "report.baseline 'dapo': no finished run of that algorithm" in md and "Paired differences vs grpo" in md
    finally:
        (sweep / "sweep.json").unlink()


def test_a_knob_left_out_at_its_default_reads_as_the_default(tmp_path):
    """config.yaml leaves the later knobs out at their defaults (train.staleness 0, algorithm.correction none): rows
    are labelled, ordered and compared by the value in force, never by a gap (None)."""
    from harness.report.aggregate import differing_settings
    from harness.rundir.read import RunData

    def run(name, config):
        return RunData(run_dir=tmp_path / name, run_id=name, sweep="s", algorithm="grpo", seed=0, status="finished",
                       error=None, summary={}, config={"algorithm": {"name": "grpo"}, **config})

    late = {"train": {"staleness": 4}, "algorithm": {"name": "grpo", "correction": "seq_mask"}}
    runs = [run("a", {}), run("b", late)]
    groups = group_runs(runs)
    assert list(groups) == ["grpo (algorithm.correction=none, train.staleness=0)",
                            "grpo (algorithm.correction=seq_mask, train.staleness=4)"]
    keys, rows = differing_settings(groups)
    assert keys == ["algorithm.correction", "train.staleness"]
    assert rows["grpo (algorithm.correction=none, train.staleness=0)"] == {"algorithm.correction": "none",
                                                                         "train.staleness": "0"}


def test_a_resumed_runs_partial_wall_clock_is_left_out_and_said(tmp_path):
    """A run resumed after an interruption keeps only its last attempt's wall_seconds (train time counts every attempt):
    the table's wall-clock is the other seeds' mean, the report names the run, and its train time still counts."""
    for seed in (0, 1, 2):
        d = make_run(tmp_path, "rs", "grpo", seed, 0)
        s = json.loads((d / "summary.json").read_text())
        s["wall_seconds"] = {0: 100.0, 1: 10.0, 2: 120.0}[seed]
        if seed == 1:
            s["resumed_from_step"] = 40
            resumed_id = s["run_id"]
        (d / "summary.json").write_text(json.dumps(s))
    res = build_report(tmp_path / "rs")
    df = res["table"]
    assert df.at["grpo", ("wall_seconds", "mean")] == pytest.approx(110.0) and df.at["grpo", ("wall_seconds", "n")] == 2
    assert df.at["grpo", ("train_seconds", "n")] == 3
    md = (tmp_path / "rs" / "report" / "report.md").read_text()
    assert f"wall-clock leaves out 1 run(s) resumed after an interruption ({resumed_id})" in md
