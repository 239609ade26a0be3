"""Resuming from run-directory files that are corrupted, forged or odd (issue 25): a checkpoint
that is ``{}`` or from another model size, a summary that says ``finished`` on a run stopped
part-way, a metrics row with ``"step": "999"``, a FIFO as ``metrics.jsonl``, a warm-up cache
entry without its weights, an edited cached start evaluation, a wall clock stepping back, and
results made read-only mid-run. Each ends in a usable run or in one line (exit 2 for the file,
3 for the environment) naming the file and what to do; none hangs, none loses finished results.

The runs are tiny (a 1-layer, 16-wide model, 2 prompts x 2 samples, 4-token completions); one
interrupted run (stopped before step 3, checkpoint at step 2) is made once per module and
copied into each test that resumes from it."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from harness.cli.main import main
from harness.config.schema import load_config
from harness.rundir.layout import RunFileError, read_json, read_jsonl
from harness.train import loop
from harness.train import warmup as wu
from harness.train.checkpoint import CheckpointError, checkpoint_path
from harness.train.evalpoints import cached_initial_eval, initial_eval_key
from harness.train.loop import run_dir, train
from tiny_runs import TINY_RUN, stop_before_stage  # tests/support

TINY = TINY_RUN


@contextmanager
def deadline(seconds: int = 60):
    """Fail (rather than hang the suite) if the body blocks, e.g. on a FIFO."""
    def _timeout(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    prev = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, prev)


QUICKSTART = "harness/configs/quickstart.yaml"


def _cfg(sets: list[str]):
    return load_config(QUICKSTART, sets)


def _sets(root: Path, cache: Path, extra=()) -> list[str]:
    return TINY + [f"output_dir={root}", f"warmup.cache_dir={cache}", *extra]


def _argv(sets: list[str]) -> list[str]:
    return ["train", "--no-progress", QUICKSTART] + [a for s in sets for a in ("--set", s)]


def _harness_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("harness")]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """(results root, warm-up cache) of a run stopped by Ctrl-C at step 3 (checkpoint at step 2)."""
    root = tmp_path_factory.mktemp("interrupted")
    cache = root / "wc"
    cfg = _cfg(_sets(root / "results", cache))
    stop_before_stage(cfg)
    out = run_dir(cfg)
    assert torch.load(checkpoint_path(out), weights_only=True)["counters"]["step"] == 2
    return root / "results", cache


@pytest.fixture
def resumable(interrupted, tmp_path):
    """A copy of the interrupted run for one test: (config sets, run dir)."""
    src, cache = interrupted
    shutil.copytree(src, tmp_path / "results")
    sets = _sets(tmp_path / "results", cache)
    return sets, run_dir(_cfg(sets))


# --------------------------------------------------------------------------- 4: a forged "finished"


def test_forged_finished_summary_is_not_trusted_and_the_run_resumes(resumable, caplog, capsys):
    sets, out = resumable
    forged = {"status": "finished", "run_id": out.name}
    (out / "summary.json").write_text(json.dumps(forged))
    assert main(_argv(sets)) == 0
    s = read_json(out / "summary.json")
    assert s["status"] == "finished" and s["resumed_from_step"] == 2            # it trained, from the checkpoint
    assert s["budget"]["consumed"]["steps"] == 4 and s["final_eval"]
    warned = [r.getMessage() for r in caplog.records if "not trusted" in r.getMessage()]
    assert len(warned) == 1 and "summary.json" in warned[0] and "resumes from its checkpoint" in warned[0]
    kept = list((out / "superseded").glob("unverified-*/summary.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == forged          # nothing is lost
    steps = [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r]
    assert steps == [1, 2, 3, 4]
    # the real finished summary is trusted: a second call trains nothing
    assert main(_argv(sets)) == 0
    assert read_json(out / "summary.json")["ended"] == s["ended"]


def test_edited_final_eval_is_not_trusted(resumable, caplog):
    sets, out = resumable
    cfg = _cfg(sets)
    s = train(cfg, progress=False)
    key = f"eval/{cfg.task.name}/acc"
    s["final_eval"][key] = 1.0 if s["final_eval"][key] != 1.0 else 0.5         # a better number, by hand
    (out / "summary.json").write_text(json.dumps(s))
    again = train(cfg, progress=False)
    assert again["final_eval"][key] != s["final_eval"][key]                      # re-done, not trusted
    assert any("final_eval is not the evaluation logged" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- 6: row types on resume


def test_metrics_row_with_a_string_step_does_not_survive_resume(resumable):
    sets, out = resumable
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": "999", "samples": 0, "tokens": 0, "seconds": 0.0, "train/loss": 7.0}) + "\n")
        f.write(json.dumps({"step": True, "train/loss": 8.0}) + "\n")
    s = train(_cfg(sets), progress=False)
    assert s["status"] == "finished"
    rows = read_jsonl(out / "metrics.jsonl")
    assert all(type(r["step"]) is int for r in rows), [r["step"] for r in rows]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4]


def test_fifo_as_metrics_jsonl_is_refused_not_waited_on(resumable, capsys):
    sets, out = resumable
    (out / "metrics.jsonl").unlink()
    os.mkfifo(out / "metrics.jsonl")
    with deadline(120):
        rc = main(_argv(sets))
    err = capsys.readouterr().err
    lines = _harness_lines(err)
    assert rc == 2 and len(lines) == 1, err
    assert "metrics.jsonl" in lines[0] and "FIFO" in lines[0] and "delete it" in lines[0]
    assert "Traceback" not in err


# --------------------------------------------------------------------------- 1: checkpoints


@pytest.mark.parametrize("kind", ["empty", "string-counter", "list", "garbage", "fifo", "dangling-link"])
def test_unusable_checkpoint_is_one_line_naming_it(resumable, capsys, kind):
    sets, out = resumable
    ckpt = checkpoint_path(out)
    state = torch.load(ckpt, weights_only=True)
    ckpt.unlink()
    if kind == "empty":
        torch.save({}, ckpt)
    elif kind == "string-counter":
        state["counters"]["step"] = "130"
        torch.save(state, ckpt)
    elif kind == "list":
        torch.save([1], ckpt)
    elif kind == "garbage":
        ckpt.write_bytes(b"\x00not a checkpoint" * 10)
    elif kind == "fifo":
        os.mkfifo(ckpt)
    else:
        ckpt.symlink_to(ckpt.parent / "gone.pt")
    with deadline(120):
        rc = main(_argv(sets))
    err = capsys.readouterr().err
    lines = _harness_lines(err)
    assert rc == 2 and len(lines) == 1, err
    assert "Traceback" not in err and "KeyError" not in err
    assert str(ckpt) in lines[0] and f"delete {ckpt.parent}" in lines[0], lines[0]
    s = read_json(out / "summary.json")
    assert s["status"] in ("failed", "interrupted")                               # recorded, not "running"


def test_checkpoint_of_another_model_size_is_one_line(resumable, tmp_path, capsys):
    sets, out = resumable
    other = [s for s in sets if not s.startswith("model.hidden_size")] + ["model.hidden_size=32"]
    other_out = run_dir(_cfg(other))
    (other_out / "checkpoint").mkdir(parents=True)
    shutil.copyfile(checkpoint_path(out), checkpoint_path(other_out))
    rc = main(_argv(other))
    err = capsys.readouterr().err
    lines = _harness_lines(err)
    assert rc == 2 and len(lines) == 1, err
    assert str(checkpoint_path(other_out)) in lines[0] and "size mismatch" in lines[0]
    assert f"delete {other_out / 'checkpoint'}" in lines[0]
    assert "Traceback" not in err


def test_checkpoint_error_is_a_runtime_error_naming_the_file(tmp_path):
    p = tmp_path / "checkpoint" / "state.pt"
    p.parent.mkdir()
    torch.save({}, p)
    from harness.train import checkpoint as ck

    class OneProcess:
        is_distributed, is_main = False, True

    with pytest.raises(CheckpointError) as ei:
        ck.load_checkpoint(p, OneProcess(), object(), None, resume=True)
    assert isinstance(ei.value, RuntimeError) and isinstance(ei.value, RunFileError)
    assert str(ei.value).startswith(f"{p}: not a checkpoint")


# --------------------------------------------------------------------------- 7: the clock steps back


def test_wall_clock_stepping_back_never_makes_wall_seconds_negative(resumable, monkeypatch):
    """The wall clock was an hour ahead when the attempt started (then NTP stepped it back):
    ``ended - started`` is about -3600 s; the duration comes from the monotonic clock."""
    sets, out = resumable
    real = loop.new_summary

    def ahead(*a, **kw):
        s = real(*a, **kw)
        s["started"] += 3600.0
        return s

    monkeypatch.setattr(loop, "new_summary", ahead)
    s = train(_cfg(sets), progress=False)
    assert s["ended"] - s["started"] < -3000                                     # the stamps are as the clock said
    assert 0 <= s["wall_seconds"] < 600, s["wall_seconds"]
    assert read_json(out / "summary.json")["wall_seconds"] == s["wall_seconds"]


# --------------------------------------------------------------------------- 8: read-only mid-run


def test_results_made_read_only_mid_run_is_exit_3_naming_the_file(resumable, monkeypatch, capsys):
    """A read-only remount after the first resumed stage: every write fails with EROFS (the
    metrics row, the summary). One line, exit 3, naming metrics.jsonl and saying the status on
    disk could not be recorded; once writable again the same command finishes the run."""
    sets, out = resumable
    real_fsync, real_stage = os.fsync, loop._stage
    ro = {"on": False}

    def fsync(fd):
        if ro["on"]:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_fsync(fd)

    def stage(run, k):
        ro["on"] = ro["on"] or k == 3
        return real_stage(run, k)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(loop, "_stage", stage)
    rc = main(_argv(sets))
    err = capsys.readouterr().err
    lines = _harness_lines(err)
    assert rc == 3 and len(lines) == 1, err
    assert "Traceback" not in err and "PermissionError" not in err
    line = lines[0]
    assert f"on {out / 'metrics.jsonl'}" in line and "Read-only file system" in line
    assert "remount it read-write" in line and "summary.json still says running" in line
    monkeypatch.undo()
    assert main(_argv(sets)) == 0
    assert read_json(out / "summary.json")["status"] == "finished"


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS])
def test_permission_errors_are_exit_3_one_line(tmp_path, monkeypatch, capsys, code):
    def denied(*a, **kw):
        raise PermissionError(code, os.strerror(code), str(tmp_path / "results" / "x" / "summary.json"))

    monkeypatch.setattr(loop, "_train_run", denied)
    rc = main(_argv(_sets(tmp_path / "results", tmp_path / "wc")))
    err = capsys.readouterr().err
    lines = _harness_lines(err)
    assert rc == 3 and len(lines) == 1 and "Traceback" not in err, err
    assert "permission denied on" in lines[0] and "summary.json" in lines[0] and "re-run" in lines[0]


# --------------------------------------------------------------------------- 3: the warm-up cache


def _entry(tmp_path, extra=()) -> tuple:
    cfg = _cfg(_sets(tmp_path / "results", tmp_path / "wc", extra))
    from evals.catalog import get_task

    task = get_task(cfg.task)
    out, info = wu.ensure_warmup(cfg, task, torch.device("cpu"), progress=False)
    assert info["cached"] is False and wu.entry_problem(out) is None
    return cfg, task, out


def _break_entry(out: Path, kind: str) -> None:
    if kind == "weights-deleted":
        (out / "model.safetensors").unlink()
    elif kind == "warmup-json-list":
        (out / "warmup.json").write_text("[1]")
    elif kind == "warmup-json-binary":
        (out / "warmup.json").write_bytes(b"\xff\xfe\x00\x01" * 64)
    elif kind == "weights-truncated":
        data = (out / "model.safetensors").read_bytes()
        (out / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif kind == "weights-edited":
        data = bytearray((out / "model.safetensors").read_bytes())
        data[-1] ^= 0xFF
        (out / "model.safetensors").write_bytes(bytes(data))
    elif kind == "config-deleted":
        (out / "config.json").unlink()


@pytest.mark.parametrize("kind", ["weights-deleted", "warmup-json-list", "warmup-json-binary", "weights-truncated",
                                  "weights-edited", "config-deleted"])
def test_broken_warmup_entry_is_rebuilt(tmp_path, caplog, kind):
    cfg, task, out = _entry(tmp_path)
    _break_entry(out, kind)
    assert wu.entry_problem(out) is not None
    out2, info = wu.ensure_warmup(cfg, task, torch.device("cpu"), progress=False)
    assert out2 == out and info["cached"] is False                               # rebuilt, not trusted
    assert wu.entry_problem(out) is None
    warned = [r.getMessage() for r in caplog.records if "rebuilding it" in r.getMessage()]
    assert len(warned) == 1 and str(out) in warned[0]
    model, tok, start = wu.starting_checkpoint(cfg, task, torch.device("cpu"), progress=False)
    assert start["cached"] is True and start["source"] == str(out)


def test_training_from_a_warmup_entry_without_weights_rebuilds_it(tmp_path, caplog):
    cfg, task, out = _entry(tmp_path, ["budget.amount=1", "budget.eval_points=1"])
    (out / "model.safetensors").unlink()
    s = train(cfg, progress=False)
    assert s["status"] == "finished" and s["start"]["cached"] is False
    assert (out / "model.safetensors").is_file()


# --------------------------------------------------------------------------- 5: the cached start evaluation


def test_edited_cached_start_evaluation_is_recomputed(tmp_path, caplog):
    cfg, task, out = _entry(tmp_path)
    start = {"source": str(out)}
    run_out = tmp_path / "run"
    calls = []

    def compute(value=0.25):
        def f():
            calls.append(value)
            (run_out / "eval").mkdir(parents=True, exist_ok=True)
            (run_out / "eval" / f"{task.name}_0.jsonl").write_text(json.dumps({"id": 1, "greedy_correct": True}) + "\n")
            return {f"eval/{task.name}/acc": value}
        return f

    key = f"eval/{task.name}/acc"
    assert cached_initial_eval(cfg, start, run_out, compute(0.25))[key] == 0.25 and calls == [0.25]
    assert cached_initial_eval(cfg, start, run_out, compute(0.5))[key] == 0.25 and calls == [0.25]   # cached
    cache = out / "initial_eval" / initial_eval_key(cfg)
    (cache / "metrics.json").write_text(json.dumps({key: 0.99}))                  # edited by hand
    assert cached_initial_eval(cfg, start, run_out, compute(0.25))[key] == 0.25 and calls == [0.25, 0.25]
    assert any("metrics.json was changed" in r.getMessage() for r in caplog.records)
    assert json.loads((cache / "metrics.json").read_text())[key] == 0.25           # rewritten
    assert cached_initial_eval(cfg, start, run_out, compute(0.5))[key] == 0.25 and len(calls) == 2
    # an edited per-problem record is an edit too
    rec = cache / f"{task.name}_0.jsonl"
    rec.write_text(rec.read_text().replace("true", "false"))
    cached_initial_eval(cfg, start, run_out, compute(0.25))
    assert len(calls) == 3
    # the checkpoint it describes changed (same path, other weights): recomputed
    (out / "tokenizer_config.json").write_text((out / "tokenizer_config.json").read_text() + " ")
    assert cached_initial_eval(cfg, start, run_out, compute(0.75))[key] == 0.75 and len(calls) == 4
    assert any("describes another checkpoint" in r.getMessage() for r in caplog.records)
    assert not list(cache.parent.glob("*.tmp*")) and not list(cache.parent.glob("*.old*"))


def test_cached_start_evaluation_without_digests_is_recomputed(tmp_path, caplog):
    """An entry written before entries were checked (no digests in source.json) is not trusted."""
    cfg, task, out = _entry(tmp_path)
    cache = out / "initial_eval" / initial_eval_key(cfg)
    cache.mkdir(parents=True)
    key = f"eval/{task.name}/acc"
    (cache / "metrics.json").write_text(json.dumps({key: 0.99}))
    (cache / "source.json").write_text(json.dumps({"computed_by": "elsewhere", "seconds": 1.0}))
    ev = cached_initial_eval(cfg, {"source": str(out)}, tmp_path / "run", lambda: {key: 0.25})
    assert ev == {key: 0.25}
    assert any("no digests" in r.getMessage() for r in caplog.records)
