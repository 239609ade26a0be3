"""The admission gate (harness/admission/gate.py): every command and the library entry point decide a run's numerics,
threads, device, input paths and output folders there, once, and refuse in one line before any work."""
from __future__ import annotations

import os

import pytest

from harness.cli.main import main
from harness.admission import gate
from harness.config.schema import load_config
from harness.foundation import numerics
from harness.foundation.base import ConfigError

QUICKSTART = "harness/configs/quickstart.yaml"


def _one_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1e3", "1025", "99999", "4,2"])
def test_a_thread_count_in_the_environment_is_held_to_the_rule_by_train(value, tmp_path, monkeypatch, capsys):
    """OpenMP reads OMP_NUM_THREADS whatever train.threads says: 99999 segfaulted `harness train`, abc ran silently."""
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    out = tmp_path / "results"
    assert main(["train", QUICKSTART, "--output-dir", str(out)]) == 2
    line = _one_line(capsys)
    assert f"OMP_NUM_THREADS={value} is invalid" in line and "at most 1,024" in line
    assert not out.exists()  # refused before the results folder was made


@pytest.mark.parametrize("var", gate.THREAD_VARIABLES)
def test_environment_rule_in_native_numerics_and_with_threads_given(var, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setenv(var, "2000")
    for threads, mode in ((0, "native"), (3, "portable"), (3, "native")):
        with pytest.raises(ConfigError, match=f"{var}=2000 is invalid"):
            gate.decide_threads(threads, mode)
    monkeypatch.setenv(var, " 7 ")
    assert gate.decide_threads(3, "native") == 3
    assert gate.decide_threads(0, "portable") == (7 if var == "OMP_NUM_THREADS" else numerics.DEFAULT_THREADS)


def test_the_runs_mode_wins_over_a_stray_environment_and_is_pinned_at_once(monkeypatch):
    """A stray GRPO_HARNESS_NUMERICS=native made a `numerics: portable` run non-portable under the same run id: the
    gate takes the config's mode and sets its pins before numpy or torch could read the stray ones."""
    monkeypatch.setenv(numerics.ENV_MODE, "native")
    for k in numerics.PINS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg = load_config(QUICKSTART, ["warmup.enabled=false"])
    assert cfg.numerics == "portable"
    run = gate.admit(cfg, inputs=False, warmup_cache=False)
    assert run.numerics == "portable" and run.threads == numerics.DEFAULT_THREADS and run.device == "auto"
    assert os.environ[numerics.ENV_MODE] == "portable" and os.environ["ATEN_CPU_CAPABILITY"] == "avx2"
    # a plan's runs (here=False) leave this process's environment alone
    monkeypatch.setenv(numerics.ENV_MODE, "native")
    gate.admit(cfg, inputs=False, warmup_cache=False, here=False)
    assert os.environ[numerics.ENV_MODE] == "native"
    # work without a run config takes the process's mode
    assert gate.admit(None, here=False).numerics == "native"


def test_outputs_and_the_warmup_cache_are_made_writable_folders(tmp_path):
    cfg = load_config(QUICKSTART, [f"output_dir={tmp_path / 'r'}", f"warmup.cache_dir={tmp_path / 'c'}"])
    run = gate.admit(cfg, outputs={"--output-dir": cfg.output_dir}, here=False)
    assert run.outputs == (tmp_path / "r", tmp_path / "c") and all(p.is_dir() for p in run.outputs)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"--output-dir='.*/file/x' is invalid: is under .*file, which is a file"):
        gate.admit(cfg, outputs={"--output-dir": tmp_path / "file" / "x"}, here=False)


def test_the_library_entry_point_goes_through_the_gate(tmp_path):
    """loop.train given a Config admits it: a device this machine lacks is one ConfigError before any folder."""
    from harness.train.loop import train
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cfg = load_config(QUICKSTART, ["device=cuda", f"output_dir={tmp_path / 'r'}"])
    with pytest.raises(ConfigError, match="device='cuda' is invalid: CUDA is not available on this machine"):
        train(cfg, progress=False)
    assert not (tmp_path / "r").exists()


def test_rm_train_checks_the_paths_it_reads_before_the_warmup(tmp_path, capsys, monkeypatch):
    from harness.train import warmup

    monkeypatch.setattr(warmup, "starting_checkpoint", lambda *a, **k: pytest.fail("the warm-up started"))
    argv = ["rm", "train", QUICKSTART, "--type", "orm", "--output-dir", str(tmp_path / "r"),
            "--set", f"algorithm.prm={tmp_path / 'no-such-prm'}"]
    assert main(argv) == 2
    line = _one_line(capsys)
    assert "algorithm.prm=" in line and "no such file or folder" in line


def test_sweep_admits_every_run_of_the_plan_dry_run_included(tmp_path, capsys):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"name: s\nbase: {os.path.abspath(QUICKSTART)}\ngrid:\n  algorithm: [grpo, ppo]\n  seed: [0]\n"
                     f"algorithms:\n  ppo:\n    device: cuda:7\n")
    assert main(["sweep", str(sweep), "--dry-run", "--output-dir", str(tmp_path / "r")]) == 2
    line = _one_line(capsys)
    assert "device='cuda:7' is invalid" in line


def test_a_results_root_too_long_for_the_paths_a_run_writes_is_refused_before_work(tmp_path, capsys):
    """A 4,080-character run path ended in a 30-line `File name too long` part-way through a run."""
    deep = tmp_path / "/".join(["a" * 200] * 19)
    assert main(["train", QUICKSTART, "--output-dir", str(deep)]) == 2
    line = _one_line(capsys)
    assert "is invalid: its path is" in line and "choose a shorter folder" in line
    assert not (tmp_path / ("a" * 200)).exists()
    gate.check_path_length(tmp_path / "short", "--output-dir")  # an ordinary folder passes


def test_staleness_with_lora_is_refused_until_the_pipeline_hands_over_adapters():
    with pytest.raises(ConfigError, match=r"train.staleness=1 is invalid: the pipelined sampler copies whole weights"):
        load_config(QUICKSTART, ["train.staleness=1", "model.lora.rank=4"])
    load_config(QUICKSTART, ["train.staleness=1"])
    load_config(QUICKSTART, ["model.lora.rank=4"])
