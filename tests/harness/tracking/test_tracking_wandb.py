"""wandb mirror (offline) and `harness sync --to wandb`, read back with `wandb leet inspect --json`."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("wandb")

from _fake_results import make_run, make_sweep  # noqa: E402
from harness.config.schema import config_from_dict  # noqa: E402
from harness.rundir.read import find_run_dirs, load_run  # noqa: E402
from harness.rundir.layout import read_json, read_jsonl  # noqa: E402
from harness.tracking.wandb_tracker import WandbTracker, wandb_id, wandb_mode  # noqa: E402
from harness.tracking.base import TrackerSet
from harness.tracking.mirrors import open_trackers  # noqa: E402
from support_paths import python_tool  # noqa: E402

WANDB = python_tool("wandb")  # next to sys.executable first: a venv that is not activated has it there


def inspect_records(path: Path) -> list[dict]:
    out = subprocess.run([WANDB, "leet", "inspect", "--json", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def inspect_summary(path: Path) -> dict:
    out = subprocess.run([WANDB, "leet", "inspect", "--summary", "--json", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


@pytest.fixture(autouse=True)
def _offline_env(monkeypatch):
    for k in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(k, raising=False)


def test_mode_resolution(monkeypatch):
    cfg = config_from_dict({})
    assert wandb_mode(cfg) == "offline"  # default: nothing leaves the machine
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode(cfg) == "disabled"
    assert wandb_mode(config_from_dict({"tracking": {"wandb_mode": "online"}})) == "online"  # config wins
    assert wandb_id("demo", "grpo-s0-7b0b50dd") == "demo-grpo-s0-7b0b50dd"
    long = wandb_id("a/b" * 30, "grpo-s0-x")
    assert len(long) <= 64 and "/" not in long


@pytest.mark.skipif(WANDB is None, reason="no wandb CLI beside sys.executable or on PATH")
def test_live_offline_run_read_back_with_leet_inspect(tmp_path):
    run_dir = make_run(tmp_path, "wsweep", "grpo", 1, 8, overrides={"tracking": {"wandb": True}})
    r = load_run(run_dir)
    cfg = config_from_dict(r.config)
    ts = open_trackers(cfg, run_dir, r.run_id, "wsweep")
    assert [t.name for t in ts.trackers] == ["wandb"] and ts.trackers[0].mode == "offline"
    ts.start({}, {"launcher": "pytest"})
    for row in r.rows:
        ts.log(row, row["samples"])
    for f in [run_dir / "config.yaml", run_dir / "summary.json", *sorted((run_dir / "eval").glob("*.jsonl"))]:
        ts.log_artifact(f)
    ts.finish(r.summary, "finished")
    assert len(ts.trackers) == 1  # nothing failed

    (odir,) = offline_runs(run_dir)  # dir under the run directory
    recs = inspect_records(odir)
    run = next(x["run"] for x in recs if x["type"] == "run")
    assert (run["display_name"], run["run_group"], run["job_type"], run["project"], run["run_id"]) == \
        (r.run_id, "wsweep", "grpo", "grpo-harness", f"wsweep-{r.run_id}")
    conf = run["config"]["update"]
    assert conf["train"]["lr"] == pytest.approx(1e-4) and conf["algorithm"]["name"] == "grpo"
    assert conf["budget"] == {"unit": "samples", "amount": 1024, "eval_points": 4}
    assert conf["harness"]["launcher"] == "pytest"
    hist = [x["history"]["item"] for x in recs if x["type"] == "history"]
    assert len(hist) == len(r.rows)  # one history row per metrics.jsonl row
    for h, row in zip(hist, r.rows):
        assert h["budget/consumed"] == row["samples"] and h["budget/steps"] == row["step"]
        for k, v in row.items():
            if "/" in k:
                assert h[k] == pytest.approx(v), k
    evals = [(h["budget/consumed"], h["eval/arith/acc"]) for h in hist if "eval/arith/acc" in h]
    assert evals == [(row["samples"], row["eval/arith/acc"]) for row in r.rows if "eval/arith/acc" in row]
    # issue 26: accuracy in percent for the panels (its section sorts first); the counters are
    # x-axes to pick (hidden from the automatic panels), not charts of their own
    pct = [(h["budget/consumed"], h["accuracy_pct/arith"]) for h in hist if "accuracy_pct/arith" in h]
    assert pct == [(row["samples"], pytest.approx(100 * row["eval/arith/acc"])) for row in r.rows
                   if "eval/arith/acc" in row]
    defined = {x["metric"].get("name"): x["metric"] for x in recs if x["type"] == "metric"}
    for unit in ("steps", "samples", "tokens", "seconds"):
        assert defined[f"budget/{unit}"]["options"].get("hidden") is True
        assert defined[f"budget/{unit}"]["step_metric"] == "budget/consumed"
    assert not defined["budget/consumed"]["options"].get("hidden")
    files = {f["path"] for x in recs if x["type"] == "files" for f in x["files"]["files"]}
    assert {"harness/config.yaml", "harness/summary.json", "harness/eval/arith_8.jsonl"} <= files
    assert any(x["type"] == "exit" and x["exit"].get("exit_code", 0) == 0 for x in recs)

    summ = inspect_summary(odir)
    s = r.summary
    assert summ["state"] == "finished" and summ["summary"]["status"] == "finished"
    assert summ["summary"]["final/arith/acc"] == s["final_eval"]["eval/arith/acc"]
    assert summ["summary"]["final/arith/pass@8"] == s["final_eval"]["eval/arith/pass@8"]
    assert summ["summary"]["final/arith/maj@8"] == s["final_eval"]["eval/arith/maj@8"]
    assert summ["summary"]["peak/rss_mb"] == s["peak"]["rss_mb"]
    assert summ["summary"]["wall_seconds"] == s["wall_seconds"]
    assert summ["summary"]["duration_seconds"] == s["wall_seconds"]  # one duration, live or replayed
    assert summ["summary"]["started"] == r.rows[0]["time"]
    assert summ["config"]["seed"] == 1


@pytest.mark.skipif(WANDB is None, reason="no wandb CLI beside sys.executable or on PATH")
def test_sync_to_wandb_is_idempotent(tmp_path):
    from harness.cli.main import main

    sweep = make_sweep(tmp_path, "ws", spec=[("grpo", 0, 8, "finished"), ("ppo", 0, 0, "finished"),
                                            ("ppo", 2, 0, "failed")])
    assert main(["sync", str(tmp_path), "--to", "wandb"]) == 0
    dirs = {d.name: offline_runs(d) for d in find_run_dirs(sweep)}
    assert all(len(v) == 1 for v in dirs.values()), dirs
    failed_dir = next(d for d in find_run_dirs(sweep) if d.name.startswith("ppo-s2-"))
    summ = inspect_summary(offline_runs(failed_dir)[0])
    assert summ["summary"]["status"] == "failed" and "fake out-of-memory" in summ["summary"]["error"]
    assert summ["exit_code"] == 1

    # second sync: nothing replayed, no new runs
    assert main(["sync", str(sweep), "--to", "wandb"]) == 0
    assert {d.name: offline_runs(d) for d in find_run_dirs(sweep)} == dirs

    # a run that gained rows is replayed once; the outdated replay is set aside, not duplicated
    grpo = next(d for d in find_run_dirs(sweep) if d.name.startswith("grpo-"))
    with open(grpo / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 9, "samples": 1152, "tokens": 0, "seconds": 9.0, "time": 1790000100.0,
                            "rollout/reward_mean": 0.77}) + "\n")
    assert main(["sync", str(sweep), "--to", "wandb"]) == 0
    (new,) = offline_runs(grpo)
    # the outdated replay moved aside whole (wandb names offline runs by the second, so within one
    # second the new replay has the same folder name as the old one: compare contents, not paths)
    (old,) = (grpo / "wandb" / "superseded").iterdir()
    assert old.name == dirs[grpo.name][0].name
    old_hist = [x for x in inspect_records(old) if x["type"] == "history"]
    assert len(old_hist) == len(read_jsonl(grpo / "metrics.jsonl")) - 1
    hist = [x["history"]["item"] for x in inspect_records(new) if x["type"] == "history"]
    assert len(hist) == len(read_jsonl(grpo / "metrics.jsonl"))
    assert hist[-1]["rollout/reward_mean"] == 0.77 and hist[-1]["budget/consumed"] == 1152
    assert read_json(grpo / "wandb" / "harness_sync.json")["run_path"] == str(new)


@pytest.mark.skipif(WANDB is None, reason="no wandb CLI beside sys.executable or on PATH")
def test_resumed_live_run_is_made_whole_by_sync(tmp_path):
    import time

    from harness.tracking.sync import sync

    run_dir = make_run(tmp_path, "wr", "ppo", 0, 0)
    r = load_run(run_dir)
    first = TrackerSet([WandbTracker(r.config, run_dir, r.run_id, "wr")])
    first.start({}, {})
    for row in r.rows[:5]:
        first.log(row, row["samples"])
    first.finish({**r.summary, "status": "interrupted"}, "interrupted")  # Ctrl-C
    time.sleep(1.1)  # offline run directories are named to the second
    second = TrackerSet([WandbTracker(r.config, run_dir, r.run_id, "wr")])  # trainer resumes
    second.start({}, {})
    for row in r.rows[5:]:
        second.log(row, row["samples"])
    with pytest.warns(RuntimeWarning, match="was resumed"):
        second.finish(r.summary, "finished")
    pieces = offline_runs(run_dir)
    assert len(pieces) == 2 and not (run_dir / "wandb" / "harness_sync.json").exists()
    lengths = [sum(x["type"] == "history" for x in inspect_records(p)) for p in pieces]
    assert lengths == [5, len(r.rows) - 5]

    (res,) = sync(run_dir, "wandb", echo=lambda s: None)
    assert res["skipped"] is False
    (whole,) = offline_runs(run_dir)
    hist = [x["history"]["item"] for x in inspect_records(whole) if x["type"] == "history"]
    assert [h["budget/consumed"] for h in hist] == [row["samples"] for row in r.rows]
    assert sorted(p.name for p in (run_dir / "wandb" / "superseded").iterdir()) == sorted(p.name for p in pieces)
    assert sync(run_dir, "wandb", echo=lambda s: None)[0]["skipped"] is True


@pytest.mark.skipif(WANDB is None, reason="no wandb CLI beside sys.executable or on PATH")
def test_replay_carries_the_runs_own_times(tmp_path):
    """Issue 12: a replayed offline run shows when the run logged each row and when it
    started and ended, not when `harness sync` ran."""
    from harness.tracking.sync import sync

    d = make_run(tmp_path, "wtimes", "grpo", 0, 8)
    rows = read_jsonl(d / "metrics.jsonl")
    s = read_json(d / "summary.json")
    s["started"], s["ended"] = rows[0]["time"] - 4.0, rows[-1]["time"] + 1.0
    (d / "summary.json").write_text(json.dumps(s))
    sync(d, "wandb", echo=lambda *_: None)
    (run_path,) = offline_runs(d)
    hist = [r["history"]["item"] for r in inspect_records(run_path) if r.get("type") == "history"]
    assert [h["_timestamp"] for h in hist] == [r["time"] for r in rows]
    summ = inspect_summary(run_path)["summary"]
    # the same span as MLflow's (harness.tracking.base.run_times): from the first row, wall_seconds long
    assert summ["started"] == rows[0]["time"] and summ["ended"] == pytest.approx(rows[0]["time"] + s["wall_seconds"])
    assert summ["duration_seconds"] == s["wall_seconds"]
