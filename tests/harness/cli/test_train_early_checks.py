"""`harness train`, `warmup` and `quickstart` check what they can before any work (audit: each
case was a traceback, a segfault, a run that went on without its tracker, or a "failed" run
folder left behind for a path that was never there): exit 2, one line naming the field or option
and the value, and no run folder. Nothing here trains: the trainer, the warm-up and the sweep are
stubs that fail the test if they start."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import train as cli_train
from harness.cli.main import main
from harness.config.paths import check_input_paths
from harness.config.schema import ConfigError, ModelConfig, load_config
from harness.foundation.errors import ModelLoadError
from refusals import refused  # tests/support
from small_model import save_small_model  # tests/support

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = str(ROOT / "harness" / "configs" / "quickstart.yaml")
MISSING = "/nonexistent-harness-path"


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd = tmp_path/cwd; training, the warm-up and the quickstart's sweep fail the test if they start."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)

    def no_work(*a, **k):
        raise AssertionError("work started: the input was not refused")
    monkeypatch.setattr(cli_train.loop, "train", no_work)
    monkeypatch.setattr(cli_train.warmup, "starting_checkpoint", no_work)
    monkeypatch.setattr(cli_train.sweep_run, "run_sweep", no_work)
    return tmp_path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A small complete model folder."""
    folder = tmp_path_factory.mktemp("models") / "good"
    save_small_model(folder)
    return folder


def _nothing_started(out: str) -> None:
    assert "results:" not in out  # the run folder's line: nothing was started


def _refused(capsys, argv, must, root: Path, allowed=frozenset(), starts: str = "") -> str:
    line = refused(capsys, argv, must, root, allowed=allowed, stdout=_nothing_started)
    assert line.startswith(starts), line
    return line


def _train(sandbox: Path, *sets: str) -> list[str]:
    argv = ["train", QUICKSTART, "--no-progress", "--output-dir", str(sandbox / "out")]
    for s in sets:
        argv += ["--set", s]
    return argv


# ------------------------------------------------------------------ limits: refused at load, before any folder

@pytest.mark.parametrize("sets,must", [
    (["train.threads=100000"], "train.threads=100000 is invalid: must be between 0 and 1024"),
    (["warmup.threads=100000"], "warmup.threads=100000 is invalid: must be between 1 and 1024"),
    (["model.hidden_size=4194304"], "model.hidden_size=4194304 is invalid: the built-in tiny model would hold about "
                                    "2.8e14 parameters"),
    (["model.num_layers=100000"], "model.num_layers=100000 is invalid: the built-in tiny model would hold"),
    (["model.intermediate_size=1000000000"], "model.intermediate_size=1000000000 is invalid"),
    (["tracking.wandb=true", "tracking.wandb_mode=bogus"],
     "tracking.wandb_mode='bogus' is invalid: must be one of offline, online, disabled"),
    (["tracking.mlflow=true", "tracking.mlflow_uri=garbage"],
     "tracking.mlflow_uri='garbage' is invalid: has no URI scheme"),
    (["algorithm.name=dapo", "algorithm.eps_high=-1"], "algorithm.eps_high=-1.0 is invalid: must be > 0"),
    (["algorithm.name=dapo", "algorithm.eps_low=1.5"], "algorithm.eps_low=1.5 is invalid: must be in (0, 1]"),
    (["algorithm=gspo", "algorithm.ratio_level=seq"],
     "algorithm.ratio_level='seq' is invalid: must be one of token, sequence; did you mean 'sequence'?"),
    (["algorithm=dapo", "algorithm.max_resample=-2"], "algorithm.max_resample=-2 is invalid: must be between 0 and 100"),
    (["algorithm=dapo", "algorithm.overlong_buffer=1"], "algorithm.overlong_buffer=1.0 is invalid: must be in [0, 1)"),
], ids=["train-threads", "warmup-threads", "hidden-size", "num-layers", "intermediate-size", "wandb-mode",
        "mlflow-uri", "eps-high", "eps-low", "ratio-level", "max-resample", "overlong-buffer"])
def test_train_refuses_limits_before_any_folder(sets, must, sandbox, capsys):
    err = _refused(capsys, _train(sandbox, *sets), must, sandbox, starts="harness: config error: ")
    assert err.endswith(f"(from --set {sets[-1]})")
    assert not (sandbox / "out").exists()


# ------------------------------------------------------------------ paths the run reads

@pytest.mark.parametrize("sets,field", [
    ([f"model.name_or_path={MISSING}"], "model.name_or_path"),
    ([f"model.name_or_path={MISSING}.gguf"], "model.name_or_path"),
    (["algorithm=grpo_ps", f"algorithm.prm={MISSING}"], "algorithm.prm"),
    ([f"algorithm.prm={MISSING}"], "algorithm.prm"),
    (["reward_model.type=orm", f"reward_model.init={MISSING}"], "reward_model.init"),
    (["task.name=gsm8k", f"task.data_path={MISSING}"], "task.data_path"),
], ids=["model", "model-gguf", "prm", "prm-unused", "rm-init", "data-path"])
def test_train_refuses_a_missing_path_before_the_run_folder(sets, field, sandbox, capsys):
    err = _refused(capsys, _train(sandbox, *sets), field, sandbox)
    assert MISSING in err
    assert not (sandbox / "out").exists()  # before: "results: ...", then a "failed" run folder


def test_missing_model_paths_say_what_is_expected(sandbox, capsys):
    err = _refused(capsys, _train(sandbox, f"model.name_or_path={MISSING}"), "", sandbox)
    assert err == (f"harness: config error: model.name_or_path='{MISSING}' is invalid: no such file or folder (a "
                   f"local Hugging Face model folder or a .gguf file is expected; nothing is downloaded at run time) "
                   f"(from --set model.name_or_path={MISSING})")
    err = _refused(capsys, _train(sandbox, "model.name_or_path=nobody/no-such-model"), "", sandbox)
    assert err.startswith("harness: config error: model.name_or_path='nobody/no-such-model' is invalid: no such "
                          "folder, and not a model the local Hugging Face cache holds")
    err = _refused(capsys, _train(sandbox, f"model.name_or_path={sandbox}", "model.gguf_file=m.gguf"), "", sandbox)
    assert err.startswith(f"harness: config error: model.gguf_file='m.gguf' is invalid: no such file in {sandbox}")
    err = _refused(capsys, _train(sandbox, "model.name_or_path=pkg:no_such_package_xyz/m.gguf"), "", sandbox)
    assert err.startswith("harness: config error: model.name_or_path='pkg:no_such_package_xyz/m.gguf' is invalid: "
                          "Python package 'no_such_package_xyz' is not installed")


def test_an_incomplete_model_folder_names_the_field(sandbox, capsys):
    empty = sandbox / "empty_model"
    empty.mkdir()
    err = _refused(capsys, _train(sandbox, f"algorithm.prm={empty}"), "no config.json", sandbox)
    assert err.startswith(f"harness train: algorithm.prm='{empty}' is invalid: {empty} is not a complete Hugging "
                          f"Face model folder")


def _rm_folder(path: Path, kind: str, model: Path | None = None) -> Path:
    path.mkdir()
    if model is not None:
        for f in model.iterdir():
            (path / f.name).write_bytes(f.read_bytes())
    (path / "reward_model.json").write_text(json.dumps({"kind": kind}))
    return path


def test_reward_model_init_must_be_a_reward_model_of_its_type(sandbox, capsys, model_dir):
    plain = sandbox / "plain"
    plain.mkdir()
    err = _refused(capsys, _train(sandbox, "reward_model.type=orm", f"reward_model.init={plain}"), "", sandbox)
    assert err.startswith(f"harness: config error: reward_model.init='{plain}' is invalid: no reward_model.json "
                          f"there: not a reward model written by `harness rm train`")
    prm = _rm_folder(sandbox / "prm", "prm")
    err = _refused(capsys, _train(sandbox, "reward_model.type=orm", f"reward_model.init={prm}"), "", sandbox)
    assert err.startswith(f"harness: config error: reward_model.init='{prm}' is invalid: it is a prm and "
                          f"reward_model.type is orm")
    broken = sandbox / "broken"
    broken.mkdir()
    (broken / "reward_model.json").write_text("{not json")
    err = _refused(capsys, _train(sandbox, "reward_model.type=orm", f"reward_model.init={broken}"), "", sandbox)
    assert f"reward_model.init='{broken}' is invalid: its reward_model.json cannot be read" in err
    orm = _rm_folder(sandbox / "orm", "orm", model_dir)
    err = _refused(capsys, _train(sandbox, "algorithm=grpo_ps", f"algorithm.prm={orm}"), "", sandbox)
    assert err.startswith(f"harness: config error: algorithm.prm='{orm}' is invalid: an outcome reward model")


def test_the_check_is_callable_and_passes_a_good_config(model_dir, tmp_path, data_dir):
    check_input_paths(load_config(QUICKSTART))  # the tiny model, arith: nothing to read
    check_input_paths(load_config(QUICKSTART, [f"model.name_or_path={model_dir}", "task.name=gsm8k"]))
    orm = _rm_folder(tmp_path / "orm", "orm", model_dir)
    check_input_paths(load_config(QUICKSTART, ["reward_model.type=orm", f"reward_model.init={orm}"]))
    with pytest.raises(FileNotFoundError, match=f"data file not found: {MISSING} \\(task.data_path; "):
        check_input_paths(load_config(QUICKSTART, ["task.name=gsm8k", f"task.data_path={MISSING}"]))


# ------------------------------------------------------------------ directories: warm-up, quickstart

def test_warmup_checks_its_folders_first(sandbox, capsys):
    f = sandbox / "afile"
    f.write_text("x")
    err = _refused(capsys, ["warmup", QUICKSTART, "--output-dir", str(f)], "", sandbox)
    assert err == f"harness: config error: --output-dir='{f}' is invalid: is a file, not a directory"
    err = _refused(capsys, ["warmup", QUICKSTART, "--set", f"warmup.cache_dir={f}"], "", sandbox)
    assert err == (f"harness: config error: warmup.cache_dir='{f}' is invalid: is a file, not a directory "
                   f"(from --set warmup.cache_dir={f})")
    err = _refused(capsys, ["warmup", QUICKSTART, "--set", f"warmup.cache_dir={f / 'sub'}"], "", sandbox)
    assert f"warmup.cache_dir='{f / 'sub'}' is invalid: is under {f}, which is a file" in err
    err = _refused(capsys, ["warmup", QUICKSTART, "--output-dir", "/proc/harness-x"], "", sandbox)
    assert err.startswith("harness: config error: --output-dir='/proc/harness-x' is invalid: not a writable directory")
    # the default cache is under the output directory: a file in its way is named too
    out = sandbox / "out"
    (out / "_cache").mkdir(parents=True)
    (out / "_cache" / "warmup").write_text("x")
    err = _refused(capsys, ["warmup", QUICKSTART, "--output-dir", str(out)], "", sandbox)
    assert err.startswith(f"harness: config error: warmup.cache_dir='{out / '_cache' / 'warmup'}' is invalid: is a "
                          f"file")
    err = _refused(capsys, ["warmup", QUICKSTART, "--set", f"model.name_or_path={MISSING}"], "", sandbox)
    assert err.startswith(f"harness: config error: model.name_or_path='{MISSING}' is invalid: no such file")


def test_warmup_with_its_own_cache_leaves_the_output_dir_alone(sandbox, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(cli_train.warmup, "starting_checkpoint", lambda cfg, *a, **k: seen.append(cfg) or
                        (None, None, {"source": "stub"}))
    cache = sandbox / "cache"
    assert main(["warmup", QUICKSTART, "--set", f"warmup.cache_dir={cache}"]) == 0
    assert seen and cache.is_dir() and not (sandbox / "cwd" / "results").exists()


def test_train_checks_the_default_warmup_cache(sandbox, capsys):
    out = sandbox / "out"
    (out / "_cache").mkdir(parents=True)
    (out / "_cache" / "warmup").write_text("x")
    err = _refused(capsys, _train(sandbox), "warmup.cache_dir=", sandbox)
    assert "is invalid: is a file, not a directory" in err


def test_train_names_the_output_dir_option_it_came_from(sandbox, capsys):
    f = sandbox / "afile"
    f.write_text("x")
    err = _refused(capsys, ["train", QUICKSTART, "--output-dir", str(f)], "", sandbox)
    assert err == f"harness: config error: --output-dir='{f}' is invalid: is a file, not a directory"
    err = _refused(capsys, ["train", QUICKSTART, "--set", f"output_dir={f}"], "", sandbox)
    assert err.startswith(f"harness: config error: output_dir='{f}' is invalid: is a file, not a directory")


def test_quickstart_checks_its_output_dir_first(sandbox, capsys):
    f = sandbox / "afile"
    f.write_text("x")
    err = _refused(capsys, ["quickstart", "--no-progress", "--output-dir", str(f)], "", sandbox)
    assert err == f"harness: config error: --output-dir='{f}' is invalid: is a file, not a directory"
    err = _refused(capsys, ["quickstart", "--no-progress", "--output-dir", str(f / "sub")], "", sandbox)
    assert err.startswith(f"harness: config error: --output-dir='{f / 'sub'}' is invalid: is under {f}, which is a "
                          f"file")
    err = _refused(capsys, ["quickstart", "--no-progress", "--output-dir", str(sandbox / "out"),
                            "--set", f"model.name_or_path={MISSING}"], "model.name_or_path", sandbox)
    assert not (sandbox / "out").exists()


@pytest.mark.parametrize("only", [[""], [","], [" , "], ["", ""]], ids=["empty", "comma", "spaces", "twice"])
def test_quickstart_refuses_an_only_that_selects_nothing(only, sandbox, capsys):
    argv = ["quickstart", "--no-progress", "--output-dir", str(sandbox / "out")]
    for o in only:
        argv += ["--only", o]
    err = _refused(capsys, argv, "", sandbox)
    assert err == ("harness: config error: --only selects no run: it names no algorithm (e.g. --only grpo; this "
                   "sweep's algorithms: grpo, ppo, rft)")
    assert not (sandbox / "out").exists()


def test_quickstart_refuses_an_algorithm_it_does_not_run(sandbox, capsys):
    argv = ["quickstart", "--no-progress", "--output-dir", str(sandbox / "out"), "--only", "grpo,gpro"]
    err = _refused(capsys, argv, "", sandbox)
    assert err == ("harness: config error: --only 'gpro' matches no run of sweep quickstart; did you mean 'grpo'? "
                   "(this sweep's algorithms: grpo, ppo, rft)")
    assert not (sandbox / "out").exists()


# ------------------------------------------------------------------ a model this machine cannot allocate

def test_a_model_that_cannot_be_allocated_is_one_line(tmp_path, monkeypatch, capsys):
    import transformers

    def no_memory(conf):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 70368744177664 bytes. Error code 12 (Cannot allocate memory)")
    monkeypatch.setattr(transformers, "LlamaForCausalLM", no_memory)
    monkeypatch.chdir(tmp_path)
    # without a warm-up the untrained tiny model is built at once (nothing is trained or cached)
    rc = main(["warmup", QUICKSTART, "--output-dir", str(tmp_path / "out"), "--set", "warmup.enabled=false"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("harness warmup: the built-in tiny model (about 865,920 parameters, 0.0 GiB of float32 "
                          "weights; model.hidden_size=128, model.num_layers=4, model.intermediate_size=384) cannot be "
                          "allocated on this machine (RuntimeError: ")
    assert err.strip().endswith("lower model.hidden_size, model.num_layers or model.intermediate_size")


def test_build_tiny_model_turns_a_failed_allocation_into_one_error():
    from harness.engine.models import build_char_tokenizer, build_tiny_model

    # not validated (the config would refuse it): an MLP of 2**47 floats no machine can allocate
    with pytest.raises(ModelLoadError, match=r"^the built-in tiny model \(about 1,688,849,860,540,032 parameters, "
                                             r".*model\.intermediate_size=1099511627776\) cannot be allocated"):
        build_tiny_model(ModelConfig(intermediate_size=2**40), build_char_tokenizer())


def test_only_algorithms_reads_every_spelling():
    from harness.sweep.plan import load_sweep

    sw = load_sweep(ROOT / "sweeps" / "quickstart.yaml")
    assert cli_train.only_algorithms(None, sw) is None  # not given: every run
    assert cli_train.only_algorithms([["grpo", "ppo"]], sw) == ["grpo", "ppo"]
    assert cli_train.only_algorithms([["grpo,rft"], ["ppo"]], sw) == ["grpo", "rft", "ppo"]
    with pytest.raises(ConfigError, match=r"^--only selects no run: it names no algorithm"):
        cli_train.only_algorithms([[" ,"]], sw)


def test_quickstart_with_good_inputs_goes_on_to_the_warmup(sandbox, monkeypatch, capsys):
    class Reached(Exception):
        pass

    def reached(cfg, *a, **k):
        raise Reached(cfg)
    monkeypatch.setattr(cli_train.warmup, "starting_checkpoint", reached)
    out = sandbox / "out"
    with pytest.raises(Reached) as e:
        main(["quickstart", "--no-progress", "--output-dir", str(out), "--only", "ppo"])
    assert e.value.args[0].algo.name == "ppo"
    assert (out / "_cache" / "warmup").is_dir()  # checked (and made) before the warm-up starts
    assert "quickstart: a 0.87M-parameter Llama" in capsys.readouterr().out
