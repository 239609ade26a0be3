"""Disk full (ENOSPC / EDQUOT) during `harness train`: one line (exit 3), no traceback, the run
marked failed where there is room to write it, no temporary file left behind.

The first tests fake the full disk (a ``torch.save`` that raises); the ``tmpfs`` ones fill a real
2 MiB tmpfs (root only; skipped where ``mount`` is not permitted) right before the write under
test, so the error is what torch, safetensors and Python really raise there (torch: a
RuntimeError naming no cause when given a path; safetensors: a SafetensorError)."""
from __future__ import annotations

import errno
import os
import subprocess

import pytest
import torch

from harness.cli.main import EXIT_NO_SPACE, main
from harness.config.schema import load_config
from harness.foundation import files
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


def _write_partial(path) -> None:
    """A few bytes into ``path`` (a file name, or the file object the harness saves through)."""
    if hasattr(path, "write"):
        path.write(b"partial")
        path.flush()
    else:
        with open(path, "wb") as f:
            f.write(b"partial")


def _full_disk_save(obj, path, *a, **kw):
    """torch.save that, for the resume point (``state.tmp``), writes a few bytes, then finds
    the disk full; other saves (the warm-up cache) go through."""
    name = str(getattr(path, "name", path))
    if not name.endswith("state.tmp"):
        return _REAL_SAVE(obj, path, *a, **kw)
    _write_partial(path)
    raise OSError(errno.ENOSPC, "No space left on device")


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
    real = files.rewrite_atomic
    full = {"on": False}

    def rewrite(path, write):
        if full["on"]:
            real(path, lambda f: (f.write("x" * 10), (_ for _ in ()).throw(
                OSError(errno.EDQUOT, "Disk quota exceeded", str(path)))))
        return real(path, write)

    def save(obj, path, *a, **kw):
        full["on"] = full["on"] or str(getattr(path, "name", path)).endswith("state.tmp")
        return _full_disk_save(obj, path)

    monkeypatch.setattr(files, "rewrite_atomic", rewrite)
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
        _write_partial(path)
        raise OSError(errno.ENOSPC, "No space left on device")

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


# --------------------------------------------------------------------------- a real full disk (tmpfs)


@pytest.fixture
def tmpfs(tmp_path):
    """A 2 MiB tmpfs mounted at ``tmp_path/tmpfs`` (unmounted after the test)."""
    d = tmp_path / "tmpfs"
    d.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot run mount ({e}): the real full-disk tests need a 2 MiB tmpfs")
    if r.returncode != 0:
        pytest.skip(f"mounting a 2 MiB tmpfs is not permitted here ({r.stderr.strip() or r.returncode}): the real "
                    f"full-disk tests need root and mount permission")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=30)


def _fill(fs) -> "os.PathLike":
    """Fill the filesystem at ``fs`` to the last byte; returns the filler file."""
    filler = fs / ".filler"
    with open(filler, "ab", buffering=0) as f:
        for size in (1 << 16, 4096, 512, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
    return filler


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("harness")]
    assert len(lines) == 1 and "Traceback" not in err and "During handling" not in err, err
    return lines[0]


def test_torch_save_to_a_path_on_a_full_disk_hides_enospc_and_save_torch_does_not(tmpfs):
    """Why the harness saves through a file object: given a path, torch reports a full disk as a
    RuntimeError that names no cause; through a Python file the ENOSPC arrives as an OSError."""
    from harness.foundation.files import disk_error
    from harness.rundir.layout import save_torch

    _fill(tmpfs)
    with pytest.raises(RuntimeError) as ei:
        torch.save({"w": torch.zeros(4096)}, tmpfs / "by_path.pt")
    assert not isinstance(ei.value, OSError) and "No space" not in str(ei.value)
    with pytest.raises(OSError) as ei:
        save_torch({"w": torch.zeros(4096)}, tmpfs / "by_file.pt")
    assert ei.value.errno == errno.ENOSPC and ei.value.filename == str(tmpfs / "by_file.pt")
    from safetensors.torch import save_file
    with pytest.raises(Exception) as ei:
        save_file({"w": torch.zeros(4096)}, str(tmpfs / "w.safetensors"))
    assert not isinstance(ei.value, OSError) and disk_error(ei.value).errno == errno.ENOSPC


def test_real_full_disk_in_the_checkpoint_save_is_exit_3(tmp_path, tmpfs, monkeypatch, capsys):
    """The disk fills up right before the resume point is written (torch.save into state.tmp)."""
    sets = TINY + [f"output_dir={tmpfs / 'results'}", f"warmup.cache_dir={tmp_path / 'wc'}"]
    argv = ["train", QUICKSTART, "--no-progress"] + [a for s in sets for a in ("--set", s)]
    real = loop.save_checkpoint

    def fill_then_save(*a, **kw):
        _fill(tmpfs)
        return real(*a, **kw)

    monkeypatch.setattr(loop, "save_checkpoint", fill_then_save)
    rc = main(argv)
    line = _one_line(capsys.readouterr().err)
    out = run_dir(load_config(QUICKSTART, sets))
    assert rc == EXIT_NO_SPACE and "out of disk space writing" in line, line
    assert str(out / "checkpoint" / "state.tmp") in line and "No space left on device" in line
    assert _tmp_files(out) == [] and not (out / "checkpoint" / "state.pt").exists()
    monkeypatch.undo()
    os.unlink(tmpfs / ".filler")                        # space freed: the same command finishes the run
    assert main(argv) == 0
    assert read_json(out / "summary.json")["status"] == "finished"


def test_real_full_disk_in_safetensors_leaves_no_warmup_entry(tmp_path, tmpfs, monkeypatch, capsys):
    """The disk fills up right before the warm-up's weights are written (safetensors: a
    SafetensorError, not an OSError): exit 3 naming the entry, no partial cache entry."""
    import transformers.modeling_utils as mu

    sets = TINY + [f"output_dir={tmp_path / 'results'}", f"warmup.cache_dir={tmpfs / 'wc'}"]
    argv = ["train", QUICKSTART, "--no-progress"] + [a for s in sets for a in ("--set", s)]
    real = mu.safe_save_file

    def fill_then_save(*a, **kw):
        _fill(tmpfs)
        return real(*a, **kw)

    monkeypatch.setattr(mu, "safe_save_file", fill_then_save)
    rc = main(argv)
    line = _one_line(capsys.readouterr().err)
    assert rc == EXIT_NO_SPACE and "out of disk space writing" in line and str(tmpfs / "wc") in line, line
    entries = sorted(p.name for p in (tmpfs / "wc").iterdir())
    assert all(e.endswith(".lock") for e in entries), entries   # neither <key>.tmp nor a half entry
    monkeypatch.undo()
    os.unlink(tmpfs / ".filler")
    assert main(argv) == 0


def test_real_full_disk_in_the_start_evaluation_cache_leaves_no_partial_entry(tmp_path, tmpfs, monkeypatch,
                                                                              capsys):
    """The disk fills up right before the start evaluation is stored beside the warm-up
    (``initial_eval/<key>.tmp<pid>`` used to be left behind)."""
    from harness.train import evalpoints

    sets = TINY + [f"output_dir={tmp_path / 'results'}", f"warmup.cache_dir={tmpfs / 'wc'}"]
    argv = ["train", QUICKSTART, "--no-progress"] + [a for s in sets for a in ("--set", s)]
    real = evalpoints._write_cache

    def fill_then_write(*a, **kw):
        _fill(tmpfs)
        return real(*a, **kw)

    monkeypatch.setattr(evalpoints, "_write_cache", fill_then_write)
    rc = main(argv)
    line = _one_line(capsys.readouterr().err)
    assert rc == EXIT_NO_SPACE and "out of disk space writing" in line and "initial_eval" in line, line
    cache = next(p for p in (tmpfs / "wc").iterdir() if p.is_dir()) / "initial_eval"
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == []
    monkeypatch.undo()
    os.unlink(tmpfs / ".filler")
    assert main(argv) == 0
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    assert (entry / "source.json").is_file() and (entry / "metrics.json").is_file()


def test_real_full_disk_in_the_final_model_leaves_no_partial_model(tmp_path, tmpfs, monkeypatch, capsys):
    """A LoRA run: the merged weights and the tokenizer are written, then the disk fills up before the adapter
    (issue 48, item 7). Exit 3 in one line, no ``final_model/`` (a merged model without its adapter would load
    and be scored as the run's policy), no hidden stage left; with room again the same command finishes the run
    and writes the whole folder."""
    from peft import PeftModel

    sets = TINY + [f"output_dir={tmpfs / 'results'}", f"warmup.cache_dir={tmp_path / 'wc'}",
                   "train.save_final_model=true", "model.lora.rank=2", "model.lora.alpha=4"]
    argv = ["train", QUICKSTART, "--no-progress"] + [a for s in sets for a in ("--set", s)]
    real = PeftModel.save_pretrained

    def fill_then_save(self, *a, **kw):
        _fill(tmpfs)
        return real(self, *a, **kw)

    monkeypatch.setattr(PeftModel, "save_pretrained", fill_then_save)
    rc = main(argv)
    line = _one_line(capsys.readouterr().err)
    out = run_dir(load_config(QUICKSTART, sets))
    assert rc == EXIT_NO_SPACE and "out of disk space writing" in line, line
    assert not (out / "final_model").exists() and not [p.name for p in out.iterdir() if "final_model" in p.name]
    monkeypatch.undo()
    os.unlink(tmpfs / ".filler")
    assert main(argv) == 0
    assert read_json(out / "summary.json")["status"] == "finished"
    assert (out / "final_model" / "model.safetensors").is_file()
    assert (out / "final_model" / "adapter" / "adapter_model.safetensors").is_file()
