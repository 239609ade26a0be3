"""MLflow mirror, `harness sync --to mlflow` and `harness ui`, against a real SQLite store and a
real `mlflow server` on 127.0.0.1 (one per module: it takes ~10 s to start)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import warnings
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")

from _fake_results import make_run, make_sweep  # noqa: E402
from harness.config.schema import config_from_dict, load_config  # noqa: E402
from harness.rundir.read import find_run_dirs, flatten, load_run  # noqa: E402
from harness.rundir.layout import MetricsWriter, read_json, read_jsonl  # noqa: E402
from harness.tracking.mlflow_tracker import MlflowTracker, budget_step, metric_key, row_metrics  # noqa: E402
from harness.tracking.base import TrackerSet
from harness.tracking.mirrors import open_trackers  # noqa: E402
import support_paths

REPO = support_paths.REPO


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def client(uri):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def sqlite_uri(root: Path) -> str:
    return f"sqlite:///{root.resolve() / 'mlflow.db'}"


def run_by_id(c, sweep: str, run_id: str):
    exp = c.get_experiment_by_name(sweep)
    assert exp is not None, f"experiment {sweep} missing"
    runs = c.search_runs([exp.experiment_id], f"tags.`harness.run_id` = '{run_id}'")
    return runs


def simulate_trainer(run_dir: Path, ts: TrackerSet, rows: list[dict] | None = None, finish=True):
    """What harness.train.loop.train does with a TrackerSet, replaying a fake run's files."""
    r = load_run(run_dir)
    ts.start(flatten(r.config), {"algorithm": r.algorithm, "sweep": r.sweep, "seed": str(r.seed),
                                 "run_id": r.run_id, "launcher": "pytest"})
    for row in (r.rows if rows is None else rows):
        ts.log(row, row[r.budget_unit])
    if finish:
        for f in [run_dir / "config.yaml", run_dir / "summary.json", *sorted((run_dir / "eval").glob("*.jsonl"))]:
            ts.log_artifact(f)
        ts.finish(r.summary, r.status)
    return r


@pytest.fixture(scope="module")
def sweep_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    make_sweep(root, "demo")
    return root


# ---------------------------------------------------------------------------------------------
# unit-level
# ---------------------------------------------------------------------------------------------
def test_metric_names_and_steps():
    assert metric_key("eval/arith/pass@8") == "eval/arith/pass_at_8"
    assert metric_key("eval/arith/maj@16") == "eval/arith/maj_at_16"
    assert metric_key("perf/peak rss (mb)") == "perf/peak rss _mb_"
    assert budget_step(1024, "samples") == 1024
    assert budget_step(12.3456, "seconds") == 12346  # ms: MLflow steps are integers
    pts = row_metrics({"step": 3, "samples": 384, "tokens": 9000, "seconds": 2.5, "time": 1790000000.25,
                       "train/loss": 0.5, "eval/arith/pass@4": 0.75, "note": "text", "flag": None}, 384, "samples")
    got = {k: (v, ts, st) for k, v, ts, st in pts}
    assert got == {"budget/steps": (3.0, 1790000000250, 384), "budget/samples": (384.0, 1790000000250, 384),
                   "budget/tokens": (9000.0, 1790000000250, 384), "budget/seconds": (2.5, 1790000000250, 384),
                   "train/loss": (0.5, 1790000000250, 384), "eval/arith/pass_at_4": (0.75, 1790000000250, 384)}
    # step derived from the row when the caller passes None (sync), seconds budget in ms
    assert {st for *_, st in row_metrics({"seconds": 2.5, "x": 1.0}, None, "seconds")} == {2500}


def test_missing_package_or_bad_uri_warns_and_run_goes_on(tmp_path, monkeypatch):
    cfg = load_config(overrides=[f"output_dir={tmp_path}", "name=sw", "tracking.mlflow=true"])
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow -> ImportError
    with pytest.warns(RuntimeWarning, match="MLflow tracking disabled"):
        ts = open_trackers(cfg, tmp_path / "sw" / "r", "r", "sw")
    assert ts.trackers == []
    monkeypatch.delitem(sys.modules, "mlflow")

    # a config's tracking.mlflow_uri is checked when it loads; $MLFLOW_TRACKING_URI is not
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus-scheme://nowhere")
    cfg = load_config(overrides=[f"output_dir={tmp_path}", "name=sw", "tracking.mlflow=true"])
    ts = open_trackers(cfg, tmp_path / "sw" / "r", "r", "sw")
    assert [t.name for t in ts.trackers] == ["mlflow"]
    t0 = time.time()
    with pytest.warns(RuntimeWarning, match=r"tracker 'mlflow' failed in start\(\)"):
        ts.start({}, {})
    ts.log({"step": 1, "samples": 8, "train/loss": 1.0}, 8)  # dropped mirror: no second warning, no error
    ts.finish({}, "finished")
    assert ts.trackers == [] and time.time() - t0 < 20


# ---------------------------------------------------------------------------------------------
# SQLite store, read back with MlflowClient
# ---------------------------------------------------------------------------------------------
def test_live_tracker_logs_to_sqlite_and_reads_back(sweep_root, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = next(d for d in find_run_dirs(sweep_root / "demo") if d.name.startswith("grpo-s0-"))
    cfg = config_from_dict(load_run(run_dir).config)
    tr = MlflowTracker(cfg, run_dir, run_dir.name, "demo")
    assert tr.uri == sqlite_uri(sweep_root)
    ts = TrackerSet([tr])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # any tracker failure fails the test
        r = simulate_trainer(run_dir, ts)
    assert ts.trackers == [tr]

    c = client(sqlite_uri(sweep_root))
    runs = run_by_id(c, "demo", r.run_id)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == r.run_id and run.info.status == "FINISHED"
    # params: the flattened resolved config
    p = run.data.params
    assert p["train.lr"] == str(cfg.train.lr) == "0.0001"
    assert p["algorithm.name"] == "grpo" and p["budget.unit"] == "samples" and p["eval.n"] == "8"
    assert p["sampling.samples_per_prompt"] == "16" and p["seed"] == "0"
    # tags
    t = run.data.tags
    assert (t["algorithm"], t["sweep"], t["seed"], t["run_id"], t["harness.run_id"]) == \
        ("grpo", "demo", "0", r.run_id, r.run_id)
    assert t["launcher"] == "pytest" and t["harness.status"] == "finished"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    if head:
        assert t["mlflow.source.git.commit"] == head
    # metric histories: step = samples consumed, timestamp = the row's time, values exact
    rows = read_jsonl(run_dir / "metrics.jsonl")
    hist = sorted((m.step, m.value, m.timestamp) for m in c.get_metric_history(run.info.run_id, "eval/arith/acc"))
    want = sorted((row["samples"], row["eval/arith/acc"], int(round(row["time"] * 1000)))
                  for row in rows if "eval/arith/acc" in row)
    assert hist == want and [h[0] for h in hist] == [0, 256, 512, 768, 1024]
    rew = sorted((m.step, m.value) for m in c.get_metric_history(run.info.run_id, "rollout/reward_mean"))
    assert rew == sorted((row["samples"], row["rollout/reward_mean"]) for row in rows if "rollout/reward_mean" in row)
    assert len(rew) == 8
    # run-level metrics (runs-table columns): final eval, maj/pass@k, peak memory, wall-clock
    s = read_json(run_dir / "summary.json")
    m = run.data.metrics
    assert m["final/arith/acc"] == s["final_eval"]["eval/arith/acc"]
    assert m["final/arith/maj_at_8"] == s["final_eval"]["eval/arith/maj@8"]
    assert m["final/arith/pass_at_8"] == s["final_eval"]["eval/arith/pass@8"]
    assert m["initial/arith/acc"] == s["initial_eval"]["eval/arith/acc"]
    assert m["eval/arith/pass_at_8"] == s["final_eval"]["eval/arith/pass@8"]
    assert m["peak/rss_mb"] == s["peak"]["rss_mb"] and m["peak/rss_above_base_mb"] == s["peak"]["rss_above_base_mb"]
    assert m["wall_seconds"] == s["wall_seconds"] and m["budget/consumed"] == 1024
    assert m["budget/tokens"] == s["budget"]["consumed"]["tokens"]
    # artifacts
    top = {a.path for a in c.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "summary.json", "eval"} <= top
    assert {a.path for a in c.list_artifacts(run.info.run_id, "eval")} == {"eval/arith_0.jsonl", "eval/arith_8.jsonl"}
    local = Path(c.download_artifacts(run.info.run_id, "summary.json", str(sweep_root / "dl")))
    assert json.loads(local.read_text())["final_eval"] == s["final_eval"]


def test_reopening_a_run_id_resumes_the_same_mlflow_run(sweep_root, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = next(d for d in find_run_dirs(sweep_root / "demo") if d.name.startswith("grpo-s1-"))
    r = load_run(run_dir)
    # killed right after the evaluation at step 4 (where the trainer checkpoints)
    cut = next(i for i, row in enumerate(r.rows) if row["step"] == 4 and "eval/arith/acc" in row) + 1
    first = MlflowTracker(r.config, run_dir, r.run_id, "demo")
    first.flush_seconds = 3600  # only evaluation rows force a flush
    simulate_trainer(run_dir, TrackerSet([first]), rows=r.rows[:cut], finish=False)
    assert first.resumed is False and first._buffer == []  # the eval row flushed everything before it
    c = client(sqlite_uri(sweep_root))
    assert [m.step for m in c.get_metric_history(first.mlflow_run_id, "eval/arith/acc")] == [0, 256, 512]
    assert c.get_run(first.mlflow_run_id).info.status == "RUNNING"
    second = MlflowTracker(r.config, run_dir, r.run_id, "demo")  # trainer resumes from the checkpoint
    simulate_trainer(run_dir, TrackerSet([second]), rows=r.rows[cut:])
    assert second.resumed is True and second.mlflow_run_id == first.mlflow_run_id
    runs = run_by_id(c, "demo", r.run_id)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = [m.step for m in c.get_metric_history(first.mlflow_run_id, "train/grad_norm")]
    assert sorted(steps) == [128 * i for i in range(1, 9)]  # every step exactly once


# ---------------------------------------------------------------------------------------------
# mlflow server started by `harness ui` (own process group), REST API, dead URI + sync
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ui_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    client(sqlite_uri(root)).search_experiments()  # an empty store: `harness ui` refuses a folder without one
    port = free_port()
    log = open(root / "ui.log", "w+")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli.main", "ui", str(root), "--port", str(port)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    server_pgid = None
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            text = (root / "ui.log").read_text()
            if server_pgid is None and "process group" in text:
                server_pgid = int(text.split("process group ")[1].split(";")[0])
            if "ready:" in text:
                break
            assert proc.poll() is None, f"harness ui exited early:\n{text}"
            time.sleep(0.3)
        else:
            raise AssertionError(f"mlflow server not ready in time:\n{(root / 'ui.log').read_text()}")
        yield {"root": root, "url": url, "proc": proc, "server_pgid": server_pgid, "port": port, "log": root / "ui.log"}
    finally:  # whatever a test did, leave no process behind
        for pg in (proc.pid, server_pgid):
            if pg:
                try:
                    os.killpg(pg, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.wait(10)
        log.close()


def rest(url: str, path: str, body: dict | None = None, **query) -> dict:
    full = f"{url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(full, data=data, headers={"Content-Type": "application/json"},
                                 method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_server_serves_synced_sweep_over_rest(ui_server, monkeypatch):
    from harness.tracking.sync import sync

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root, url = ui_server["root"], ui_server["url"]
    sweep = make_sweep(root, "rest")
    results = sync(sweep, "mlflow", echo=lambda s: None)  # default store: <root>/mlflow.db, which the UI serves
    assert len(results) == 7 and all(res["created"] for res in results)

    exp = rest(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="rest")["experiment"]
    found = rest(url, "/api/2.0/mlflow/runs/search",
                 {"experiment_ids": [exp["experiment_id"]], "filter": "tags.algorithm = 'grpo'", "max_results": 100})
    runs = found["runs"]
    assert sorted(r["info"]["run_name"] for r in runs) == sorted(d.name for d in sweep.iterdir() if d.name.startswith("grpo-"))
    one = runs[0]
    run_dir = sweep / one["info"]["run_name"]
    s = read_json(run_dir / "summary.json")
    params = {p["key"]: p["value"] for p in one["data"]["params"]}
    metrics = {m["key"]: m["value"] for m in one["data"]["metrics"]}
    assert params["train.lr"] == "0.0001" and params["algorithm.name"] == "grpo"
    assert metrics["final/arith/acc"] == s["final_eval"]["eval/arith/acc"]
    assert metrics["final/arith/pass_at_8"] == s["final_eval"]["eval/arith/pass@8"]
    assert metrics["peak/rss_mb"] == s["peak"]["rss_mb"] and metrics["wall_seconds"] == s["wall_seconds"]
    hist = rest(url, "/api/2.0/mlflow/metrics/get-history", run_id=one["info"]["run_id"], metric_key="eval/arith/acc")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert sorted((int(m["step"]), m["value"]) for m in hist["metrics"]) == \
        sorted((row["samples"], row["eval/arith/acc"]) for row in rows if "eval/arith/acc" in row)
    arts = rest(url, "/api/2.0/mlflow/artifacts/list", run_id=one["info"]["run_id"])
    assert {"config.yaml", "summary.json", "eval"} <= {f["path"] for f in arts["files"]}
    failed = rest(url, "/api/2.0/mlflow/runs/search",
                  {"experiment_ids": [exp["experiment_id"]], "filter": "attributes.status = 'FAILED'"})["runs"]
    assert [r["info"]["run_name"] for r in failed] == [d.name for d in sweep.iterdir() if d.name.startswith("ppo-s2-")]
    with urllib.request.urlopen(url + "/", timeout=30) as resp:  # the UI itself
        assert resp.status == 200 and b"<html" in resp.read().lower()


def test_dead_uri_keeps_run_intact_then_sync_fills_in_without_duplicates(ui_server, tmp_path, monkeypatch):
    from harness.cli.main import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    src = make_run(tmp_path / "fake", "deadsweep", "grpo", 0, 8,
                   overrides={"tracking": {"mlflow": True, "mlflow_uri": dead}})
    src_rows, summary = read_jsonl(src / "metrics.jsonl"), read_json(src / "summary.json")
    # the "trainer": JSONL always written, MLflow mirror through open_trackers
    results = tmp_path / "results"
    cfg = config_from_dict({**load_run(src).config, "output_dir": str(results)})
    run_dir = results / "deadsweep" / src.name
    run_dir.mkdir(parents=True)
    for f in ("config.yaml", "summary.json"):
        (run_dir / f).write_bytes((src / f).read_bytes())
    (run_dir / "eval").mkdir()
    for f in (src / "eval").iterdir():
        (run_dir / "eval" / f.name).write_bytes(f.read_bytes())
    t0 = time.time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ts = open_trackers(cfg, run_dir, src.name, "deadsweep")
        writer = MetricsWriter(run_dir / "metrics.jsonl")
        ts.start({}, {})
        for row in src_rows:
            ts.log(writer.write(row), row["samples"])
        writer.close()
        ts.finish(summary, "finished")
    elapsed = time.time() - t0
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "mlflow" in msgs[0] and "harness sync" in msgs[0], msgs
    assert ts.trackers == [] and elapsed < 20, elapsed  # fails fast, not minutes of retries
    assert read_jsonl(run_dir / "metrics.jsonl") == src_rows  # the run is intact

    url = ui_server["url"]
    assert main(["sync", str(results), "--to", "mlflow", "--uri", url]) == 0
    c = client(url)
    runs = run_by_id(c, "deadsweep", src.name)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    rid = runs[0].info.run_id

    def counts():
        return {k: len(c.get_metric_history(rid, k)) for k in c.get_run(rid).data.metrics}

    first = counts()
    assert first["eval/arith/acc"] == 5 and first["rollout/reward_mean"] == 8 and first["final/arith/acc"] == 1
    assert first["budget/samples"] == len({row["samples"] for row in src_rows})  # (step, value) pairs
    assert main(["sync", str(results), "--to", "mlflow", "--uri", url]) == 0
    assert len(run_by_id(c, "deadsweep", src.name)) == 1
    assert counts() == first  # second sync: no duplicate points, no duplicate run


def test_ui_ctrl_c_stops_the_whole_process_group(ui_server):
    proc, pgid, port = ui_server["proc"], ui_server["server_pgid"], ui_server["port"]
    assert pgid and pgid != os.getpgid(0) and pgid != proc.pid  # the server has its own group
    members = subprocess.run(["ps", "-o", "pid=", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    assert len(members) >= 2  # mlflow CLI + uvicorn worker
    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C
    assert proc.wait(30) == 0
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("mlflow server process group still alive after Ctrl-C")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert "stopping MLflow UI" in ui_server["log"].read_text()
