"""The MLflow UI opened by `harness ui`, in a real browser (issue 14): a synced sweep opens on
its runs list in the model-training view with the sweep's parent run, and (REST API) every
child run has a chart metric ``eval/<task>/acc``. Headless Chromium; skipped without it."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("mlflow")
pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")

import support_paths  # noqa: E402
from _fake_results import make_sweep  # noqa: E402
from harness.tracking.sync import sync  # noqa: E402

REPO = support_paths.REPO
CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or "")
                 if p and os.path.exists(p)), None)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _rest(url: str, path: str, body: dict | None = None, **query) -> dict:
    full = f"{url}{path}" + ("?" + "&".join(f"{k}={urllib.request.quote(str(v), safe='')}" for k, v in query.items())
                             if query else "")
    req = urllib.request.Request(full, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _text(dom: str) -> str:
    dom = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("uiresults")
    sweep = make_sweep(root, "uisweep")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MLFLOW_TRACKING_URI", None)
    old = os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        sync(sweep, "mlflow", echo=lambda *a: None)  # the default store, <root>/mlflow.db
    finally:
        if old is not None:
            os.environ["MLFLOW_TRACKING_URI"] = old
    port = _free_port()
    log = open(root / "ui.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli.main", "ui", str(root), "--port", str(port)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while "(runs of a sweep" not in (root / "ui.log").read_text():
            assert proc.poll() is None and time.time() < deadline, (root / "ui.log").read_text()
            time.sleep(0.3)
        yield {"url": f"http://127.0.0.1:{port}", "sweep": sweep, "log": (root / "ui.log").read_text()}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        for pg in (proc.pid,):
            try:
                os.killpg(pg, signal.SIGKILL)
            except ProcessLookupError:
                pass
        text = (root / "ui.log").read_text()
        m = re.search(r"process group (\d+);", text)
        if m:
            try:
                os.killpg(int(m.group(1)), signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def test_every_child_run_has_an_accuracy_chart_under_the_sweep_parent(served):
    url = served["url"]
    exp = _rest(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="uisweep")["experiment"]
    assert {t["key"]: t["value"] for t in exp["tags"]}["mlflow.experimentKind"] == "custom_model_development"
    runs = _rest(url, "/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 100})["runs"]
    tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
    parents = [r for r, t in zip(runs, tags) if t.get("harness.sweep_parent") == "uisweep"]
    assert len(parents) == 1 and parents[0]["info"]["run_name"] == "uisweep"
    children = [(r, t) for r, t in zip(runs, tags) if "harness.run_id" in t]
    assert len(children) == sum(1 for d in served["sweep"].iterdir() if d.is_dir())
    for r, t in children:
        assert t["mlflow.parentRunId"] == parents[0]["info"]["run_id"]
        hist = _rest(url, "/api/2.0/mlflow/metrics/get-history", run_id=r["info"]["run_id"],
                     metric_key="eval/arith/acc")["metrics"]
        assert len(hist) >= 2, (t["harness.run_id"], hist)  # a curve over the budget, not one point


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_chromium_opens_the_runs_list_with_the_sweep_parent_run(served):
    links = re.findall(r"sweep uisweep: (\S+)", served["log"])
    assert links and "workflowType=machine_learning" in links[0], served["log"]
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          "--virtual-time-budget=15000", links[0]], capture_output=True, text=True, timeout=180)
    text = _text(out.stdout)
    assert "Model training" in text and "Run Name" in text, text[:2000]
    runs_list = text[text.index("Run Name"):]
    assert "uisweep" in runs_list, runs_list[:2000]  # the parent run, its children grouped under it
    m = re.search(r"(\d+) matching runs", runs_list)
    assert m and int(m.group(1)) == 8, runs_list[:2000]  # the parent and its 7 children
