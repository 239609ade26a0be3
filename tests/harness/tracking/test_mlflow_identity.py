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
from harness.rundir.read import load_run  # noqa: E402
from harness.tracking.base import TrackerSet  # noqa: E402
from harness.tracking.mlflow_tracker import MlflowTracker  # noqa: E402
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


def _ms(t: float) -> int:
    return int(round(t * 1000))


def test_one_duration_per_run_live_or_replayed_and_the_parent_spans_the_sweep(tmp_path, monkeypatch):
    """Issue 26: a run's MLflow start is its first metrics row and, finished in one attempt, its
    duration is summary.json's wall_seconds, whether mirrored live or replayed by `harness sync`;
    a failed run ends at its ``ended``; the sweep's parent run starts with its earliest run and
    ends with its latest."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = [("grpo", 0, 8, "finished"), ("ppo", 1, 0, "finished"), ("ppo", 2, 0, "failed")]
    sweep = make_sweep(tmp_path / "results", "times", spec=spec)
    want = {}
    for d in sorted(sweep.iterdir()):
        rows, s = read_jsonl(d / "metrics.jsonl"), read_json(d / "summary.json")
        s["started"], s["ended"] = rows[0]["time"] - 12.5, rows[-1]["time"] + 3.25  # what the trainer records
        if s["status"] == "failed":
            del s["wall_seconds"]  # the trainer records no wall-clock for a run that raised
            want[d.name] = (_ms(rows[0]["time"]), _ms(s["ended"]))
        else:  # setup (12.5 s) before the first row is not in the run's wall-clock
            want[d.name] = (_ms(rows[0]["time"]), _ms(rows[0]["time"] + s["wall_seconds"]))
        (d / "summary.json").write_text(json.dumps(s))
    replayed = f"sqlite:///{tmp_path / 'replayed.db'}"
    sync(sweep, "mlflow", uri=replayed, echo=_quiet)
    c = _client(replayed)
    got = {r.data.tags["harness.run_id"]: (r.info.start_time, r.info.end_time) for r in _runs(c, "times")
           if "harness.run_id" in r.data.tags}
    assert got == want
    for name, (t0, t1) in got.items():
        s = read_json(sweep / name / "summary.json")
        if "wall_seconds" in s:
            assert t1 - t0 == pytest.approx(1000 * s["wall_seconds"], abs=1)  # MLflow's duration = wall_seconds
        fin = c.get_metric_history(_runs(c, "times", name)[0].info.run_id, "budget/consumed")
        assert [m.timestamp for m in fin] == [t1]  # run-level values are stamped with the run's end
    (parent,) = [r for r in _runs(c, "times") if r.data.tags.get("harness.sweep_parent") == "times"]
    span = (min(t for t, _ in want.values()), max(t for _, t in want.values()))
    assert (parent.info.start_time, parent.info.end_time) == span
    # a parent left ending at the time of an old sync gets the sweep's end back from the next sync;
    # one deleted in the UI is made anew, with its runs moved under it
    c.set_terminated(parent.info.run_id, "FINISHED", end_time=span[1] + 86_400_000)
    sync(sweep, "mlflow", uri=replayed, echo=_quiet)
    assert c.get_run(parent.info.run_id).info.end_time == span[1]
    c.delete_run(parent.info.run_id)
    sync(sweep, "mlflow", uri=replayed, echo=_quiet)
    (again,) = [r for r in _runs(c, "times") if r.data.tags.get("harness.sweep_parent") == "times"]
    assert again.info.run_id != parent.info.run_id and (again.info.start_time, again.info.end_time) == span
    assert {r.data.tags["mlflow.parentRunId"] for r in _runs(c, "times") if "harness.run_id" in r.data.tags} == \
        {again.info.run_id}

    # the same run mirrored live (the trainer's calls) records the same start and end
    live_uri = f"sqlite:///{tmp_path / 'live.db'}"
    d = sorted(sweep.iterdir())[0]
    r = load_run(d)
    tracker = MlflowTracker(r.config, d, r.run_id, "times", uri=live_uri)
    ts = TrackerSet([tracker])
    ts.start({}, {})
    for row in r.rows:
        ts.log(row, row["samples"])
    ts.finish(r.summary, "finished")
    assert ts.trackers == [tracker]
    live = _client(live_uri).get_run(tracker.mlflow_run_id).info
    assert (live.start_time, live.end_time) == want[d.name]
    # the parent made by that live run already spans the whole sweep folder from its files
    (lp,) = [x for x in _runs(_client(live_uri), "times") if x.data.tags.get("harness.sweep_parent") == "times"]
    assert (lp.info.start_time, lp.info.end_time) == (parent.info.start_time, parent.info.end_time)


def test_run_span_cases():
    # one attempt: first row + wall_seconds; the summary's own start (before the warm-up) is not the run's
    assert run_span({"status": "finished", "started": 100.0, "wall_seconds": 5.0}, [{"time": 101.0}]) == (101.0, 106.0)
    # a resumed run spans its attempts: from its first row to the latest attempt's end
    assert run_span({"status": "finished", "started": 200.0, "ended": 230.0, "wall_seconds": 20.0,
                     "resumed_from_step": 4}, [{"time": 101.0}, {"time": 225.0}]) == (101.0, 230.0)
    assert run_span({"status": "failed", "started": 100.0, "ended": 120.0}, [{"time": 101.0}, {"time": 110.0}]) \
        == (101.0, 120.0)
    assert run_span({"status": "failed"}, [{"time": 7.0}, {"time": 9.0}]) == (7.0, 9.0)
    assert run_span({"status": "failed", "started": 3.0, "ended": 5.0}, []) == (3.0, 5.0)  # failed before a row
    assert run_span({"status": "running", "started": 3.0}, [{"time": 4.0}]) == (4.0, None)


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
