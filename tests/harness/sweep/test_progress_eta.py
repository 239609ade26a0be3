"""The sweep's live table: an ETA per run and for the sweep, and what a run waits on before
its first metrics row (issue 14)."""
from __future__ import annotations

import io
import json
import time

import yaml

from harness.config.schema import load_config
from harness.foundation.base import to_dict
from harness.rundir.lock import RUN_LOCK, FileLock
from harness.sweep.progress import Progress
from harness.train.warmup import warmup_dir


def _rows(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_eta_per_run_and_for_the_sweep(tmp_path):
    now = time.time()
    dirs = {k: tmp_path / k for k in ("a", "b", "c")}
    for d in dirs.values():
        d.mkdir()
    # a: 100 of 400 samples in 10 s since its first row -> 30 s left
    _rows(dirs["a"] / "metrics.jsonl", [{"samples": 0, "time": now - 10}, {"samples": 100, "time": now}])
    prog = Progress([(k, d) for k, d in dirs.items()], unit="samples", amount=400, mode="plain",
                    stream=io.StringIO(), interval=0)
    prog.update("a", "running")
    prog.runs["a"].started = now - 12
    prog.runs["a"].poll()
    assert abs(prog.runs["a"].eta(400, now) - 30.0) < 1e-6
    # one running (30 s left, 12 + 30 = 42 s projected), two pending, one worker seen: 30 + 2 x 42
    assert abs(prog.sweep_eta(now) - 114.0) < 0.5
    line = next(r for r in prog.rows() if r[0] == "a")
    assert line[-1] in ("0:30", "0:29") and line[1] == "running"
    text = prog.text()
    assert "sweep ETA 1:5" in text  # 1:54 (a second may have passed)
    prog.update("a", "finished")
    assert prog.runs["a"].eta(400, time.time()) is None


def test_waiting_on_warmup_lock_build_and_initial_evaluation(tmp_path):
    cfg = load_config(overrides=[f"output_dir={tmp_path}", "name=sw", f"warmup.cache_dir={tmp_path / 'cache'}"])
    run = tmp_path / "sw" / "r1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    wdir = warmup_dir(cfg)
    wdir.parent.mkdir(parents=True, exist_ok=True)
    prog = Progress([("r1", run)], unit="samples", amount=64, mode="plain", stream=io.StringIO(), interval=0)
    prog.update("r1", "running")
    rp = prog.runs["r1"]
    (wdir.with_name(wdir.name + ".lock")).write_text("pid 999999 on elsewhere\n")  # another process builds it
    assert rp.waiting_on() == "waiting for warm-up lock"
    lock = FileLock(run / RUN_LOCK).acquire()  # this process is the run's trainer ...
    try:
        (wdir.with_name(wdir.name + ".lock")).write_text((run / RUN_LOCK).read_text())  # ... and builds it
        assert rp.waiting_on() == "building warm-up"
    finally:
        lock.release()
    wdir.mkdir(parents=True, exist_ok=True)
    (wdir / "warmup.json").write_text("{}")
    assert rp.waiting_on() == "loading"
    (run / "summary.json").write_text(json.dumps({"status": "running", "phase": "initial evaluation"}))
    assert rp.waiting_on() == "initial evaluation"
    assert "running: initial evaluation" in prog.text()
    _rows(run / "metrics.jsonl", [{"samples": 0, "time": time.time(), "eval/arith/acc": 0.5}])
    (run / "summary.json").write_text(json.dumps({"status": "running"}))  # the trainer drops the phase
    rp.poll()
    assert rp.waiting_on() == "" and prog.rows()[0][1] == "running"
    # at the end of the budget (bar full): the final evaluation, shown although rows exist
    (run / "summary.json").write_text(json.dumps({"status": "running", "phase": "final evaluation"}))
    assert rp.waiting_on() == "final evaluation" and prog.rows()[0][1] == "running: final evaluation"
