"""The local launcher, end to end through `python -m harness.cli.main sweep`, with the fast fake
trainer (tests/sweep_fake_trainer.py): failures isolated and recorded, finished runs
skipped, Ctrl-C marks in-flight runs interrupted and a re-launch resumes them, threads
and GPU slots per run, multi-process runs under torchrun, the progress table."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys

import pytest

from harness.sweep.launchers import default_workers, gpu_slots
from harness.rundir.layout import read_json, read_jsonl
from harness.sweep.plan import load_sweep
from harness.sweep.run import _lock
from harness.sweep.spec import SweepError
from harness.sweep.progress import Progress
import support_paths
from sweep_testing import (assert_resumed, calls, env, launch, run_cli, run_inproc, signal_and_wait,
                           sweep_file, wait_steps)

REPO = support_paths.REPO


def test_failing_runs_are_isolated_and_recorded(tmp_path):
    # lr 0.0666: the trainer raises (and records); 0.0777: raises before writing anything
    # (the worker records); 0.0999: SIGKILLs itself mid-run (the launcher records)
    path = sweep_file(tmp_path, """name: iso
grid:
  train.lr: [0.001, 0.0666, 0.0777, 0.0999]
budget: {unit: samples, amount: 40, eval_points: 2}
launcher: {workers: 2, cpus: 1}
""")
    out = tmp_path / "out"
    p = run_cli(path, out, "--no-progress")
    assert p.returncode == 1, p.stdout + p.stderr
    sw = load_sweep(path, output_dir=str(out))
    by_lr = {r.config.train.lr: r for r in sw.runs}
    for lr in (0.001,):
        rd = by_lr[lr].run_dir
        s = read_json(rd / "summary.json")
        assert s["status"] == "finished" and s["budget"]["consumed"]["samples"] == 40
        assert not (rd / "error.txt").exists()
        assert s["fake"]["omp_threads"] == "1"                   # cpus: 1 -> one thread per run
        assert s["fake"]["cwd"] == str(tmp_path)                  # the launcher's working directory
        assert [r["samples"] for r in read_jsonl(rd / "metrics.jsonl")] == [0, 8, 16, 24, 32, 40, 40]
    expect = {0.0666: ("RuntimeError: injected failure at step 2", "Traceback"),
              0.0777: ("ValueError: injected failure before the run directory", "Traceback"),
              0.0999: ("died from SIGKILL", "last lines of worker.log")}
    for lr, (err, detail) in expect.items():
        rd = by_lr[lr].run_dir
        s = read_json(rd / "summary.json")
        assert s["status"] == "failed" and err in s["error"], (lr, s.get("error"))
        text = (rd / "error.txt").read_text()
        assert err in text and detail in text, (lr, text)
        assert s["run_id"] == by_lr[lr].run_id and s["config"]["train"]["lr"] == lr
        assert (rd / "worker.log").exists()
    assert "3 run(s) failed:" in p.stdout
    for lr in expect:
        assert f"{by_lr[lr].run_id}: " in p.stdout and str(by_lr[lr].run_dir / "error.txt") in p.stdout
    doc = json.loads((out / "iso" / "sweep.json").read_text())
    assert doc["status"] == "failed"
    assert sorted(r["state"] for r in doc["runs"]) == ["failed"] * 3 + ["finished"]

    # re-launch (in-process this time): finished runs are skipped, failed ones run again
    # (and fail again)
    before = calls(out)
    rc, text = run_inproc(path, out)
    assert rc == 1, text
    again = calls(out)[len(before):]
    assert sorted(again) == sorted(by_lr[lr].run_id for lr in expect)
    assert (by_lr[0.0666].run_dir / "error.previous.txt").exists()   # last attempt's traceback kept aside
    # skip_failed: nothing left to run, but the sweep is still not complete
    rc, text = run_inproc(path, out, skip_failed=True)
    assert rc == 1 and "3 run(s) not finished" in text
    assert calls(out) == before + again


def test_relaunch_skips_finished_runs(tmp_path):
    path = sweep_file(tmp_path, """name: skip
grid: {algorithm: [grpo, rloo]}
budget: {unit: steps, amount: 3, eval_points: 1}
""")
    out = tmp_path / "out"
    p = run_cli(path, out, "--no-progress")
    assert p.returncode == 0, p.stdout + p.stderr
    first = calls(out)
    sw = load_sweep(path, output_dir=str(out))
    assert sorted(first) == sorted(r.run_id for r in sw.runs)
    assert all(r.state == "finished" for r in sw.runs)
    p = run_cli(path, out, "--no-progress")
    assert p.returncode == 0 and "nothing to run" in p.stdout
    assert calls(out) == first                                   # the trainer was not even called
    assert p.stdout.count("finished (skip)") == 2
    # a run whose summary is gone (or says interrupted/failed) is handed to the trainer again
    victim = sw.runs[1]
    (victim.run_dir / "summary.json").unlink()
    rc, text = run_inproc(path, out)
    assert rc == 0 and calls(out) == first + [victim.run_id], text


def test_ctrl_c_marks_interrupted_and_relaunch_resumes(tmp_path):
    path = sweep_file(tmp_path, """name: intr
grid: {seed: [0, 1]}
budget: {unit: samples, amount: 200, eval_points: 2}
launcher: {workers: 2}
""")
    out = tmp_path / "out"
    sw = load_sweep(path, output_dir=str(out))
    proc = launch(path, out, "--refresh", "0.5", step_seconds=0.25, cwd=tmp_path)
    wait_steps(sw.runs, proc, 3)   # both runs checkpointed a few steps
    pids = [read_json(r.run_dir / "summary.json")["fake"]["pid"] for r in sw.runs]
    stdout = signal_and_wait(proc, lambda: proc.send_signal(signal.SIGINT), timeout=60)
    assert proc.returncode == 130, stdout
    assert "interrupted: 2 in-flight run(s) marked interrupted" in stdout
    assert "running" in stdout and "/200 samples" in stdout      # the live table was printed
    for pid in pids:                                            # no worker left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for r in sw.runs:
        s = read_json(r.run_dir / "summary.json")
        assert s["status"] == "interrupted"
        assert 0 < s["budget"]["consumed"]["samples"] < 200
    assert json.loads((out / "intr" / "sweep.json").read_text())["status"] == "interrupted"

    sw2 = load_sweep(path, output_dir=str(out))
    assert [r.state for r in sw2.runs] == ["interrupted", "interrupted"]
    rc, text = run_inproc(path, out)
    assert rc == 0, text
    for r in sw.runs:
        assert_resumed(r)


def test_gpu_slots_threads_and_env_reach_workers(tmp_path):
    path = sweep_file(tmp_path, """name: gpus
grid: {seed: [0, 1, 2]}
budget: {unit: steps, amount: 3, eval_points: 1}
launcher: {gpus: 1, cpus: 2, env: {NCCL_DEBUG_SUBSYS: hello}}
""")
    out = tmp_path / "out"
    # pretend two GPUs are visible: each run must get exactly one, never the same one at once
    p = run_cli(path, out, "--no-progress", "--workers", "3", CUDA_VISIBLE_DEVICES="3,5", FAKE_STEP_SECONDS=0.3)
    assert p.returncode == 0, p.stdout + p.stderr
    sw = load_sweep(path, output_dir=str(out))
    seen = []
    for r in sw.runs:
        s = read_json(r.run_dir / "summary.json")
        assert s["fake"]["cuda_visible"] in ("3", "5")
        assert s["fake"]["omp_threads"] == "2" and s["fake"]["extra_env"] == "hello"
        rows = read_jsonl(r.run_dir / "metrics.jsonl")
        seen.append((rows[0]["time"], rows[-1]["time"], s["fake"]["cuda_visible"]))
    for i, a in enumerate(seen):                # runs sharing a GPU never overlap in time
        for b in seen[i + 1:]:
            if a[2] == b[2]:
                assert a[1] <= b[0] or b[1] <= a[0], (a, b)
    assert {x[2] for x in seen} == {"3", "5"}


def test_gpu_slot_and_worker_arithmetic():
    assert gpu_slots(["0", "1", "2", "3"], 1) == ["0", "1", "2", "3"]
    assert gpu_slots(["0", "1", "2", "3"], 2) == ["0,1", "2,3"]
    assert gpu_slots(["0", "1", "2"], 2) == ["0,1"]
    assert gpu_slots(["0", "1"], 0.5) == ["0", "0", "1", "1"]
    assert gpu_slots(["0", "1"], 0) == []
    cores = len(os.sched_getaffinity(0))
    assert default_workers(100, 1) == cores
    assert default_workers(1, 1) == 1
    assert default_workers(100, 1, n_slots=1) == 1
    assert default_workers(100, cores * 4) == 1


def test_procs_run_under_torchrun_with_zero_env(tmp_path):
    path = sweep_file(tmp_path, """name: mp
grid: {seed: [0]}
budget: {unit: steps, amount: 2, eval_points: 1}
launcher: {procs: 2, cpus: 2, zero_stage: 3}
""")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "harness.cli.main", "sweep", str(path), "--output-dir", str(out), "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(HARNESS_TRAIN_FN="sweep_fake_trainer:train_distributed"),
                       cwd=tmp_path, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    rd = load_sweep(path, output_dir=str(out)).runs[0].run_dir
    ranks = [json.loads((rd / f"rank{i}.json").read_text()) for i in (0, 1)]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    s = read_json(rd / "summary.json")
    assert s["status"] == "finished" and s["fake"]["zero_stage"] == "3"
    assert s["fake"]["ds_config"] == str(REPO / "harness" / "configs" / "deepspeed" / "zero3.json")
    assert s["fake"]["omp_threads"] == "1"                       # 2 cpus over 2 processes


def test_sweep_lock_refuses_a_second_launcher(tmp_path):
    first = _lock(tmp_path / "sw")
    try:
        with pytest.raises(SweepError, match="another sweep launcher is running"):
            _lock(tmp_path / "sw")
    finally:
        first.close()
    _lock(tmp_path / "sw").close()           # free again once released


def test_progress_table_reads_metrics_and_summary(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with open(a / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"step": 0, "samples": 0, "eval/arith/acc": 0.25}) + "\n")
        f.write(json.dumps({"step": 3, "samples": 24, "rollout/reward_mean": 0.5}) + "\n")
        f.write('{"step": 4, "samp')                                   # torn line: ignored for now
    (b / "summary.json").write_text(json.dumps({"status": "finished", "budget": {"consumed": {"samples": 40}},
                                                "final_eval": {"eval/arith/acc": 0.75}}))
    buf = io.StringIO()
    prog = Progress([("run-a", a), ("run-b", b)], unit="samples", amount=40, initial={"run-b": "finished"},
                    mode="plain", stream=buf, interval=0)
    with prog:
        prog.update("run-a", "running")
        prog.tick(force=True)
    text = buf.getvalue()
    line_a = next(line for line in text.splitlines() if line.startswith("run-a"))
    assert "running" in line_a and "24/40 samples" in line_a and " 60% " in line_a
    assert " 0.5 " in line_a and " 25.0% " in line_a  # reward as is; accuracy in percent
    line_b = next(line for line in text.splitlines() if line.startswith("run-b"))
    assert "finished" in line_b and "40/40 samples" in line_b and " 75.0% " in line_b
    # the rest of the torn line arrives: picked up incrementally
    with open(a / "metrics.jsonl", "a") as f:
        f.write('les": 32, "rollout/reward_mean": 0.625}\n')
    prog.runs["run-a"].poll()
    assert prog.runs["run-a"].consumed["samples"] == 32 and prog.runs["run-a"].reward == 0.625
    # rich rendering (terminal mode) has the same rows
    from rich.console import Console
    con = Console(file=io.StringIO(), width=120)
    con.print(prog.rich_table())
    assert "32/40 samples" in con.file.getvalue() and "run-b" in con.file.getvalue()
