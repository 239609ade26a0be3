"""Bad inputs are refused before any work starts: exit 2, one line naming the field or path,
no traceback, nothing written outside the output directory."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.cli import train as cli_train
from harness.cli.main import main
from refusals import refused  # tests/support

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = str(ROOT / "harness" / "configs" / "quickstart.yaml")

# (id, --set overrides for `harness train`, text the message must contain)
TRAIN_SETS = [
    ("task-unknown", ["task.name=arithmetic"], "task.name"),
    ("task-empty", ["task.name="], "task.name"),
    ("device-cuda9", ["device=cuda:x"], "device"),
    ("device-gpu", ["device=gpu"], "device"),
    ("device-cuda-colon", ["device=cuda:"], "device"),
    ("device-upper", ["device=CPU"], "device"),
    ("grpo-ps-gsm8k", ["algorithm=grpo_ps", "task.name=gsm8k"], "algorithm.prm"),
    ("budget-huge-samples", ["budget.amount=1e30"], "budget.amount"),
    ("budget-huge-steps", ["budget.unit=steps", "budget.amount=1e12"], "budget.amount"),
    ("budget-huge-seconds", ["budget.unit=seconds", "budget.amount=1e20"], "budget.amount"),
    ("budget-inf", ["budget.amount=.inf"], "budget.amount"),
    ("budget-zero", ["budget.amount=0"], "budget.amount"),
    ("budget-unit", ["budget.unit=epochs"], "budget.unit"),
    ("prompts-huge", ["train.prompts_per_step=1000000000"], "train.prompts_per_step"),
    ("prompts-float", ["train.prompts_per_step=1e9"], "train.prompts_per_step"),
    ("stage-too-big", ["train.prompts_per_step=200000", "sampling.samples_per_prompt=64"], "train.prompts_per_step"),
    ("checkpoint-minutes-negative", ["train.checkpoint_minutes=-1"], "train.checkpoint_minutes"),
    ("eval-nothing", ["eval.greedy=false", "eval.n=0"], "eval.n"),
    ("eval-n-negative", ["eval.n=-1"], "eval.n"),
    ("max-length-short", ["model.max_length=30"], "model.max_length"),
    ("max-length-new-tokens", ["sampling.max_new_tokens=200"], "model.max_length"),
    ("lr-inf", ["train.lr=.inf"], "train.lr"),
    ("lr-nan", ["train.lr=.nan"], "train.lr"),
    ("lr-zero", ["train.lr=0"], "train.lr"),
    ("critic-lr-inf", ["algorithm.critic_lr=inf"], "algorithm.critic_lr"),
    ("name-dotdot", ["name=../escape"], "name"),
    ("name-slash", ["name=a/b"], "name"),
    ("name-dotdot-only", ["name=.."], "name"),
    ("name-hidden", ["name=.hidden"], "name"),
    ("name-abs", ["name=/tmp/x"], "name"),
    ("unknown-key", ["train.learning_rate=1e-3"], "train.learning_rate"),
    ("unknown-section", ["trian.lr=1e-3"], "trian"),
    ("algo-unknown", ["algorithm=grpoo"], "algorithm"),
    ("temperature-zero", ["sampling.temperature=0"], "sampling.temperature"),
    ("top-p", ["sampling.top_p=1.5"], "sampling.top_p"),
    ("samples-per-prompt-1", ["sampling.samples_per_prompt=1"], "sampling.samples_per_prompt"),
    ("bool-type", ["eval.greedy=maybe"], "eval.greedy"),
    ("set-no-equals", ["train.lr"], "train.lr"),
    ("dtype", ["model.dtype=float8"], "model.dtype"),
]
if not torch.cuda.is_available():
    TRAIN_SETS += [("cuda-missing", ["device=cuda"], "device"), ("cuda1-missing", ["device=cuda:1"], "device")]


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd = tmp_path/cwd (relative defaults land there); output under tmp_path/out."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)

    def no_training(*a, **k):
        raise AssertionError("training started: the input was not refused")
    monkeypatch.setattr(cli_train.loop, "train", no_training)
    monkeypatch.setattr(cli_train.warmup, "starting_checkpoint", no_training)
    return tmp_path


def _refused(capsys, argv, must, root: Path, allowed: set[str] = frozenset()) -> str:
    return refused(capsys, argv, must, root, allowed=allowed)


@pytest.mark.parametrize("sets,must", [t[1:] for t in TRAIN_SETS], ids=[t[0] for t in TRAIN_SETS])
def test_train_refuses(sets, must, sandbox, capsys):
    argv = ["train", QUICKSTART, "--no-progress", "--set", f"output_dir={sandbox / 'out'}"]
    for s in sets:
        argv += ["--set", s]
    _refused(capsys, argv, must, sandbox)


def test_train_refuses_an_unwritable_warmup_cache(sandbox, capsys):
    # checked after the output directory (which it may create, as every run does)
    argv = ["train", QUICKSTART, "--no-progress", "--set", f"output_dir={sandbox / 'out'}",
            "--set", "warmup.cache_dir=/proc/harness-cache"]
    _refused(capsys, argv, "warmup.cache_dir", sandbox, allowed={"out"})


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def test_train_file_inputs(sandbox, capsys):
    # duplicate YAML key, naming the key
    dup = _write(sandbox / "dup.yaml", "name: a\ntrain: {lr: 1.0e-3}\ntrain: {lr: 2.0e-3}\n")
    err = _refused(capsys, ["train", str(dup), "--set", f"output_dir={sandbox / 'out'}"], "duplicate key 'train'",
                   sandbox)
    assert "dup.yaml" in err
    nested = _write(sandbox / "dup2.yaml", "train:\n  lr: 1.0e-3\n  lr: 2.0e-3\n")
    _refused(capsys, ["train", str(nested)], "duplicate key 'lr'", sandbox)
    _refused(capsys, ["train", str(sandbox / "missing.yaml")], "missing.yaml", sandbox)
    _refused(capsys, ["train", str(sandbox)], str(sandbox), sandbox)  # a directory as config
    notmap = _write(sandbox / "list.yaml", "- 1\n- 2\n")
    _refused(capsys, ["train", str(notmap)], "list.yaml", sandbox)
    bad = _write(sandbox / "bad.yaml", "train: {lr: [1, \n")
    _refused(capsys, ["train", str(bad)], "bad.yaml", sandbox)
    # model file that is not .gguf
    weights = _write(sandbox / "model.bin", "not a model")
    _refused(capsys, ["train", QUICKSTART, "--set", f"model.name_or_path={weights}"], "model.name_or_path", sandbox)
    # output dir that is a file, or under a file, or unwritable
    f = _write(sandbox / "afile", "x")
    _refused(capsys, ["train", QUICKSTART, "--set", f"output_dir={f}"], "output_dir", sandbox)
    _refused(capsys, ["train", QUICKSTART, "--set", f"output_dir={f / 'sub'}"], "output_dir", sandbox)
    _refused(capsys, ["train", QUICKSTART, "--set", "output_dir=/proc/harness-results"], "output_dir", sandbox)


def test_report_and_ui_refuse(sandbox, capsys):
    empty = sandbox / "empty"
    empty.mkdir()
    _refused(capsys, ["report", str(empty)], "no run directories", sandbox)
    _refused(capsys, ["report", str(sandbox / "nope")], "nope", sandbox)
    # a sweep dir with a run, and --output-dir that is a file
    run = sandbox / "res" / "sw" / "r1"
    run.mkdir(parents=True)
    _write(run / "metrics.jsonl", '{"step": 1}\n')
    f = _write(sandbox / "report-file", "x")
    _refused(capsys, ["report", str(sandbox / "res" / "sw"), "--output-dir", str(f)], "--out", sandbox)
    pytest.importorskip("mlflow")
    _refused(capsys, ["ui", str(sandbox / "nope")], "nope", sandbox)


def test_eval_refuses(sandbox, capsys):
    _refused(capsys, ["eval", "--model", "x", "--task", "arith", "--no-greedy", "--n", "0"], "--n", sandbox)
    if not torch.cuda.is_available():
        _refused(capsys, ["eval", "--model", "x", "--task", "arith", "--device", "cuda"], "--device", sandbox)


SWEEP = """name: {name}
base: {base}
grid: {{algorithm: [grpo], seed: [0]}}
budget: {{unit: samples, amount: 64}}
"""


@pytest.mark.parametrize("extra,name,must", [
    ("launcher: {env: {LD_PRELOAD: /tmp/x.so}}", "ok", "LD_PRELOAD"),
    ("launcher: {env: {PYTHONPATH: /tmp}}", "ok", "PYTHONPATH"),
    ("launcher: {env: {PATH: /tmp}}", "ok", "launcher.env.PATH"),
    ("", "../escape", "name"),
    ("", "a/b", "name"),
    ("", "..", "name"),
    ("name: again", "ok", "duplicate key 'name'"),
], ids=["env-ld-preload", "env-pythonpath", "env-path", "name-dotdot", "name-slash", "name-dots", "dup-key"])
def test_sweep_refuses(extra, name, must, sandbox, capsys):
    f = _write(sandbox / "sweep.yaml", SWEEP.format(name=name, base=QUICKSTART) + extra + "\n")
    _refused(capsys, ["sweep", str(f), "--output-dir", str(sandbox / "out"), "--dry-run"], must, sandbox)


@pytest.mark.parametrize("budget,config,must", [
    ("{unit: samples, amount: 1.0e30}", "", "budget.amount"),
    ("{unit: steps, amount: 1.0e12}", "", "budget.amount"),
    ("{unit: samples, amount: 64}", "config: {train.prompts_per_step: 1000000000}", "train.prompts_per_step"),
], ids=["sweep-budget-huge", "sweep-steps-huge", "sweep-prompts-huge"])
def test_sweep_refuses_budgets_and_batches_it_cannot_reach_or_hold(budget, config, must, sandbox, capsys):
    text = SWEEP.format(name="big", base=QUICKSTART).replace("{unit: samples, amount: 64}", budget) + config + "\n"
    f = _write(sandbox / "sweep.yaml", text)
    _refused(capsys, ["sweep", str(f), "--output-dir", str(sandbox / "out"), "--dry-run"], must, sandbox)


def test_sweep_env_allow_list_accepts_thread_variables(sandbox, capsys):
    f = _write(sandbox / "sweep.yaml", SWEEP.format(name="ok", base=QUICKSTART)
               + "launcher: {env: {OMP_NUM_THREADS: 1, MKL_NUM_THREADS: 1, CUDA_VISIBLE_DEVICES: '0', "
                 "NCCL_DEBUG: INFO, TOKENIZERS_PARALLELISM: 'false'}}\n")
    assert main(["sweep", str(f), "--output-dir", str(sandbox / "out"), "--dry-run"]) == 0


def test_table_is_large_enough():
    assert len(TRAIN_SETS) + 10 + 7 + 7 + 2 >= 40
