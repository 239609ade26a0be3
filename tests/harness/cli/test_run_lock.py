"""One writer per run directory: a second `harness train` on a run another trainer holds
fails fast (exit 2) naming the holder's pid and host, and writes nothing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from harness.cli import train as cli_train
from harness.cli.main import main
from harness.config.schema import load_config
from harness.rundir.lock import RUN_LOCK, holder_line, lock_run_dir
from harness.train.loop import run_dir

QUICKSTART = "harness/configs/quickstart.yaml"


def _sets(tmp_path):
    return ["--set", f"output_dir={tmp_path / 'results'}", "--set", "warmup.cache_dir=" + str(tmp_path / "wc")]


def _cfg_sets(tmp_path):
    return [f"output_dir={tmp_path / 'results'}", "warmup.cache_dir=" + str(tmp_path / "wc")]


def test_second_trainer_fails_fast_in_process(tmp_path, capsys):
    cfg = load_config(QUICKSTART, _cfg_sets(tmp_path))
    out = run_dir(cfg)
    lock = lock_run_dir(out)
    try:
        rc = main(["train", QUICKSTART, "--no-progress", *_sets(tmp_path)])
    finally:
        lock.release()
    err = capsys.readouterr().err
    assert rc == 2
    assert holder_line() in err and "another trainer is writing" in err and str(out) in err
    assert "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == [RUN_LOCK]  # no summary, no metrics, no config


def test_second_trainer_fails_fast_across_processes(tmp_path, capsys):
    cfg = load_config(QUICKSTART, _cfg_sets(tmp_path))
    out = run_dir(cfg)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from harness.rundir.lock import lock_run_dir
            lock = lock_run_dir({str(out)!r})
            print("held", flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        rc = main(["train", QUICKSTART, "--no-progress", *_sets(tmp_path)])
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    err = capsys.readouterr().err
    assert rc == 2
    assert f"pid {holder.pid} on {os.uname().nodename}" in err
    assert not (out / "summary.json").exists() and not (out / "metrics.jsonl").exists()
    # the holder is gone: the lock is free again
    lock_run_dir(out).release()


def test_sigterm_during_train_is_an_interrupt(tmp_path, monkeypatch, capsys):
    """`harness train` turns SIGTERM into KeyboardInterrupt (recorded "interrupted", exit 130)."""
    def fake_train(cfg, **kw):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt")

    monkeypatch.setattr(cli_train.loop, "train", fake_train)
    before = signal.getsignal(signal.SIGTERM)
    rc = main(["train", QUICKSTART, "--no-progress", *_sets(tmp_path)])
    assert rc == 130 and "interrupted" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before  # handler restored
