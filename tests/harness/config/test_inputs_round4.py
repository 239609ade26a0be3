"""Inputs accepted and ignored, or misread, round 4 (issue 48, item 5): ``--output-dir`` is a path, never YAML;
``--set`` of a mapping merges into its section; reward-model fields without a type leave the run id as it is (with
a warning); ``--task-seed`` where no generator reads it, or negative, is refused; ``rm train --init`` with a
garbage, empty or other-kind spec is one line before the warm-up. Nothing here trains: stubs stop each command
where its work would start."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.cli import rm as cli_rm
from harness.cli import train as cli_train
from harness.cli.main import main
from harness.config.schema import load_config
from harness.rundir.ids import run_id
from harness.admission import memory
from refusals import refused  # tests/support
from small_model import save_small_model  # tests/support
from support_paths import REPO

QS = str(REPO / "harness" / "configs" / "quickstart.yaml")


class Started(Exception):
    """A stub was reached: carries the config the command would have run."""


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)

    def started(cfg, *a, **k):
        raise Started(getattr(cfg, "cfg", cfg))  # an Admitted run (the gate's) or a config
    monkeypatch.setattr(cli_train.loop, "train", started)
    monkeypatch.setattr(cli_train.warmup, "starting_checkpoint", started)
    monkeypatch.setattr(cli_rm, "fit", type("F", (), {"train_reward_model": staticmethod(started)}))
    monkeypatch.setattr(cli_rm, "warmup", type("W", (), {"starting_checkpoint": staticmethod(started)}))
    return cwd


@pytest.mark.parametrize("name", ["x #c", "2024-11-28", "123", "null", "{a: 1}", "[1]"])
@pytest.mark.parametrize("command", [["train", QS], ["warmup", QS], ["rm", "train", QS, "--type", "orm"]])
def test_output_dir_is_a_path_never_yaml(command, name, sandbox):
    with pytest.raises(Started) as got:
        main([*command, "--output-dir", name])
    assert got.value.args[0].output_dir == name
    assert command[0] == "rm" or (sandbox / name).is_dir()  # train and warmup make the root before the work


def test_output_dir_tilde_is_the_home_folder_as_for_every_path_option(sandbox, monkeypatch):
    monkeypatch.setenv("HOME", str(sandbox / "home"))
    with pytest.raises(Started) as got:
        main(["train", QS, "--output-dir", "~"])
    assert got.value.args[0].output_dir == str(sandbox / "home")


def _shown(capsys, *sets) -> dict:
    args = ["config", "--show", QS]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_set_of_a_mapping_merges_into_the_section(capsys):
    base = _shown(capsys)
    got = _shown(capsys, "train={lr: 0.5}")
    assert got["train"] == {**base["train"], "lr": 0.5}
    got = _shown(capsys, "budget={amount: 64}")
    assert got["budget"] == {**base["budget"], "amount": 64} and got["budget"]["unit"] == "samples"
    got = _shown(capsys, "algorithm={kl_coef: 0.0}")
    assert got["algorithm"]["name"] == base["algorithm"]["name"] and got["algorithm"]["kl_coef"] == 0.0


@pytest.mark.parametrize("field", ["reward_model.lr=0.01", "reward_model.epochs=9", "reward_model.beta=0.2",
                                   "reward_model.samples_per_round=64"])
def test_reward_model_fields_without_a_type_leave_the_run_id_and_warn(field, sandbox, capsys):
    assert run_id(load_config(QS, [field])) == run_id(load_config(QS))
    assert run_id(load_config(QS, [field, "reward_model.type=orm", "algorithm=grpo"])) != \
        run_id(load_config(QS, ["reward_model.type=orm", "algorithm=grpo"]))
    with pytest.raises(Started):
        main(["train", QS, "--set", field])
    err = capsys.readouterr().err
    assert f"{field.split('=')[0]} set without reward_model.type" in err and "ignores it" in err


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("m") / "model"
    save_small_model(folder)
    return folder


@pytest.mark.parametrize("task,seed,must", [
    ("gsm8k", "3", "--task-seed 3 is invalid: it seeds arith's problem generator; task 'gsm8k'"),
    ("arith", "-1", "--task-seed must be >= 0, got -1")])
def test_eval_task_seed_is_refused_where_it_would_be_ignored_or_is_negative(task, seed, must, model, sandbox,
                                                                               capsys):
    refused(capsys, ["eval", "--model", str(model), "--task", task, "--task-seed", seed], must, sandbox)


def test_a_negative_task_seed_in_a_config_is_refused(sandbox, capsys):
    refused(capsys, ["train", QS, "--set", "task.seed=-5"], "task.seed", sandbox)


def _spec(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "reward_model.json").write_text(text)
    return folder


@pytest.mark.parametrize("text,must", [
    ("", "its reward_model.json cannot be read"),
    ("\x00garbage{", "its reward_model.json cannot be read"),
    ("[1, 2]", "not a reward-model spec"),
    (json.dumps({"kind": "prm"}), "it is a prm reward model and this trains an orm: give --type prm")])
def test_rm_train_init_with_a_bad_spec_is_one_line_before_the_warm_up(text, must, sandbox, capsys):
    init = _spec(sandbox / "rm", text)
    refused(capsys, ["rm", "train", QS, "--type", "orm", "--init", str(init)], must, sandbox)


@pytest.mark.parametrize("rounds,must", [
    ("1000000000", "reward_model.rounds=1000000000 is invalid: must be <= 100000"),
    ("129", "reward_model.rounds=129 is invalid: each round needs at least one training stage, and a budget of "
            "32768 samples holds 128: at most 128 rounds")])
def test_reward_model_rounds_are_bounded_before_any_list_is_built(rounds, must, sandbox, capsys):
    """Item 4: rounds=1e9 built a billion-entry list of round ends (11 GB, no message); more rounds than
    stages merged silently."""
    refused(capsys, ["train", QS, "--set", "reward_model.type=orm", "--set", f"reward_model.rounds={rounds}"], must,
            sandbox, max_seconds=10)


@pytest.mark.parametrize("how", ["prm", "init"])
def test_a_reward_model_of_another_task_is_refused(how, model, sandbox, capsys):
    """A GSM8K PRM scored an arith run's steps without a word."""
    rm = sandbox / "gsm8k-prm"
    save_small_model(rm)
    capsys.readouterr()  # the save's progress bar is not the command's output
    (rm / "reward_model.json").write_text(json.dumps({"kind": "prm", "task": "gsm8k", "good_token": "+",
                                                      "bad_token": "-", "step_tag": "\n"}))
    sets = (["algorithm=grpo_ps", f"algorithm.prm={rm}"] if how == "prm" else
            ["algorithm=grpo_ps", "reward_model.type=prm", f"reward_model.init={rm}"])
    argv = ["train", QS] + [x for s in sets for x in ("--set", s)]
    refused(capsys, argv, "it was trained on task 'gsm8k' samples", sandbox)


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError(
    "[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you tried to allocate 7 GB")])
def test_rm_train_out_of_memory_is_one_line_naming_the_setting(error, sandbox, capsys, monkeypatch):
    """Item 4: `rm train --samples 1000000` ended in a 68-83-line allocator traceback."""
    def out_of_memory(*a, **k):
        raise error
    monkeypatch.setattr(cli_rm, "fit", type("F", (), {"train_reward_model": staticmethod(out_of_memory)}))
    line = refused(capsys, ["rm", "train", QS, "--type", "orm", "--samples", "4096"],
                   "--samples 4096 needs more memory than this machine has", sandbox,
                   allowed={"results"})  # the work had started: its results root and warm-up cache exist
    assert type(error).__name__ in line and "lower it" in line


def test_train_out_of_memory_is_one_line_naming_what_to_lower(sandbox, capsys, monkeypatch):
    """Item 4: a stage at the 1,000,000-sample cap ended in an allocator traceback of 68-83 lines."""
    def out_of_memory(*a, **k):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 7000000000 bytes")
    monkeypatch.setattr(cli_train.loop, "train", out_of_memory)
    line = refused(capsys, ["train", QS], "the run needs more memory than this machine has", sandbox,
                   allowed={"results"})
    assert "= 256 samples" in line and "lower train.prompts_per_step" in line


GiB = 2**30


@pytest.mark.parametrize("command,sets,must", [
    (["train", QS], ["train.prompts_per_step=125000", "budget.amount=4000000"],
     "train.prompts_per_step x sampling.samples_per_prompt = 1,000,000 samples held at once need about 6.3 GiB"),
    (["quickstart"], ["train.prompts_per_step=125000", "budget.amount=4000000"], "1,000,000 samples held at once"),
    (["train", QS], ["reward_model.type=orm", "reward_model.samples_per_round=1000000", "budget.amount=10240000"],
     "reward_model.samples_per_round = 1,000,000 samples held at once"),
    (["rm", "train", QS, "--type", "orm", "--samples", "1000000"], [], "--samples = 1,000,000 samples held at once")])
def test_samples_beyond_the_machines_memory_are_refused_before_work(command, sets, must, sandbox, capsys,
                                                                      monkeypatch):
    """Item 4: a stage at the documented 1,000,000-sample cap (and `rm train --samples 1000000`) reached 5.6-7 GB
    and ended in an allocator traceback; on a 4 GiB machine it is now one line naming the setting."""
    monkeypatch.setattr(memory, "machine_memory", lambda: 4 * GiB)
    argv = [*command] + [x for s in sets for x in ("--set", s)]
    line = refused(capsys, argv, must, sandbox)
    assert "more than this machine's 4.0 GiB allow: lower it to at most about" in line
    monkeypatch.setattr(memory, "machine_memory", lambda: 64 * GiB)  # where it fits, it runs
    with pytest.raises(Started):
        main([*command] + [x for s in sets for x in ("--set", s)])
