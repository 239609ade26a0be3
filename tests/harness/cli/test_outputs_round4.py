"""No command replaces what it did not make (issue 48, item 1): an output folder that holds another command's
results (a run's final_model, a run folder, a report) or a user's files is refused in one line, exit 2, before
any work, nothing written; a command's own earlier result is replaced whole, the old one kept until the new one
is complete (`harness.rundir.outputs.staged`). Nothing here trains: the warm-up and the trainers are stubs that
fail the test if they start."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import rm as cli_rm
from harness.cli import train as cli_train
from harness.cli.main import build_parser
from harness.rundir.outputs import holder, output_problem, root_problem, staged
from refusals import refused  # tests/support
from small_model import save_small_model  # tests/support
from support_paths import REPO

QS = str(REPO / "harness" / "configs" / "quickstart.yaml")


class Started(Exception):
    """A stub was reached: the command passed its checks."""


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd = tmp_path/cwd, holding results/quickstart/<run>/ with a final_model; nothing trains."""
    cwd = tmp_path / "cwd"
    run = cwd / "results" / "quickstart" / "grpo-s0-0123abcd"
    (run / "final_model").mkdir(parents=True)
    (run / "final_model" / "config.json").write_text('{"model_type": "llama"}')
    (run / "final_model" / "model.safetensors").write_bytes(b"POLICY-WEIGHTS")
    (run / "summary.json").write_text(json.dumps({"run_id": run.name, "status": "finished"}))
    (run / "metrics.jsonl").write_text("")
    monkeypatch.chdir(cwd)

    def no_work(*a, **k):
        raise AssertionError("work started: the output folder was not refused")
    monkeypatch.setattr(cli_train.loop, "train", no_work)
    monkeypatch.setattr(cli_train.warmup, "starting_checkpoint", no_work)
    monkeypatch.setattr(cli_rm, "warmup", type("W", (), {"starting_checkpoint": staticmethod(no_work)}))
    monkeypatch.setattr(cli_rm, "fit", type("F", (), {"train_reward_model": staticmethod(no_work)}))
    return cwd, run


def _refused(capsys, argv, must, root):
    return refused(capsys, argv, must, root, max_seconds=60)


def test_rm_train_refuses_a_runs_final_model_as_out(sandbox, capsys):
    cwd, run = sandbox
    line = _refused(capsys, ["rm", "train", QS, "--type", "orm", "--out", str(run / "final_model")],
                    "it holds a model folder's files", cwd)
    assert "--out=" in line and "would replace" in line
    assert (run / "final_model" / "model.safetensors").read_bytes() == b"POLICY-WEIGHTS"


def test_rm_train_refuses_a_folder_with_a_users_files(sandbox, capsys):
    cwd, _ = sandbox
    mine = cwd / "mine"
    mine.mkdir()
    (mine / "notes.md").write_text("mine")
    _refused(capsys, ["rm", "train", QS, "--type", "orm", "--out", str(mine)], "did not write (notes.md)", cwd)
    (mine / "notes.md").unlink()
    (mine / "config.json").write_text('{"mine": true}')  # replaced by the reward model's before
    _refused(capsys, ["rm", "train", QS, "--type", "orm", "--out", str(mine)], "did not write (config.json)", cwd)


def test_rm_train_takes_its_own_earlier_result(sandbox, monkeypatch):
    cwd, _ = sandbox
    old = cwd / "rm-old"
    old.mkdir()
    (old / "reward_model.json").write_text('{"kind": "orm"}')
    (old / "config.json").write_text("{}")

    def started(*a, **k):
        raise Started(k["out"])
    monkeypatch.setattr(cli_rm, "fit", type("F", (), {"train_reward_model": staticmethod(started)}))
    with pytest.raises(Started):
        cli_rm.cmd_rm_train(cli_rm_args(["--type", "orm", "--out", str(old)]))


def cli_rm_args(extra: list[str]):
    return build_parser().parse_args(["rm", "train", QS, *extra])


@pytest.mark.parametrize("command,where", [
    (["train", QS], "final_model"), (["train", QS], "."), (["warmup", QS], "final_model"),
    (["rm", "train", QS, "--type", "orm"], "final_model"), (["quickstart"], "final_model"),
    (["sweep", str(REPO / "sweeps" / "quickstart.yaml"), "--dry-run"], "final_model")])
def test_a_results_root_that_is_a_result_is_refused(command, where, sandbox, capsys):
    cwd, run = sandbox
    folder = run / where if where != "." else run
    kind = "model folder" if where == "final_model" else "run folder"
    line = _refused(capsys, [*command, "--output-dir", str(folder)], f"it is a {kind}", cwd)
    assert "not a results root" in line


def test_eval_refuses_a_run_folder_as_its_output(sandbox, tmp_path, capsys):
    cwd, run = sandbox
    model = tmp_path / "model"
    save_small_model(model)
    capsys.readouterr()  # the save's progress bar is not the command's output
    _refused(capsys, ["eval", "--model", str(model), "--task", "arith", "--limit", "2", "--output-dir", str(run)],
             "it holds a run folder's files", cwd)


def test_holder_names_each_commands_results(tmp_path):
    cases = {"run": ["summary.json"], "rm": ["reward_model.json", "config.json"], "model": ["config.json", "model.safetensors"], "mine": ["config.json"],
             "report": ["report.md"], "study": ["report.md", "claims.csv"], "eval": ["arith_metrics.json"]}
    kinds = {}
    for name, files in cases.items():
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f).write_text("{}")
        kinds[name] = (holder(tmp_path / name) or ("nothing of a command's",))[0]
    assert kinds == {"run": "run folder", "rm": "reward model (harness rm train)", "model": "model folder",
                     "report": "report (harness report)", "study": "study report (harness report --study)",
                     "eval": "evaluation (harness eval)", "mine": "nothing of a command's"}  # a user's config.json
    assert output_problem(tmp_path / "rm", "rm train", "--out") is None
    assert output_problem(tmp_path / "study", "report --study", "--output-dir") is None
    assert "study report" in output_problem(tmp_path / "study", "report", "--output-dir")
    (tmp_path / "killed" / "plots").mkdir(parents=True)  # what a report killed before staging left
    assert output_problem(tmp_path / "killed", "report", "--output-dir") is None
    assert "did not write (plots)" in output_problem(tmp_path / "killed", "rm train", "--out")
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "arith.jsonl").write_text("{}\n")  # an evaluation stopped before its metrics
    assert output_problem(tmp_path / "records", "eval", "--output-dir") is None
    assert root_problem(tmp_path / "records", "--output-dir") is None  # a folder of data files is a fine root


def test_staged_replaces_whole_and_keeps_the_old_result_until_then(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "a.txt").write_text("old")
    with pytest.raises(OSError):
        with staged(dest) as stage:
            (stage / "a.txt").write_text("new, half")
            raise OSError(28, "No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (dest / "a.txt").read_text() == "old"
    with staged(dest) as stage:
        (stage / "a.txt").write_text("new")
        assert (dest / "a.txt").read_text() == "old"  # the old result stays until the new one is complete
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (dest / "a.txt").read_text() == "new"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    mode = fresh.stat().st_mode & 0o777
    with staged(tmp_path / "new") as stage:
        (stage / "a.txt").write_text("x")
    assert (tmp_path / "new").stat().st_mode & 0o777 == mode  # not a private temporary folder's 0700
