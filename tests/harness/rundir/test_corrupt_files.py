"""Reading run directories whose files are corrupted, forged or odd (issue 25): ``summary.json``
that is ``[1]``, binary, nested 100,000 deep, a symlink to ``/dev/zero``, a FIFO or too large;
``metrics.jsonl`` that is a FIFO or has rows whose counters are strings; a summary that says
``finished`` on a run stopped part-way; ``wall_seconds`` made negative by a clock stepping back.
Reading is bounded (a size cap before reading, regular files only), never blocks and never
raises: the run reads as ``unreadable`` / ``unverified`` with the reason, and `harness report`
reports the good runs and lists the bad ones. No training here (fake results directories)."""
from __future__ import annotations

import json
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from _fake_results import make_run, make_sweep  # noqa: E402

from harness.cli.main import main  # noqa: E402
from harness.config.schema import load_config  # noqa: E402
from harness.report.build import build_report  # noqa: E402
from harness.rundir import layout  # noqa: E402
from harness.rundir.layout import (MetricsWriter, RunFileError, load_json, read_json, read_jsonl,  # noqa: E402
                                   read_metrics)
from harness.rundir.read import UNREADABLE, UNVERIFIED, find_run_dirs, is_run_dir, load_run, summary_metrics  # noqa: E402
from harness.rundir.summary import mark_interrupted, read_summary, record_end  # noqa: E402
from harness.sweep.plan import _disk_state  # noqa: E402


@contextmanager
def deadline(seconds: int = 20):
    """Fail (rather than hang the suite) if the body blocks, e.g. on a FIFO."""
    def _timeout(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    prev = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, prev)


def _corrupt(path: Path, kind: str) -> None:
    """Replace ``path`` with a file of ``kind``."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "list":
        path.write_text("[1]")
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 8)
    elif kind == "deep-array":
        path.write_text("[" * 100_000 + "]" * 100_000)                 # RecursionError in json
    elif kind == "deep-object":
        path.write_text('{"a":' * 500 + "1" + "}" * 500)               # parses; recursion later
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")                                   # MemoryError when read whole
    elif kind == "fifo":
        os.mkfifo(path)                                                # blocks whoever opens it
    elif kind == "directory":
        path.mkdir()
    elif kind == "too-large":
        path.write_text(json.dumps({"run_id": "x", "pad": "x" * 4096}))
    else:
        raise ValueError(kind)


KINDS = ["list", "binary", "deep-array", "deep-object", "dev-zero", "fifo", "directory", "too-large"]


# --------------------------------------------------------------------------- 2: summary.json


@pytest.mark.parametrize("kind", KINDS)
def test_unusable_summary_json_reads_as_absent(tmp_path, kind, monkeypatch, caplog):
    if kind == "too-large":
        monkeypatch.setattr(layout, "MAX_JSON_BYTES", 1024)   # the size is refused before reading
    p = tmp_path / "summary.json"
    _corrupt(p, kind)
    with deadline():
        assert read_json(p) is None and read_json(p, {}) == {}
        assert read_summary(tmp_path) is None
        with pytest.raises(RunFileError) as ei:
            load_json(p)
    assert str(ei.value).startswith(f"{p}: ") and "\n" not in str(ei.value)
    assert any(str(p) in r.getMessage() for r in caplog.records)                  # a warning names it


@pytest.mark.parametrize("kind", KINDS)
def test_run_with_unusable_summary_is_listed_unreadable(tmp_path, kind, monkeypatch):
    if kind == "too-large":
        monkeypatch.setattr(layout, "MAX_JSON_BYTES", 1024)
    run = make_run(tmp_path, "s", "grpo", 0, 8)
    _corrupt(run / "summary.json", kind)
    with deadline():
        assert is_run_dir(run)
        r = load_run(run)
    assert r.status == UNREADABLE and r.error.startswith("summary.json: "), r.error
    assert r.summary == {} and r.run_id == run.name
    assert r.rows                                                                  # metrics.jsonl is still read


def test_run_with_only_an_unusable_summary_is_listed_by_report_skipped_by_sync(tmp_path, caplog):
    d = tmp_path / "s" / "grpo-s0-12345678"
    d.mkdir(parents=True)
    (d / "summary.json").write_text("[1]")
    assert is_run_dir(d) and load_run(d).status == UNREADABLE
    assert find_run_dirs(tmp_path, skip_unreadable=False) == [d]     # `harness report` lists it
    assert find_run_dirs(tmp_path) == []                               # `harness sync` has nothing to replay
    assert any(f"skipped {d}: summary.json: holds an array" in r.getMessage() for r in caplog.records)


def test_summary_fields_of_the_wrong_type_never_raise(tmp_path):
    run = make_run(tmp_path, "s", "grpo", 0, 8)
    s = json.loads((run / "summary.json").read_text())
    s.update(budget=[1], peak="x", params=3, config=[], final_eval=7, initial_eval=None, provenance=[1],
             seed="0", status=5, error={"a": 1}, wall_seconds="long")
    (run / "summary.json").write_text(json.dumps(s))
    r = load_run(run)
    assert r.peak["rss_mb"] is not None and r.budget_consumed is not None and r.wall_seconds is None
    assert summary_metrics(r.summary, "samples") == {}
    assert r.status == "running" and r.seed is None


# --------------------------------------------------------------------------- 6: metrics.jsonl


def test_fifo_metrics_jsonl_is_never_opened(tmp_path, caplog):
    run = make_run(tmp_path, "s", "grpo", 0, 8)
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    with deadline():
        assert read_jsonl(run / "metrics.jsonl") == []
        with pytest.raises(RunFileError, match="FIFO"):
            read_jsonl(run / "metrics.jsonl", strict=True)
        r = load_run(run)
        assert r.status == UNREADABLE and "metrics.jsonl: is a FIFO" in r.error
        assert find_run_dirs(tmp_path) == []                   # `harness sync` skips it, with a warning
        assert find_run_dirs(tmp_path, skip_unreadable=False) == [run]
        with pytest.raises(RunFileError, match="FIFO"):
            MetricsWriter(run / "metrics.jsonl")
    assert any("skipped" in r.getMessage() and "FIFO" in r.getMessage() for r in caplog.records)


def test_sync_skips_a_fifo_run_and_replays_the_others(tmp_path):
    pytest.importorskip("wandb")
    from harness.tracking.sync import sync

    sweep = make_sweep(tmp_path, "s", spec=[("grpo", 0, 8, "finished"), ("ppo", 0, 0, "finished")])
    bad = next(d for d in sweep.iterdir() if d.name.startswith("ppo"))
    (bad / "metrics.jsonl").unlink()
    os.mkfifo(bad / "metrics.jsonl")
    with deadline(120):
        res = sync(sweep, to="wandb", mode="offline", echo=lambda s: None)
    assert [r["run_id"] for r in res] == [next(d.name for d in sweep.iterdir() if d.name.startswith("grpo"))]


def test_metrics_rows_whose_counters_are_not_numbers_are_dropped(tmp_path, caplog):
    p = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "samples": 4, "tokens": 9, "seconds": 0.5}, {"step": "999", "train/loss": 1.0},
            {"step": 2, "samples": "8"}, {"step": 2.5}, {"step": True}, {"step": -1}, {"step": 2, "seconds": 1.0},
            {"time": 5.0}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "x": ' + "[" * 10_000 + "\n")
    got = read_metrics(p)
    assert got == [rows[0], rows[6], rows[7]]
    assert any("step='999'" in r.getMessage() for r in caplog.records)
    # on resume (truncate_after) rows without a step are dropped too, and the rest cut at the step
    w = MetricsWriter(p)
    w.truncate_after(1)
    w.close()
    assert read_jsonl(p) == [rows[0]]


def test_overlong_metrics_line_is_skipped_not_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "MAX_ROW_BYTES", 64)
    p = tmp_path / "metrics.jsonl"
    good = {"step": 1, "samples": 2}
    p.write_text(json.dumps({"step": 0, "pad": "x" * 1000}) + "\n" + json.dumps(good) + "\n")
    assert read_jsonl(p) == [good]


# --------------------------------------------------------------------------- 4: a forged "finished"


def _forge(run: Path, **extra) -> dict:
    s = {"status": "finished", "run_id": run.name, **extra}
    (run / "summary.json").write_text(json.dumps(s))
    return s


def test_forged_finished_on_a_run_stopped_part_way_is_unverified(tmp_path):
    run = make_run(tmp_path, "s", "grpo", 0, 8, status="running")          # stopped at step 3 of 8
    _forge(run)
    r = load_run(run)
    assert r.status == UNVERIFIED and r.error.startswith("summary.json says finished, but "), r.error
    # a whole finished summary (budget, consumed, final_eval) forged onto it: the rows do not bear it out
    s = json.loads((make_run(tmp_path, "t", "grpo", 0, 8) / "summary.json").read_text())
    s["run_id"] = run.name
    (run / "summary.json").write_text(json.dumps(s))
    r = load_run(run)
    assert r.status == UNVERIFIED and "metrics.jsonl ends at" in r.error, r.error


@pytest.mark.parametrize("edit", ["final_eval", "consumed", "no-final-eval", "amount", "metrics-deleted"])
def test_edited_finished_summary_is_unverified(tmp_path, edit):
    run = make_run(tmp_path, "s", "grpo", 0, 8)
    assert load_run(run).status == "finished"
    s = json.loads((run / "summary.json").read_text())
    if edit == "final_eval":
        s["final_eval"]["eval/arith/acc"] = 0.99
    elif edit == "consumed":
        s["budget"]["consumed"]["samples"] += 128
    elif edit == "no-final-eval":
        s["final_eval"] = {}
    elif edit == "amount":
        s["budget"]["amount"] *= 2
    else:
        (run / "metrics.jsonl").unlink()
    (run / "summary.json").write_text(json.dumps(s))
    r = load_run(run)
    assert r.status == UNVERIFIED and r.error, edit


def test_sweep_does_not_count_a_forged_finished_run(tmp_path, caplog):
    cfg = load_config(None, [f"output_dir={tmp_path}", "budget.unit=steps", "budget.amount=8"])
    run = make_run(tmp_path, "s", "grpo", 0, 8, status="running", unit="steps")
    _forge(run)
    assert _disk_state(run, cfg) == "unverified"
    assert any("not trusted" in r.getMessage() for r in caplog.records)
    assert mark_interrupted(run, run.name, {"budget": {"unit": "steps", "amount": 8}}) == "interrupted"
    good = make_run(tmp_path, "s", "ppo", 0, 0, unit="steps")
    assert _disk_state(good, cfg) == "finished"


# --------------------------------------------------------------------------- 7: clock stepping back


def test_negative_wall_seconds_is_not_reported(tmp_path):
    run = make_run(tmp_path, "s", "grpo", 0, 8)
    s = json.loads((run / "summary.json").read_text())
    s["wall_seconds"] = -3595.0
    (run / "summary.json").write_text(json.dumps(s))
    r = load_run(run)
    assert r.status == "finished" and r.wall_seconds is None
    assert "wall_seconds" not in summary_metrics(r.summary, "samples")


def test_record_end_takes_the_monotonic_duration():
    perf = {"perf/peak_rss_mb": 1.0, "perf/peak_rss_above_base_mb": 0.5}
    s = {"started": 1_000_000.0 + 3600, "budget": {"unit": "steps", "amount": 1},
         "setup_seconds": {"warmup_wait": 1.0, "warmup_build": 0.0, "initial_eval": 2.0}}
    record_end(s, {"step": 1, "samples": 2, "tokens": 3, "seconds": 4.0}, {}, perf, elapsed=10.0)
    assert s["wall_seconds"] == 7.0 and s["ended"] > 0
    s2 = {"started": s["ended"] + 3600, "budget": {"unit": "steps", "amount": 1}}
    record_end(s2, {"step": 1}, {}, perf)                          # no monotonic duration: never negative
    assert s2["wall_seconds"] == 0.0


# --------------------------------------------------------------------------- 9: the report


def test_report_lists_bad_runs_and_reports_the_good_ones(tmp_path, capsys):
    sweep = make_sweep(tmp_path, "demo")
    runs = {d.name: d for d in sweep.iterdir() if d.is_dir()}
    bad = {}
    for prefix, how in (("grpo-s1-", "binary"), ("grpo-s2-", "list"), ("ppo-s1-", "fifo-metrics"),
                        ("rft-s0-", "forged")):
        d = next(v for k, v in runs.items() if k.startswith(prefix))
        bad[d.name] = how
        if how == "fifo-metrics":
            (d / "metrics.jsonl").unlink()
            os.mkfifo(d / "metrics.jsonl")
        elif how == "forged":
            (d / "metrics.jsonl").write_text("".join(l + "\n" for l in (d / "metrics.jsonl").read_text()
                                                     .splitlines()[:5]))
        else:
            _corrupt(d / "summary.json", how)
    with deadline(120):
        res = build_report(sweep)
    good = {"grpo-s0-", "ppo-s0-"}
    groups = res["table"].attrs["groups"]
    assert sorted(r for ids in groups.values() for r in ids) == sorted(
        n for n in runs if any(n.startswith(g) for g in good))
    listed = dict(line.split(": ", 1) for line in res["unusable"])
    assert set(listed) == set(bad), listed
    assert listed[next(n for n, h in bad.items() if h == "binary")].startswith("summary.json: is not UTF-8")
    assert "metrics.jsonl: is a FIFO" in listed[next(n for n, h in bad.items() if h == "fifo-metrics")]
    assert "says finished, but" in listed[next(n for n, h in bad.items() if h == "forged")]
    md = res["markdown"].read_text()
    assert "## Provenance" in md and all(n in md for n in bad)
    runs_df = res["runs"].set_index("run_id")
    assert all(not runs_df.loc[n, "included"] and runs_df.loc[n, "error"] for n in bad)
    # and through the command line: exit 0, one warning line per bad run
    capsys.readouterr()
    with deadline(120):
        assert main(["report", str(sweep)]) == 0
    err = capsys.readouterr().err
    warned = [ln for ln in err.splitlines() if ln.startswith("harness report: warning: run ")]
    assert len(warned) == len(bad) and "Traceback" not in err
