"""Faults during a sweep, with the fast fake trainer: a full disk (the run that hits it, and
recording it, fail with ENOSPC; the launcher goes on and ends with sweep.json recorded), a
run that cannot start, and SIGTERM to a worker or to the launcher (the run is recorded
``interrupted``, the sweep exits 130, a re-launch resumes it)."""
from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path

import pytest

from harness.rundir import summary as summary_mod
from harness.rundir.layout import read_json
from harness.sweep import launchers
from harness.sweep import run as sweep_run
from harness.sweep.plan import load_sweep
from sweep_testing import assert_resumed, launch, run_inproc, signal_and_wait, sweep_file, wait_steps

FULL = "enospc_trainer:train"


def _enospc(*a, **kw):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_run_fails_alone_and_the_sweep_goes_on(tmp_path, monkeypatch):
    path = sweep_file(tmp_path, """name: full
grid:
  train.lr: [0.001, 0.0555, 0.002]
budget: {unit: samples, amount: 16, eval_points: 1}
launcher: {workers: 1, cpus: 1}
""")
    out = tmp_path / "out"
    sw = load_sweep(path, output_dir=str(out))
    full_dir = next(r.run_dir for r in sw.runs if r.config.train.lr == 0.0555)
    real_summary, real_text = summary_mod.write_summary, summary_mod.write_text_atomic

    def only_full(real):   # the launcher's records of the full run's folder hit ENOSPC too
        return lambda p, *a: _enospc() if Path(p).resolve().is_relative_to(full_dir.resolve()) else real(p, *a)

    monkeypatch.setattr(summary_mod, "write_summary", only_full(real_summary))
    monkeypatch.setattr(summary_mod, "write_text_atomic", only_full(real_text))
    rc, text = run_inproc(path, out, train=FULL)
    assert rc == 1, text
    assert "1 run(s) failed" in text
    for r in sw.runs:
        s = read_json(r.run_dir / "summary.json")
        if r.run_dir == full_dir:
            assert s is None and not (r.run_dir / "error.txt").exists()   # nothing could be written
        else:
            assert s["status"] == "finished"                             # the runs after it ran
    doc = json.loads((out / "full" / "sweep.json").read_text())
    assert doc["status"] == "failed"
    assert {r["dir"]: r["state"] for r in doc["runs"]}[str(full_dir)] == "failed"


def test_run_that_cannot_start_and_unwritable_sweep_json(tmp_path, monkeypatch, capsys):
    path = sweep_file(tmp_path, """name: nostart
grid: {seed: [0, 1]}
budget: {unit: samples, amount: 16, eval_points: 1}
launcher: {workers: 1, cpus: 1}
""")
    out = tmp_path / "out"
    sw = load_sweep(path, output_dir=str(out))
    bad = sw.runs[0].run_dir
    real_prepare = launchers._prepare_run_dir
    monkeypatch.setattr(launchers, "_prepare_run_dir", lambda d: _enospc() if Path(d) == bad else real_prepare(d))
    monkeypatch.setattr(sweep_run, "write_json_atomic", _enospc)
    rc, text = run_inproc(path, out)
    assert rc == 1, text
    assert "could not start the worker" in text and "No space left on device" in text
    s = read_json(bad / "summary.json")
    assert s["status"] == "failed" and "could not start the worker" in s["error"]
    assert read_json(sw.runs[1].run_dir / "summary.json")["status"] == "finished"
    err = capsys.readouterr().err
    assert "could not write" in err and "sweep.json" in err and "status failed" in err
    assert not (out / "nostart" / "sweep.json").exists()


def _assert_resumes(path: Path, out: Path, run) -> None:
    rc, text = run_inproc(path, out)
    assert rc == 0, text
    assert_resumed(run)


def test_sigterm_to_a_worker_marks_it_interrupted_and_the_sweep_goes_on(tmp_path):
    path = sweep_file(tmp_path, """name: termw
grid: {seed: [0, 1]}
budget: {unit: samples, amount: 200, eval_points: 2}
launcher: {workers: 1}
""")
    out = tmp_path / "out"
    sw = load_sweep(path, output_dir=str(out))
    proc = launch(path, out, "--no-progress")
    wait_steps(sw.runs[:1], proc, 3)
    pid = read_json(sw.runs[0].run_dir / "summary.json")["fake"]["pid"]
    stdout = signal_and_wait(proc, lambda: os.kill(pid, signal.SIGTERM))
    assert proc.returncode == 130, stdout
    assert "interrupted: 1 in-flight run(s) marked interrupted" in stdout
    first, second = (read_json(r.run_dir / "summary.json") for r in sw.runs)
    assert first["status"] == "interrupted" and not (sw.runs[0].run_dir / "error.txt").exists()
    assert second["status"] == "finished"                                   # the sweep went on
    doc = json.loads((out / "termw" / "sweep.json").read_text())
    assert doc["status"] == "interrupted" and [r["state"] for r in doc["runs"]] == ["interrupted", "finished"]
    _assert_resumes(path, out, sw.runs[0])


def test_sigterm_to_the_launcher_marks_runs_interrupted(tmp_path):
    path = sweep_file(tmp_path, """name: terml
grid: {seed: [0]}
budget: {unit: samples, amount: 200, eval_points: 2}
launcher: {workers: 1}
""")
    out = tmp_path / "out"
    sw = load_sweep(path, output_dir=str(out))
    proc = launch(path, out, "--no-progress")
    wait_steps(sw.runs, proc, 3)
    pid = read_json(sw.runs[0].run_dir / "summary.json")["fake"]["pid"]
    stdout = signal_and_wait(proc, lambda: proc.send_signal(signal.SIGTERM))
    assert proc.returncode == 130, stdout
    assert "interrupted: 1 in-flight run(s) marked interrupted" in stdout and "Traceback" not in stdout
    with pytest.raises(ProcessLookupError):                                 # no worker left behind
        os.kill(pid, 0)
    s = read_json(sw.runs[0].run_dir / "summary.json")
    assert s["status"] == "interrupted" and 0 < s["budget"]["consumed"]["samples"] < 200
    assert json.loads((out / "terml" / "sweep.json").read_text())["status"] == "interrupted"
    _assert_resumes(path, out, sw.runs[0])
