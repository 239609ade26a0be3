"""Disk full (ENOSPC / EDQUOT) during `harness train`: one line (exit 3), no traceback, the run
marked failed where there is room to write it, no temporary file left behind."""
from __future__ import annotations

import errno

import pytest
import torch

from harness.cli.main import EXIT_NO_SPACE, main
from harness.config.schema import load_config
from harness.rundir import layout
from harness.rundir.layout import read_json
from harness.train import checkpoint as ck
from harness.train import loop
from harness.train.loop import run_dir

QUICKSTART = "harness/configs/quickstart.yaml"
TINY = [
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "task.min_ops=1", "task.max_ops=1", "task.eval_size=4", "warmup.steps=0",
    "sampling.samples_per_prompt=2", "sampling.max_new_tokens=4", "train.prompts_per_step=2",
    "train.threads=1", "budget.unit=steps", "budget.amount=3", "budget.eval_points=3",
    "train.save_final_model=false", "eval.greedy=true", "eval.n=0",
]


def _sets(tmp_path) -> list[str]:
    return TINY + [f"output_dir={tmp_path / 'results'}", f"warmup.cache_dir={tmp_path / 'wc'}"]


def _argv(tmp_path) -> list[str]:
    return ["train", QUICKSTART, "--no-progress"] + [a for s in _sets(tmp_path) for a in ("--set", s)]


_REAL_SAVE = torch.save


def _full_disk_save(obj, path, *a, **kw):
    """torch.save that, for the resume point (``state.tmp``), writes a few bytes, then finds
    the disk full; other saves (the warm-up cache) go through."""
    if not str(path).endswith("state.tmp"):
        return _REAL_SAVE(obj, path, *a, **kw)
    with open(path, "wb") as f:
        f.write(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


def _tmp_files(root):
    return sorted(p for p in root.rglob("*.tmp"))


def test_enospc_in_checkpoint_is_one_line_and_the_run_is_failed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ck.torch, "save", _full_disk_save)
    rc = main(_argv(tmp_path))
    err = capsys.readouterr().err
    assert rc == EXIT_NO_SPACE, err
    lines = [ln for ln in err.splitlines() if ln.startswith("harness")]   # (model loading prints bars)
    assert len(lines) == 1 and "out of disk space" in lines[0] and "state.tmp" in lines[0], err
    assert "Traceback" not in err and "During handling" not in err
    out = run_dir(load_config(QUICKSTART, _sets(tmp_path)))
    s = read_json(out / "summary.json")
    assert s["status"] == "failed" and "No space left on device" in s["error"]
    assert "OSError" in (out / "error.txt").read_text()
    assert _tmp_files(out) == []                        # the partial checkpoint/state.tmp is gone
    assert not (out / "checkpoint" / "state.pt").exists()


def test_disk_full_everywhere_still_one_line(tmp_path, monkeypatch, capsys):
    """Recording the failure fails too (summary.json, error.txt): the original error is the one
    reported, once, and nothing is left half-written."""
    real = layout.rewrite_atomic
    full = {"on": False}

    def rewrite(path, write):
        if full["on"]:
            real(path, lambda f: (f.write("x" * 10), (_ for _ in ()).throw(
                OSError(errno.EDQUOT, "Disk quota exceeded", str(path)))))
        return real(path, write)

    def save(obj, path, *a, **kw):
        full["on"] = full["on"] or str(path).endswith("state.tmp")
        return _full_disk_save(obj, path)

    monkeypatch.setattr(layout, "rewrite_atomic", rewrite)
    monkeypatch.setattr(ck.torch, "save", save)
    rc = main(_argv(tmp_path))
    err = capsys.readouterr().err
    assert rc == EXIT_NO_SPACE, err
    assert "Traceback" not in err and "During handling" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("harness")]
    assert len(lines) == 1 and "out of disk space" in lines[0] and "state.tmp" in lines[0], err
    out = run_dir(load_config(QUICKSTART, _sets(tmp_path)))
    assert read_json(out / "summary.json")["status"] == "running"   # could not be recorded: best effort
    assert not (out / "error.txt").exists()
    assert _tmp_files(out) == []


def test_failed_checkpoint_save_keeps_the_previous_resume_point(tmp_path, monkeypatch):
    ckpt = tmp_path / "checkpoint" / "state.pt"
    ckpt.parent.mkdir()
    torch.save({"counters": {"step": 1}}, ckpt)
    monkeypatch.setattr(ck.torch, "save", _full_disk_save)
    with pytest.raises(OSError) as ei:
        ck._save_atomic({"counters": {"step": 2}}, ckpt)
    assert ei.value.errno == errno.ENOSPC
    assert not ckpt.with_suffix(".tmp").exists()
    assert torch.load(ckpt, weights_only=True)["counters"]["step"] == 1


def test_other_os_errors_are_not_called_disk_full(tmp_path, monkeypatch):
    def boom(*a, **kw):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(loop, "_train_run", boom)
    with pytest.raises(OSError, match="Input/output"):
        main(_argv(tmp_path))


def test_enospc_while_saving_the_warmup_leaves_no_partial_cache_entry(tmp_path, monkeypatch, capsys):
    """The warm-up checkpoint is written to ``<key>.tmp`` and renamed: a full disk during that write
    fails the command in one line and leaves neither the ``.tmp`` folder nor a cache entry, so the
    next run trains the warm-up again instead of loading half of one."""
    from harness.train import warmup as wu

    def full(obj, path, *a, **kw):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(wu.torch, "save", full)   # the warm-up's optimizer state, after the model files
    argv = ["train", QUICKSTART, "--no-progress"] + [a for s in _sets(tmp_path) + ["warmup.steps=2"]
                                                     for a in ("--set", s)]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == EXIT_NO_SPACE, err
    assert "out of disk space" in err and "Traceback" not in err
    cache = tmp_path / "wc"
    entries = [p.name for p in cache.iterdir()] if cache.exists() else []
    assert not [e for e in entries if e.endswith(".tmp")], entries
    assert not [e for e in entries if not e.endswith(".lock")], entries   # no (partial) cache entry
    monkeypatch.undo()
    assert main(argv) == 0   # the next run builds it
    assert (cache / next(e for e in (p.name for p in cache.iterdir()) if not e.endswith(".lock")) / "warmup.json").is_file()
