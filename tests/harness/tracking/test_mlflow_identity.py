"""MLflow run identity, sweep parent runs, experiment kind and replayed times, against a real
SQLite store (issues 12, 13 and 14): the same run from another results folder or after a
restart is its own MLflow run, a second sync adds nothing, replays keep the run's own start
and end times, and the runs of a sweep are children of one parent run named after it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")

from _fake_results import make_run, make_sweep  # noqa: E402
from harness.rundir.layout import read_json, read_jsonl  # noqa: E402
from harness.tracking.sync import run_span  # noqa: E402
from harness.tracking.sync import sync  # noqa: E402


def _client(uri):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def _runs(c, sweep: str, run_id: str | None = None):
    exp = c.get_experiment_by_name(sweep)
    flt = f"tags.`harness.run_id` = '{run_id}'" if run_id else ""
    return c.search_runs([exp.experiment_id], flt, max_results=1000)


def _hist_len(c, run, key="eval/arith/acc") -> int:
    return len(c.get_metric_history(run.info.run_id, key))


def _quiet(*a):
    pass


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"sqlite:///{(tmp_path / 'store' / 'mlflow.db')}"


def _shift_times(run_dir: Path, dt: float) -> None:
    """What `harness train --restart` leaves: the same run directory with a new history."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    with open(run_dir / "metrics.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({**r, "time": r["time"] + dt, "train/loss": 0.123}) + "\n")


def test_same_run_from_two_folders_and_after_restart_never_merges(tmp_path, store):
    (tmp_path / "store").mkdir()
    a = make_run(tmp_path / "a", "ident", "grpo", 0, 8)
    b = make_run(tmp_path / "b", "ident", "grpo", 0, 8)  # same run id, same rows, other folder
    assert a.name == b.name
    sync(a, "mlflow", uri=store, echo=_quiet)
    sync(b, "mlflow", uri=store, echo=_quiet)
    c = _client(store)
    runs = _runs(c, "ident", a.name)
    assert len(runs) == 2
    assert {r.data.tags["harness.run_dir"] for r in runs} == {str(a.resolve()), str(b.resolve())}
    assert all(_hist_len(c, r) == 5 for r in runs)  # nothing doubled

    # a second sync of the same runs adds nothing
    again = sync(tmp_path, "mlflow", uri=store, echo=_quiet)
    assert [r["points"] for r in again] == [0, 0] and not any(r["created"] for r in again)
    assert len(_runs(c, "ident", a.name)) == 2 and all(_hist_len(c, r) == 5 for r in _runs(c, "ident", a.name))

    # after a restart the run directory holds a new history: a new MLflow run, the old one intact
    _shift_times(a, 50_000.0)
    res = sync(a, "mlflow", uri=store, echo=_quiet)
    assert res[0]["created"]
    runs = _runs(c, "ident", a.name)
    assert len(runs) == 3 and all(_hist_len(c, r) == 5 for r in runs)
    assert len({r.data.tags["harness.attempt"] for r in runs}) == 2


def test_replay_keeps_the_runs_own_start_and_end_times(tmp_path, store):
    (tmp_path / "store").mkdir()
    d = make_run(tmp_path / "r", "times", "ppo", 1, 0)
    rows = read_jsonl(d / "metrics.jsonl")
    s = read_json(d / "summary.json")
    s["started"], s["ended"] = rows[0]["time"] - 12.5, rows[-1]["time"] + 3.25  # what the trainer records
    (d / "summary.json").write_text(json.dumps(s))
    sync(d, "mlflow", uri=store, echo=_quiet)
    c = _client(store)
    run = _runs(c, "times", d.name)[0]
    assert run.info.start_time == int(round(s["started"] * 1000))
    assert run.info.end_time == int(round(s["ended"] * 1000))
    assert run.info.end_time - run.info.start_time > 5_000  # not the second the sync took
    # the run-level values are logged once, at the final step, stamped with the run's end
    fin = c.get_metric_history(run.info.run_id, "final/arith/acc")
    assert [(m.step, m.timestamp) for m in fin] == [(1024, int(round(s["ended"] * 1000)))]
    # without `ended` (older runs): started + wall_seconds, else the last row
    assert run_span({"status": "finished", "started": 100.0, "wall_seconds": 5.0}, [{"time": 101.0}]) == (100.0, 105.0)
    assert run_span({"status": "failed"}, [{"time": 7.0}, {"time": 9.0}]) == (7.0, 9.0)
    assert run_span({"status": "running", "started": 3.0}, [{"time": 4.0}]) == (3.0, None)


def test_sweep_parent_run_experiment_kind_and_step_note(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    sweep = make_sweep(tmp_path, "fam")
    sync(sweep, "mlflow", echo=_quiet)
    sync(sweep, "mlflow", echo=_quiet)  # twice: still one parent, no new children
    uri = f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    c = _client(uri)
    exp = c.get_experiment_by_name("fam")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = _runs(c, "fam")
    parents = [r for r in runs if r.data.tags.get("harness.sweep_parent") == "fam"]
    children = [r for r in runs if "harness.run_id" in r.data.tags]
    assert len(parents) == 1 and len(children) == 7 and len(runs) == 8
    parent = parents[0]
    assert parent.info.run_name == "fam" and parent.data.tags["harness.sweep_dir"] == str(sweep.resolve())
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    note = children[0].data.tags["mlflow.note.content"]
    assert "stepped by samples consumed" in note and "final/*" in note
    assert "samples consumed" in parent.data.tags["mlflow.note.content"]
    # a second copy of the sweep in another folder, same store: its own parent
    other = tmp_path / "copy"
    shutil.copytree(sweep, other / "fam")
    sync(other / "fam", "mlflow", uri=uri, echo=_quiet)
    parents = [r for r in _runs(c, "fam") if r.data.tags.get("harness.sweep_parent") == "fam"]
    assert len(parents) == 2 and len(_runs(c, "fam")) == 16
