"""The Ray launcher on a real local Ray cluster.

Ray binds the machine's external interface and probes outside addresses even when told
127.0.0.1, so the cluster and the sweep run inside private namespaces:
``unshare --net --pid --fork --mount-proc`` (root): a network namespace with only
loopback, and a PID namespace so ``ray stop`` can only see (and kill) this test's Ray
processes, and everything in it dies with the namespace. ``RAY_AUTH_MODE=disabled``
because a token left by an earlier local ``ray.init()`` breaks ``ray start``. Needs
``unshare`` (util-linux) and ``ip`` (iproute2).

The workers find the harness and the fake trainer through the job's code search path
(the cluster is started without PYTHONPATH).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.rundir.layout import read_json, read_jsonl
from harness.sweep.plan import load_sweep
import support_paths

pytest.importorskip("ray")

REPO = support_paths.REPO
TESTS = support_paths.SUPPORT
RAY = Path(sys.executable).parent / "ray"


def _namespaces_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root for unshare"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"'{tool}' not installed (apt-get install {'util-linux' if tool == 'unshare' else 'iproute2'})"
    if not RAY.exists():
        return f"ray CLI not found at {RAY}"
    p = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "sh", "-c", "ip link set lo up"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return f"unshare not permitted here: {p.stderr.strip()}"
    return None


SWEEP = """
name: raysweep
config:
  train.prompts_per_step: 2
  sampling.samples_per_prompt: 4
grid:
  algorithm: [grpo, ppo]
  train.lr: [0.001, 0.0666, 0.0999]
budget: {unit: samples, amount: 40, eval_points: 2}
launcher: {type: ray, cpus: 1}
"""


def test_ray_launcher_on_a_local_cluster(tmp_path):
    why = _namespaces_usable()
    if why:
        pytest.skip(why)
    path = tmp_path / "ray.yaml"
    path.write_text(SWEEP)
    out = tmp_path / "out"
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths live under it
    port = 6390
    script = f"""
set -u
ip link set lo up
"{RAY}" start --head --node-ip-address=127.0.0.1 --port={port} --num-cpus=2 --include-dashboard=false \\
    --disable-usage-stats --temp-dir={temp} > {temp}/start.log 2>&1 || {{ cat {temp}/start.log; exit 97; }}
rc=0
PYTHONPATH="{REPO}:{TESTS}" HARNESS_TRAIN_FN=sweep_fake_trainer:train "{sys.executable}" -m harness.cli.main sweep {path} \\
    --launcher ray --address 127.0.0.1:{port} --output-dir {out} --no-progress || rc=$?
"{RAY}" stop --force > /dev/null 2>&1
exit $rc
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    try:
        p = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    log = p.stdout + p.stderr
    assert p.returncode != 97, log
    assert p.returncode == 1, log            # two runs fail on purpose; the others finish
    assert "launcher: ray at 127.0.0.1:" in p.stdout

    sw = load_sweep(path, output_dir=str(out))
    assert len(sw.runs) == 6
    for r in sw.runs:
        rd = r.run_dir
        assert rd.parent == out.resolve() / "raysweep" and rd.name == r.run_id        # the same layout
        s = read_json(rd / "summary.json")
        assert (rd / "worker.log").exists()
        assert "ray task" in (rd / "worker.log").read_text()
        lr = r.config.train.lr
        if lr == 0.001:
            assert s["status"] == "finished", s
            assert s["budget"]["consumed"]["samples"] == 40
            assert s["fake"]["cwd"] == str(tmp_path)           # the driver's working directory
            assert s["fake"]["omp_threads"] == "1"
            assert read_jsonl(rd / "metrics.jsonl")[-1]["eval/arith/acc"] == s["final_eval"]["eval/arith/acc"]
            assert not (rd / "error.txt").exists()
        elif lr == 0.0666:
            assert s["status"] == "failed" and "injected failure at step 2" in s["error"]
            assert "Traceback" in (rd / "error.txt").read_text()
        else:  # the Ray worker process died (SIGKILL): recorded by the driver
            assert s["status"] == "failed" and "Ray task failed" in s["error"], s["error"]
            assert "WorkerCrashedError" in (rd / "error.txt").read_text()
    doc = json.loads((out / "raysweep" / "sweep.json").read_text())
    assert doc["launcher"]["type"] == "ray" and doc["launcher"]["address"] == f"127.0.0.1:{port}"
    assert sorted(x["state"] for x in doc["runs"]) == ["failed"] * 4 + ["finished"] * 2
    assert "4 run(s) failed:" in p.stdout
