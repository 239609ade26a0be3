"""Scaffolding of the sweep tests (tests/harness/sweep): sweep files over the fake trainer
(``sweep_fake_trainer.train``), the sweep command in a subprocess or in this process, and the
wait-then-signal pattern of the interruption tests."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import support_paths
from harness.rundir.layout import read_json, read_jsonl
from harness.sweep.plan import load_sweep
from harness.sweep.run import run_sweep

FAKE = "sweep_fake_trainer:train"


def env(**extra) -> dict:
    """This environment for a sweep subprocess: the repository and tests/support importable, no
    GPU, plus ``extra`` (as strings)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(support_paths.REPO), str(support_paths.SUPPORT)])
    e.pop("CUDA_VISIBLE_DEVICES", None)
    e.update({k: str(v) for k, v in extra.items()})
    return e


def sweep_file(tmp_path: Path, body: str, name: str = "s.yaml") -> Path:
    """A sweep file of 2 prompts x 4 samples per step, followed by ``body``."""
    p = tmp_path / name
    p.write_text("config:\n  train.prompts_per_step: 2\n  sampling.samples_per_prompt: 4\n" + body)
    return p


def run_cli(path: Path, out: Path, *args, timeout=120, **envs) -> subprocess.CompletedProcess:
    """``harness sweep PATH --output-dir OUT *args`` to completion, over the fake trainer."""
    cmd = [sys.executable, "-m", "harness.cli.main", "sweep", str(path), "--output-dir", str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env(HARNESS_TRAIN_FN=FAKE, **envs), cwd=path.parent,
                          timeout=timeout)


def launch(path: Path, out: Path, *args, step_seconds: float = 0.1, cwd: Path | None = None) -> subprocess.Popen:
    """``harness sweep`` started in the background (stdout and stderr together), each fake step
    taking ``step_seconds``."""
    cmd = [sys.executable, "-m", "harness.cli.main", "sweep", str(path), "--output-dir", str(out), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env(HARNESS_TRAIN_FN=FAKE, FAKE_STEP_SECONDS=step_seconds), cwd=cwd or path.parent)


def run_inproc(path: Path, out: Path, train: str = FAKE, **kw) -> tuple[int, str]:
    """run_sweep in this process (saves a driver start-up); workers still get fresh processes."""
    old_env = dict(os.environ)
    os.environ.update(env())
    buf = io.StringIO()
    try:
        rc = run_sweep(load_sweep(path, output_dir=str(out)), train=train, progress=False, stream=buf, **kw)
    finally:
        os.environ.clear()
        os.environ.update(old_env)
    return rc, buf.getvalue()


def calls(out: Path) -> list[str]:
    """Run ids in the order the fake trainer was called (its ``calls.log``)."""
    p = out / "calls.log"
    return [line.split()[0] for line in p.read_text().splitlines()] if p.exists() else []


def wait_steps(runs, proc: subprocess.Popen, n: int, timeout: float = 60) -> None:
    """Until every run in ``runs`` has checkpointed ``n`` steps; fails if the sweep ends first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"sweep ended (rc {proc.returncode}) early: {proc.stdout.read()}")
        steps = [(read_json(r.run_dir / "checkpoint" / "state.json") or {}).get("step", 0) for r in runs]
        if min(steps) >= n:
            return
        time.sleep(0.1)
    pytest.fail("runs did not start")


def signal_and_wait(proc: subprocess.Popen, send, timeout: float = 90) -> str:
    """``send()`` (a signal to the sweep or to one of its workers), then the sweep's output once it
    exits; the sweep is killed if it does not."""
    try:
        send()
        stdout, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return stdout


def assert_resumed(run, steps: int = 25) -> None:
    """The run finished by resuming (not restarting), with every fake step logged exactly once."""
    s = read_json(run.run_dir / "summary.json")
    assert s["status"] == "finished" and s["fake"]["resumed"] == 1          # resumed, not restarted
    logged = [row["step"] for row in read_jsonl(run.run_dir / "metrics.jsonl") if "rollout/reward_mean" in row]
    assert logged == list(range(1, steps + 1))                              # none lost or logged twice
