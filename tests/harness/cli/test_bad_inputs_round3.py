"""Bad inputs, round 3 (issue 25): each case was a traceback, a hang or silently wrong; each
now ends in exit 2 with one line naming the field, option or file and what to do, before any
work (nothing written outside the output directory), or, where the input is usable, in a
one-line warning. Nothing here trains: `harness train` and the warm-up are replaced by stubs
that fail the test if they start."""
from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest
import torch
import yaml

from harness.cli import train as cli_train
from harness.cli.main import main
from harness.cli.polish import LINE_LIMIT, one_line
from refusals import refused  # tests/support
from small_model import save_small_model  # tests/support

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = str(ROOT / "harness" / "configs" / "quickstart.yaml")
TINY_TASK = ("task: {name: arith, min_ops: 1, max_ops: 1, operators: '+', min_operand: 1, max_operand: 2, "
             "eval_size: 50}\n")  # 4 expressions, 1 of them ("2+2" or so) held out


class NotATensor:
    """Pickled into a weights file: torch.load(weights_only=True) refuses it."""


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd = tmp_path/cwd; training and the warm-up fail the test if they start."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)

    def no_training(*a, **k):
        raise AssertionError("training started: the input was not refused")
    monkeypatch.setattr(cli_train.loop, "train", no_training)
    monkeypatch.setattr(cli_train.warmup, "starting_checkpoint", no_training)
    return tmp_path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A small complete model folder, and broken copies of it."""
    root = tmp_path_factory.mktemp("models")
    good = root / "good"
    model = save_small_model(good)
    only_config = root / "only_config"
    only_config.mkdir()
    (only_config / "config.json").write_bytes((good / "config.json").read_bytes())
    truncated = root / "truncated"
    truncated.mkdir()
    for f in good.iterdir():
        data = f.read_bytes()
        (truncated / f.name).write_bytes(data[:len(data) // 2] if f.suffix == ".safetensors" else data)
    pickled = root / "pickled"
    pickled.mkdir()
    for f in good.iterdir():
        if f.suffix != ".safetensors":
            (pickled / f.name).write_bytes(f.read_bytes())
    state = dict(model.state_dict())
    state["_meta"] = NotATensor()
    torch.save(state, pickled / "pytorch_model.bin")
    failed_run = root / "failed_run"
    failed_run.mkdir()
    (failed_run / "config.yaml").write_text(TINY_TASK)
    (failed_run / "summary.json").write_text(json.dumps({"status": "failed", "run_id": "grpo-s0-x"}))
    return {"good": good, "only_config": only_config, "truncated": truncated, "pickled": pickled,
            "failed_run": failed_run}


def _refused(capsys, argv, must, root: Path, allowed=frozenset()) -> str:
    return refused(capsys, argv, must, root, allowed=allowed, max_len=LINE_LIMIT + 100, max_seconds=20)


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def _bomb(levels: int = 9) -> str:
    """~400 bytes of YAML: nine nested levels of nine aliases, 9**9 values expanded."""
    s = "&a0 [x, x, x, x, x, x, x, x, x]"
    for i in range(1, levels + 1):
        s = f"&a{i} [{s}, " + ", ".join([f"*a{i - 1}"] * 8) + "]"
    return s


def _sweep(sandbox: Path, text: str) -> Path:
    return _write(sandbox / "sweep.yaml", f"base: {QUICKSTART}\ngrid: {{seed: [0]}}\n" + text)


# ------------------------------------------------------------------ 1. seed range

@pytest.mark.parametrize("seed", [str(2**70), "-1"])
def test_train_refuses_a_seed_outside_the_generators_range(seed, sandbox, capsys):
    out = sandbox / "out"
    err = _refused(capsys, ["train", QUICKSTART, "--set", f"seed={seed}", "--output-dir", str(out)], "seed=", sandbox)
    assert err.startswith(f"harness: config error: seed={seed} is invalid") and "2**63-1" in err
    assert not out.exists()  # before: a run directory, then an overflow traceback


# ------------------------------------------------------------------ 2. YAML alias bombs, huge values

def test_train_refuses_an_alias_bomb_under_name(sandbox, capsys):
    f = _write(sandbox / "bomb.yaml", f"name: {_bomb()}\n")
    err = _refused(capsys, ["train", str(f)], "aliases (*name) expand it to more than 100,000 values", sandbox)
    assert "bomb.yaml" in err


def test_sweep_refuses_an_alias_bomb_under_description(sandbox, capsys):
    f = _sweep(sandbox, f"name: sw\ndescription: {_bomb()}\n")
    _refused(capsys, ["sweep", str(f), "--dry-run"], "aliases (*name) expand", sandbox)


def test_set_refuses_an_alias_bomb(sandbox, capsys):
    _refused(capsys, ["train", QUICKSTART, "--set", f"name={_bomb()}"], "--set name=...: aliases", sandbox)


def test_sweep_refuses_a_non_text_description(sandbox, capsys):
    f = _sweep(sandbox, "name: sw\ndescription: [a, b]\n")
    _refused(capsys, ["sweep", str(f), "--dry-run"], "description must be text", sandbox)


def test_a_two_megabyte_name_is_echoed_bounded(sandbox, capsys):
    f = _write(sandbox / "name.yaml", "name: " + "n" * 2_000_000 + "\n")
    err = _refused(capsys, ["train", str(f)], "(2,000,000 characters) is invalid", sandbox)
    assert len(err) < 800
    # a sweep's name keeps the same rule, with the same bounded echo
    f = _sweep(sandbox, "name: " + "n" * 2_000_000 + "\n")
    err = _refused(capsys, ["sweep", str(f), "--dry-run"], "(2,000,000 characters) is invalid", sandbox)
    assert err.endswith("(its runs go to <output_dir>/<name>/)")


def test_a_huge_integer_in_yaml_is_one_line(sandbox, capsys):
    f = _write(sandbox / "int.yaml", "seed: " + "9" * 5000 + "\n")
    _refused(capsys, ["train", str(f)], "int.yaml: a value cannot be read", sandbox)
    _refused(capsys, ["train", QUICKSTART, "--set", "seed=" + "9" * 5000], "--set seed=...", sandbox)


def test_one_line_keeps_the_start_and_the_end():
    line = one_line("field=" + "x" * 10**6 + " is invalid: do this")
    assert len(line) <= LINE_LIMIT + 60 and line.startswith("field=xxx") and line.endswith("is invalid: do this")
    assert one_line("a\nb") == "a b"


# ------------------------------------------------------------------ 3. NUL bytes in paths

@pytest.mark.parametrize("text,field", [('output_dir: "out\\0x"', "output_dir"),
                                        ('warmup: {cache_dir: "cache\\0x"}', "warmup.cache_dir")])
def test_train_refuses_a_nul_byte_in_a_path(text, field, sandbox, capsys):
    f = _write(sandbox / "nul.yaml", text + "\n")
    err = _refused(capsys, ["train", str(f)], "NUL byte", sandbox)
    assert err.startswith(f"harness: config error: {field}=")


def test_sweep_refuses_a_nul_byte_in_its_output_dir(sandbox, capsys):
    f = _sweep(sandbox, 'name: sw\noutput_dir: "out\\0x"\n')
    _refused(capsys, ["sweep", str(f), "--dry-run"], "output_dir='out\\x00x' is invalid: contains a NUL", sandbox)


# ------------------------------------------------------------------ 4. empty and lost path options

@pytest.mark.parametrize("argv", [
    ["train", QUICKSTART, "--output-dir", ""],
    ["warmup", QUICKSTART, "--output-dir", ""],
    ["quickstart", "--output-dir", ""],
    ["sweep", str(ROOT / "sweeps" / "quickstart.yaml"), "--dry-run", "--output-dir", ""],
    ["eval", "--model", "x", "--task", "arith", "--output-dir", ""],
    ["report", "x", "--output-dir", ""],
    ["eval", "--model", "", "--task", "arith"],
], ids=["train", "warmup", "quickstart", "sweep", "eval", "report", "eval-model"])
def test_empty_options_are_refused(argv, sandbox, capsys):
    flag = argv[argv.index("") - 1]
    err = _refused(capsys, argv, f"{flag} '' is invalid", sandbox)
    assert err.startswith(f"harness {argv[0]}: ")


@pytest.mark.parametrize("key,must", [("name", "change the sweep file's name"),
                                      ("output_dir", "give --output-dir instead")])
def test_sweep_refuses_set_of_what_the_sweep_sets(key, must, sandbox, capsys):
    argv = ["sweep", str(ROOT / "sweeps" / "quickstart.yaml"), "--dry-run", "--output-dir", str(sandbox / "out"),
            "--set", f"{key}=other"]
    err = _refused(capsys, argv, must, sandbox)
    assert f"--set {key}=...: a sweep's runs take" in err


def test_sweep_refuses_an_empty_output_dir_in_the_file(sandbox, capsys):
    f = _sweep(sandbox, "name: sw\noutput_dir: ''\n")
    _refused(capsys, ["sweep", str(f), "--dry-run"], "output_dir='' is invalid", sandbox)


# ------------------------------------------------------------------ 5. --set algorithm=... keeps fields

def test_set_algorithm_keeps_explicit_fields(sandbox, capsys):
    f = _write(sandbox / "a.yaml", "algorithm: {name: grpo, kl_coef: 0.0, clip_eps: 0.1}\n")
    assert main(["config", "--show", str(f), "--set", "algorithm=ppo"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)["algorithm"]
    assert (shown["name"], shown["kl_coef"], shown["clip_eps"], shown["advantage"]) == ("ppo", 0.0, 0.1, "gae")


# ------------------------------------------------------------------ 6. dataset knobs on arith

def test_train_refuses_a_data_path_on_arith(sandbox, capsys):
    err = _refused(capsys, ["train", QUICKSTART, "--set", "task.data_path=x.jsonl"], "task.data_path", sandbox)
    assert "arith generates its problems" in err


@pytest.mark.parametrize("flag,value,field", [("--data", "x.jsonl", "task.data_path"),
                                              ("--few-shot", "2", "task.few_shot")])
def test_eval_refuses_dataset_options_on_arith(flag, value, field, sandbox, capsys):
    err = _refused(capsys, ["eval", "--model", "x", "--task", "arith", flag, value], field, sandbox)
    assert err.endswith(f"(from {flag})")


# ------------------------------------------------------------------ 7. arith problem spaces

def test_train_refuses_an_empty_training_space(sandbox, capsys):
    f = _write(sandbox / "t.yaml", "task: {name: arith, min_ops: 1, max_ops: 1, operators: '+', max_operand: 1}\n")
    _refused(capsys, ["train", str(f)], "nothing to train on", sandbox)


def test_eval_refuses_more_problems_than_a_large_space_holds(sandbox, capsys):
    _refused(capsys, ["eval", "--model", "x", "--task", "arith", "--limit", "100000"], "(from --limit)", sandbox)


def test_sweep_plan_warns_of_an_eval_size_beyond_the_held_out_space(sandbox, capsys):
    f = _sweep(sandbox, "name: sw\nconfig: " + TINY_TASK.replace("task: ", "{task: ").rstrip() + "}\n")
    assert main(["sweep", str(f), "--dry-run", "--output-dir", str(sandbox / "out")]) == 0
    out = capsys.readouterr().out
    assert "warning: task.eval_size=50: these arith knobs" in out and "only 1 held-out problem" in out


def test_eval_warns_and_scores_the_one_held_out_problem(models, sandbox, capsys):
    cfg = _write(sandbox / "c.yaml", TINY_TASK)
    out = sandbox / "ev"
    t0 = time.monotonic()
    rc = main(["eval", "--model", str(models["good"]), "--config", str(cfg), "--output-dir", str(out),
               "--no-progress", "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert time.monotonic() - t0 < 20
    assert "warning: the run config asks for 50 arith problems and its knobs allow only 1" in err
    metrics = json.loads((out / "arith_metrics.json").read_text())["metrics"]
    assert metrics["eval/arith/num_problems"] == 1


# ------------------------------------------------------------------ 8. eval options

@pytest.mark.parametrize("flags,must", [
    (["--top-p", "0"], "--top-p=0.0 is invalid: must be in (0, 1]"),
    (["--top-p", "5"], "--top-p=5.0 is invalid: must be in (0, 1]"),
    (["--top-p", "nan"], "--top-p=nan is invalid: must be a finite number"),
    (["--temperature", "nan"], "--temperature=nan is invalid: must be a finite number"),
    (["--temperature", "inf"], "--temperature=inf is invalid: must be a finite number"),
    (["--max-new-tokens", "100000000"], "--max-new-tokens=100000000 is invalid: must be <= 1048576"),
    (["--n", "2000000"], "--n=2000000 is invalid: must be <= 1000000"),
    (["--seed", "-1"], "--seed=-1 is invalid: must be an integer from 0 to 2**63-1"),
    (["--threads", "-1"], "--threads=-1 is invalid: must be between 0 and 1024 (0: the default count)"),
], ids=["top-p-0", "top-p-5", "top-p-nan", "temperature-nan", "temperature-inf", "max-new-tokens", "n", "seed",
        "threads"])
def test_eval_refuses_options_the_config_would(flags, must, sandbox, capsys):
    _refused(capsys, ["eval", "--model", "x", "--task", "arith", *flags], must, sandbox)


def test_eval_refuses_max_new_tokens_beyond_the_models_context(models, sandbox, capsys):
    _refused(capsys, ["eval", "--model", str(models["good"]), "--task", "arith", "--max-new-tokens", "1000",
                      "--output-dir", str(sandbox / "ev")], "max_position_embeddings", sandbox, allowed={"ev"})


# ------------------------------------------------------------------ 9. model folders and data that cannot load

@pytest.mark.parametrize("name,must", [
    ("only_config", "is not a complete Hugging Face model folder (no tokenizer"),
    ("truncated", "model.safetensors: not a readable safetensors file, truncated or corrupt"),
    ("pickled", "pytorch_model.bin: pickled PyTorch weights that torch.load(weights_only=True) refuses"),
    ("failed_run", "a run directory without final_model (its summary.json says 'failed')"),
])
def test_eval_refuses_a_model_it_cannot_load(name, must, models, sandbox, capsys):
    err = _refused(capsys, ["eval", "--model", str(models[name]), "--task", "arith", "--no-progress",
                            "--output-dir", str(sandbox / "ev")], must, sandbox, allowed={"ev"})
    assert err.startswith("harness eval: ") and str(models[name]) in err


def test_eval_refuses_a_hub_dataset_it_cannot_reach(models, sandbox, capsys, monkeypatch):
    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    err = _refused(capsys, ["eval", "--model", str(models["good"]), "--task", "gsm8k", "--data", "hf:openai/gsm8k",
                            "--limit", "2", "--no-progress", "--output-dir", str(sandbox / "ev")],
                   "cannot load hf:openai/gsm8k [test] (ConnectionError", sandbox, allowed={"ev"})
    assert "download it beforehand" in err


def test_train_refuses_an_incomplete_model_folder_before_the_run(models, sandbox, capsys):
    out = sandbox / "out"
    _refused(capsys, ["train", QUICKSTART, "--set", f"model.name_or_path={models['only_config']}",
                      "--set", "task.name=gsm8k", "--output-dir", str(out)], "no tokenizer", sandbox)
    assert not out.exists()
