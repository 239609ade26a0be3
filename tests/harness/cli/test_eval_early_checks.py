"""`harness eval`: bad inputs found by the audit end in exit 2 with one line naming the problem, before the
model loads (the loader is replaced by a stub that fails the test): thread counts past what the thread
pools can start (--threads, OMP_NUM_THREADS), device strings torch would refuse with a traceback, an
output folder (the default one included) or result file that could only fail at the end, a file given
as --model. A default completion limit the model's context cannot hold after the prompt is lowered to
what fits, with one note; an explicit one is refused, naming the largest that fits."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from evals.catalog import get_task
from harness.admission import gate
from harness.foundation import files
from harness.cli import eval as cli_eval
from harness.cli.main import main
from harness.cli.polish import LINE_LIMIT
from harness.config.schema import ModelConfig, TaskConfig, config_from_dict, load_config
from harness.engine.models import build_char_tokenizer
from harness.foundation.base import ConfigError
from harness.rundir.layout import read_jsonl
from refusals import refused  # tests/support
from small_model import save_small_model  # tests/support

CTX = ModelConfig().max_length  # the tiny model's context (max_position_embeddings): 96


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A small complete model folder (the tiny model's context of 96 tokens)."""
    folder = tmp_path_factory.mktemp("models") / "good"
    save_small_model(folder)
    return folder


@pytest.fixture
def sandbox(tmp_path, monkeypatch) -> Path:
    """cwd = tmp_path/cwd; loading a model fails the test."""
    from harness.engine import models
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(models, "load_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    return tmp_path


def _refused(capsys, argv, must, root: Path) -> str:
    """Exit 2, one line holding ``must``, no traceback, nothing written under ``root``, quickly."""
    return refused(capsys, argv, must, root, max_len=LINE_LIMIT + 100, max_seconds=20)


# ------------------------------------------------------------------ 1. thread counts

@pytest.mark.parametrize("threads", ["100000", "1025"])
def test_threads_past_the_cap_are_refused(threads, model, sandbox, capsys):
    _refused(capsys, ["eval", "--model", str(model), "--task", "arith", "--threads", threads],
             f"harness eval: --threads={threads} is invalid: must be between 0 and 1024 (0: the default count)",
             sandbox)


def test_omp_num_threads_past_the_cap_is_refused(model, sandbox, capsys, monkeypatch):
    """--threads 0 in portable numerics takes OMP_NUM_THREADS: the same cap, naming the variable."""
    monkeypatch.setenv("OMP_NUM_THREADS", "100000")
    err = _refused(capsys, ["eval", "--model", str(model), "--task", "arith"],
                   "harness eval: OMP_NUM_THREADS=100000 is invalid", sandbox)
    assert "at most 1,024" in err and "--threads" in err


def test_decide_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    assert gate.decide_threads(1024, "portable", "--threads") == 1024
    with pytest.raises(ConfigError) as e:
        gate.decide_threads(1025, "native", "train.threads")
    assert str(e.value) == "train.threads=1025 is invalid: must be between 0 and 1024 (0: the default count)"
    with pytest.raises(ConfigError, match="must be between 0 and 1024"):
        gate.decide_threads(-1, "portable", "--threads")
    assert gate.decide_threads(0, "native", "x") == 0  # native: torch's default


# ------------------------------------------------------------------ 2. device strings

@pytest.mark.parametrize("device", ["foo", "cuda:x", "cpu:0", "cuda:", "CUDA", "cpu\n", " cpu", "cuda:-1", "mps"])
def test_device_strings_torch_would_refuse(device, model, sandbox, capsys):
    err = _refused(capsys, ["eval", "--model", str(model), "--task", "arith", "--device", device],
                   f"harness eval: --device={device!r} is invalid: must be auto, cpu, cuda or cuda:N", sandbox)
    assert "RuntimeError" not in err and "ValueError" not in err


@pytest.mark.parametrize("device", ["cuda:x", "cuda:1:2", "foo"])
def test_check_device_on_a_gpu_machine(device, monkeypatch):
    """Where CUDA is available a malformed index was an int() ValueError traceback: now the one-line rule."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=re.escape(f"--device={device!r} is invalid: must be auto, cpu, cuda")):
        gate.check_device(device, "--device")
    with pytest.raises(ConfigError, match=re.escape("this machine has 2 CUDA device(s) (cuda:0..cuda:1)")):
        gate.check_device("cuda:2", "--device")
    gate.check_device("cuda:1", "--device")
    gate.check_device("cpu", "--device")


def test_device_problem_uses_the_config_rule():
    for good in ("auto", "cpu", "cuda", "cuda:0", "cuda:12"):
        assert gate.device_problem(good) is None and load_config(None, [f"device={good}"]).device == good
    assert gate.device_problem(None, "device") == "device=None is invalid: must be auto, cpu, cuda or cuda:N " \
                                                   "(N a CUDA device index)"
    # one rule: the config refuses what --device refuses (its regex took "cpu\n" before)
    for bad in ("cpu\n", "cuda:x", "mps"):
        with pytest.raises(ConfigError, match=re.escape(gate.device_problem(bad))):
            config_from_dict({"device": bad})


# ------------------------------------------------------------------ 3. output paths, checked before the model loads

def test_default_output_folder_under_a_file(model, sandbox, capsys):
    """`./results` is a file: refused before the model loads (it was a NotADirectoryError after the evaluation)."""
    (sandbox / "cwd" / "results").write_text("not a folder")
    err = _refused(capsys, ["eval", "--model", str(model), "--task", "arith", "--limit", "2"],
                   "--output-dir='results/eval/arith-good' is invalid: is under results, which is a file", sandbox)
    assert "(the default output folder: give --output-dir elsewhere)" in err


@pytest.mark.parametrize("name", ["arith.jsonl", "arith_metrics.json", "arith.jsonl.tmp"])
@pytest.mark.parametrize("default", [True, False], ids=["default", "given"])
def test_a_result_file_that_is_a_folder(name, default, model, sandbox, capsys):
    out = Path("results/eval/arith-good") if default else sandbox / "ev"
    (sandbox / "cwd" / out / name).mkdir(parents=True)
    argv = ["eval", "--model", str(model), "--task", "arith", "--limit", "2"] + ([] if default else
                                                                                  ["--output-dir", str(out)])
    err = _refused(capsys, argv, f"{out / name} is a directory where the result file {name} goes", sandbox)
    assert err.startswith("harness: config error: --output-dir=")


def test_a_given_output_dir_that_is_a_file(model, sandbox, capsys):
    f = sandbox / "out-file"
    f.write_text("x")
    err = _refused(capsys, ["eval", "--model", str(model), "--task", "arith", "--output-dir", str(f)],
                   "is a file, not a directory", sandbox)
    assert "default output folder" not in err


@pytest.mark.parametrize("default", [True, False], ids=["default", "given"])
def test_a_model_that_fails_to_load_leaves_no_output_folder(default, model, sandbox, capsys, monkeypatch):
    """The output folder is checked (made) before the model loads; a load that fails takes it away again."""
    from harness.engine import models
    from harness.foundation.errors import ModelLoadError

    def broken(*a, **k):
        raise ModelLoadError(f"{model}: the model cannot be loaded (a stub)")
    monkeypatch.setattr(models, "load_policy", broken)
    (sandbox / "keep").mkdir()
    argv = ["eval", "--model", str(model), "--task", "arith", "--limit", "2"]
    _refused(capsys, argv + ([] if default else ["--output-dir", str(sandbox / "keep" / "a" / "b")]),
             "the model cannot be loaded (a stub)", sandbox)
    assert (sandbox / "keep").is_dir()  # a folder that was there stays


def test_check_output_files(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    files.check_output_files(tmp_path, ["a.json", "b.json"], "--out")  # an existing file, a missing one: fine
    (tmp_path / "c.json").mkdir()
    with pytest.raises(ConfigError, match="c.json is a directory where the result file c.json goes"):
        files.check_output_files(tmp_path, ["a.json", "c.json"], "--out")


# ------------------------------------------------------------------ 4. completion limit against the context

def _longest_arith_prompt(limit: int) -> int:
    """Tokens of the longest of the first ``limit`` default arith prompts for the character tokenizer."""
    tok = build_char_tokenizer()
    task = get_task(TaskConfig(name="arith", eval_size=limit))
    return max(len(tok(task.format_prompt(p), add_special_tokens=True)["input_ids"]) for p in task.eval_problems())


def test_the_default_limit_is_lowered_to_what_fits(model, tmp_path, capsys, monkeypatch):
    """No --max-new-tokens: 512 against a 96-token context was decoded anyway (exit 0, truncated); now the
    default is lowered to the context minus the longest prompt, with one note, and recorded."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "ev"
    rc = main(["eval", "--model", str(model), "--task", "arith", "--limit", "2", "--no-progress",
               "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    fits = CTX - _longest_arith_prompt(2)
    notes = [line for line in err.splitlines() if line.startswith("harness eval:")]
    assert notes == [f"harness eval: note: max_new_tokens 512 (the default) does not fit the model's context of "
                     f"{CTX} tokens (max_position_embeddings in {model / 'config.json'}) after the longest "
                     f"prompt's {CTX - fits}: using {fits} (give --max-new-tokens to choose)"], err
    got = json.loads((out / "arith_metrics.json").read_text())
    assert got["settings"]["max_new_tokens"] == fits
    assert all(r["greedy"]["num_tokens"] <= fits for r in read_jsonl(out / "arith.jsonl"))


def test_an_explicit_limit_that_does_not_fit_after_the_prompt(model, sandbox, capsys):
    """--max-new-tokens 90 <= 96 passed the old check, but the prompt takes the rest: refused, naming what fits."""
    fits = CTX - _longest_arith_prompt(3)
    err = _refused(capsys, ["eval", "--model", str(model), "--task", "arith", "--limit", "3",
                            "--max-new-tokens", str(fits + 1)],
                   f"--max-new-tokens {fits + 1} is invalid: the model's context holds {CTX} tokens", sandbox)
    assert err.endswith(f"and the longest prompt takes {CTX - fits} of them: give at most {fits}")


def test_an_explicit_limit_that_fits_is_kept(model, sandbox, capsys, monkeypatch):
    """The limit that fits exactly passes every check and reaches the loader (the stub stops there)."""
    fits = CTX - _longest_arith_prompt(3)
    with pytest.raises(pytest.fail.Exception, match="the model was loaded"):
        main(["eval", "--model", str(model), "--task", "arith", "--limit", "3", "--max-new-tokens", str(fits),
              "--output-dir", str(sandbox / "ev")])
    assert capsys.readouterr().err == ""


def test_fit_context_rules():
    fit = cli_eval.fit_context
    assert fit(512, False, "the default", None, "", 10) == (512, None)  # the context unknown: as asked
    assert fit(40, True, "--max-new-tokens", 96, "w", 10) == (40, None)
    value, note = fit(256, False, "protocol lighteval-5shot's default", 96, "w", 10)
    assert value == 86 and note.startswith("note: max_new_tokens 256 (protocol lighteval-5shot's default) does not")
    with pytest.raises(ConfigError, match="--max-new-tokens 87 is invalid: .* give at most 86"):
        fit(87, True, "--max-new-tokens", 96, "w", 10)
    # prompts that alone fill the context: nothing fits; a warning, and a default no longer than the context
    value, note = fit(512, False, "the default", 96, "w", 371)
    assert value == 96 and note == ("warning: the longest prompt has 371 tokens and the model's context holds 96 (w): "
                                    "the completions run past it; max_new_tokens 512 (the default) lowered to 96")
    assert fit(5, True, "--max-new-tokens", 96, "w", 371)[0] == 5


# ------------------------------------------------------------------ 6. a file that is not a model

def test_a_yaml_config_given_as_model(sandbox, capsys):
    f = sandbox / "tiny.yaml"
    f.write_text("task: {name: arith}\n")
    err = _refused(capsys, ["eval", "--model", str(f)],
                   f"harness eval: --model {f} is a file, not a model: --model expects a model folder", sandbox)
    assert "or a .gguf file" in err and f"`harness train {f}` trains from one" in err
    assert "not a valid JSON" not in err


def test_a_model_file_given_as_model(model, sandbox, capsys):
    err = _refused(capsys, ["eval", "--model", str(model / "config.json"), "--task", "arith"],
                   "is a file, not a model", sandbox)
    assert err.endswith(f"give the folder that holds it: {model}")


@pytest.mark.parametrize("argv,must", [
    (["--model", "no-such-model"], "model path not found: no-such-model"),
    (["--model", "no-such.gguf"], "model path not found: no-such.gguf"),
    (["--model", "{model}", "--gguf-file", "x.gguf"], "GGUF file not found: {model}/x.gguf"),
], ids=["missing-folder", "missing-gguf", "missing-gguf-file"])
def test_a_missing_model_before_any_work(argv, must, model, sandbox, capsys):
    argv = [a.replace("{model}", str(model)) for a in argv]
    _refused(capsys, ["eval", *argv, "--task", "arith"], must.replace("{model}", str(model)), sandbox)
