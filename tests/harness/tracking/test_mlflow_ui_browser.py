"""The MLflow UI opened by `harness ui`, in a real browser (issues 14 and 26): the link it prints
for a synced sweep opens, in a fresh Chromium profile and with no click, the model-training
chart view with the runs grouped by algorithm and the percent accuracy chart first (GRPO and
PPO drawn in their group colours), the budget counters last; over REST, every child run has
its accuracy curves, the parent run spans the sweep and holds the report `harness sync`
attached; the server's own output stays in its log. One `harness ui`, one browser session.

Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
stdlib only); skipped without Chromium. ``HARNESS_DOC_IMAGES=1`` also writes the screenshot to
docs/img/mlflow-ui-after.png."""
from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

pytest.importorskip("mlflow")
pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")

import support_paths  # noqa: E402
from _fake_results import make_sweep  # noqa: E402
from harness.rundir.layout import read_json, read_jsonl  # noqa: E402
from harness.tracking.base import dir_run_times  # noqa: E402
from harness.tracking.mlflow_view import SHARE_PREFIX, VIEW_TAG, decode_view, group_color  # noqa: E402
from harness.tracking.sync import sync  # noqa: E402

REPO = support_paths.REPO
CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or "")
                 if p and os.path.exists(p)), None)
HINT = "(each link opens"


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _rest(url: str, endpoint: str, body: dict | None = None, **query) -> dict:
    full = f"{url}{endpoint}" + ("?" + "&".join(f"{k}={urllib.request.quote(str(v), safe='')}" for k, v in query.items())
                             if query else "")
    req = urllib.request.Request(full, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


class Chromium:
    """One headless Chromium (fresh profile) driven over the DevTools protocol on a pipe: the
    browser reads commands on fd 3 and writes replies on fd 4, NUL-terminated JSON."""

    def __init__(self, exe: str, width: int = 1600, height: int = 1000):
        self.profile = tempfile.mkdtemp(prefix="harness-chromium-")
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (to_r, from_w)]  # clear of 3 and 4
        for fd in (to_r, from_w):
            os.close(fd)

        def child():
            os.dup2(ends[0], 3)
            os.dup2(ends[1], 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--no-default-browser-check", f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "about:blank"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=child, start_new_session=True)
        for fd in ends:
            os.close(fd)
        self.w, self.r = os.fdopen(to_w, "wb", buffering=0), os.fdopen(from_r, "rb", buffering=0)
        self.buf, self.n, self.session = b"", 0, None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params):
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        self.w.write(json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self.buf:
                chunk = self.r.read(1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.n:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def eval(self, js: str):
        res = self.call("Runtime.evaluate", expression=js, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(res["exceptionDetails"])
        return res["result"].get("value")

    def wait(self, js: str, timeout: float = 90.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = self.eval(js)
            if value:
                return value
            time.sleep(0.25)
        return None

    def screenshot(self, path) -> None:
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.proc.wait(15)
        except Exception:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("uiresults")
    sweep = make_sweep(root, "uisweep")
    report = sweep / "report"  # what `harness report` writes; `harness sync` attaches it to the parent run
    (report / "plots").mkdir(parents=True)
    (report / "report.html").write_text("<html><body>GRPO vs PPO</body></html>")
    (report / "plots" / "accuracy.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MLFLOW_TRACKING_URI", None)
    old = os.environ.pop("MLFLOW_TRACKING_URI", None)
    lines: list[str] = []
    try:
        t0 = time.time()
        sync(sweep, "mlflow", echo=lines.append)  # the default store, <root>/mlflow.db
        sync_seconds = time.time() - t0
    finally:
        if old is not None:
            os.environ["MLFLOW_TRACKING_URI"] = old
    port = _free_port()
    log = open(root / "ui.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli.main", "ui", str(root), "--port", str(port)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while HINT not in (root / "ui.log").read_text():
            assert proc.poll() is None and time.time() < deadline, (root / "ui.log").read_text()
            time.sleep(0.3)
        yield {"url": f"http://127.0.0.1:{port}", "root": root, "sweep": sweep, "sync_lines": lines,
               "sync_seconds": sync_seconds, "log": (root / "ui.log").read_text()}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        m = re.search(r"process group (\d+);", (root / "ui.log").read_text())
        if m:
            try:
                os.killpg(int(m.group(1)), signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def test_sweep_in_mlflow_children_parent_span_report_and_saved_view(served):
    url, sweep = served["url"], served["sweep"]
    exp = _rest(url, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="uisweep")["experiment"]
    etags = {t["key"]: t["value"] for t in exp["tags"]}
    assert etags["mlflow.experimentKind"] == "custom_model_development"
    runs = _rest(url, "/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 100})["runs"]
    tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
    parents = [r for r, t in zip(runs, tags) if t.get("harness.sweep_parent") == "uisweep"]
    assert len(parents) == 1 and parents[0]["info"]["run_name"] == "uisweep"
    children = [(r, t) for r, t in zip(runs, tags) if "harness.run_id" in t]
    assert len(children) == sum(1 for d in sweep.iterdir() if (d / "metrics.jsonl").exists()) == 7
    for r, t in children:
        assert t["mlflow.parentRunId"] == parents[0]["info"]["run_id"]
        rows = read_jsonl(sweep / t["harness.run_id"] / "metrics.jsonl")
        for key, scale in (("eval/arith/acc", 1.0), ("accuracy_pct/arith", 100.0)):  # fraction kept, percent added
            hist = _rest(url, "/api/2.0/mlflow/metrics/get-history", run_id=r["info"]["run_id"], metric_key=key)
            want = sorted((row["samples"], scale * row["eval/arith/acc"]) for row in rows if "eval/arith/acc" in row)
            got = sorted((int(m["step"]), m["value"]) for m in hist["metrics"])
            assert [g[0] for g in got] == [w[0] for w in want]
            assert [g[1] for g in got] == pytest.approx([w[1] for w in want])
        s = read_json(sweep / t["harness.run_id"] / "summary.json")  # one duration: wall_seconds
        assert r["info"]["end_time"] - r["info"]["start_time"] == pytest.approx(1000 * s["wall_seconds"], abs=1)
    # the parent run spans the sweep: its earliest run's start to its latest run's end
    spans = [dir_run_times(sweep / t["harness.run_id"]) for _, t in children]
    p = parents[0]["info"]
    assert (int(p["start_time"]), int(p["end_time"])) == (round(min(a for a, _ in spans) * 1000),
                                                          round(max(b for _, b in spans) * 1000))
    # `harness sync` attached the sweep's report to the parent run
    arts = _rest(url, "/api/2.0/mlflow/artifacts/list", run_id=p["run_id"], path="report")["files"]
    assert {"report/report.html", "report/plots"} <= {f["path"] for f in arts}
    assert any(line.strip().startswith(f"report {sweep / 'report'}: attached") for line in served["sync_lines"])
    # the view the printed link names: saved once on the experiment, accuracy first, grouped by algorithm
    link = re.search(r"sweep uisweep: (\S+)", served["log"]).group(1)
    key = re.search(r"viewStateShareKey=(\w+)", link).group(1)
    assert etags[VIEW_TAG] == key and [k for k in etags if k.startswith(SHARE_PREFIX)] == [SHARE_PREFIX + key]
    state = decode_view(etags[SHARE_PREFIX + key])
    sections = [s["name"] for s in state["compareRunSections"]]
    assert sections[:3] == ["accuracy_pct", "eval/arith", "eval/gsm8k"] and sections[-1] == "budget"
    assert [c["metricKey"] for c in state["compareRunCharts"][:2]] == ["accuracy_pct/arith", "accuracy_pct/gsm8k"]
    assert state["groupBy"]["groupByKeys"] == [{"mode": "param", "groupByData": "algorithm.name"}]
    # the server's banners and per-request lines went to its log, not to the terminal
    assert "INFO" not in served["log"] and "uvicorn" not in served["log"].lower()
    assert "GET /api/2.0/mlflow" in (served["root"] / "mlflow-server.log").read_text()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_printed_link_opens_on_the_grpo_vs_ppo_accuracy_chart_with_no_click(served, tmp_path):
    link = re.search(r"sweep uisweep: (\S+)", served["log"]).group(1)
    assert "workflowType=machine_learning" in link and "compareRunsMode=CHART" in link
    browser = Chromium(CHROMIUM)
    try:
        t0 = time.time()
        browser.call("Page.navigate", url=link)  # exactly the printed link, fresh profile, no click
        first_card = """(() => {
          const h = [...document.querySelectorAll('h4')].find(e => e.textContent.trim() === 'accuracy_pct/arith');
          let c = h;
          while (c && !c.querySelector('svg .scatterlayer path')) c = c.parentElement;
          return c; })()"""
        lines = "[...c.querySelectorAll('svg .scatterlayer path')].filter(p => p.style.stroke)"
        drawn = browser.wait(f"(() => {{ const c = {first_card}; return !!c && {lines}.length >= 2; }})()")
        load_seconds = time.time() - t0
        assert drawn, browser.eval("document.body.innerText")[:2000]
        shot = tmp_path / "mlflow-ui-after.png"
        browser.screenshot(shot)
        if os.environ.get("HARNESS_DOC_IMAGES"):
            (REPO / "docs" / "img").mkdir(exist_ok=True)
            shutil.copy(shot, REPO / "docs" / "img" / "mlflow-ui-after.png")
        page = browser.eval(f"""(() => {{
          const cards = [...document.querySelectorAll('h4')]
            .map(h => [h.textContent.trim(), h.getBoundingClientRect()])
            .filter(([t, r]) => r.width > 0 && r.bottom > 0 && r.top < innerHeight)
            .sort((a, b) => a[1].top - b[1].top || a[1].left - b[1].left)
            .map(([t, r]) => [t, Math.round(r.top), Math.round(r.left)]);
          const c = {first_card};
          const strokes = c ? [...new Set({lines}.map(p => p.style.stroke))] : [];
          return {{cards, strokes, height: innerHeight, text: document.body.innerText, url: location.href}};
        }})()""")
    finally:
        browser.close()
    print(f"\naccuracy chart drawn {load_seconds:.1f} s after opening the printed link; visible charts: {page['cards']}")
    text = page["text"]
    assert page["cards"] and page["cards"][0][0] == "accuracy_pct/arith", page["cards"]  # the first visible chart
    assert page["cards"][0][1] < page["height"] // 2  # in the top half of the window: nothing to scroll
    assert "Group: grpo" in text and "Group: ppo" in text and "Group by: algorithm.name" in text
    assert "Latency" not in text and "workflowType=machine_learning" in page["url"]  # not the GenAI traces page

    def rgb(hex_color: str) -> str:
        return "rgb({}, {}, {})".format(*(int(hex_color[i:i + 2], 16) for i in (1, 3, 5)))

    for algo in ("grpo", "ppo"):  # both algorithms drawn in the first chart, each in its group's colour
        assert rgb(group_color(f"param.algorithm.name.{algo}")) in page["strokes"], (algo, page["strokes"])
    assert shot.stat().st_size > 20_000  # a real rendering, not a blank page
