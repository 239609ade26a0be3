"""`harness eval` on a run's final model scores the run's own problem set (the task built from the run's
config, not from the sampling --seed) and reproduces the run's final greedy accuracy exactly."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from algorithms.presets import COMPONENTS
from evals.catalog import get_task
from harness.cli.main import main
from harness.config.schema import TaskConfig, load_config
from harness.rundir.layout import read_json, read_jsonl
from harness.train.loop import run_dir, train

TINY = [  # tests/harness/train/test_nonfinite.py's tiny run, with a final model and more problems
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "task.min_ops=1", "task.max_ops=1", "task.eval_size=12", "task.seed=77", "warmup.steps=0",
    "sampling.samples_per_prompt=2", "sampling.max_new_tokens=4", "train.prompts_per_step=2",
    "train.threads=1", "budget.unit=steps", "budget.amount=2", "budget.eval_points=1",
    "train.save_final_model=true", "eval.greedy=true", "eval.n=0",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evalrun")
    cfg = load_config(None, TINY + [f"output_dir={tmp}", f"warmup.cache_dir={tmp / 'wc'}"])
    summary = train(cfg, progress=False)
    return cfg, run_dir(cfg), summary


def _final_records(rdir):
    files = sorted((rdir / "eval").glob("arith_*.jsonl"), key=lambda f: int(f.stem.split("_")[-1])
                   if f.stem.split("_")[-1].isdigit() else -1)
    return read_jsonl(files[-1])


@pytest.mark.parametrize("which", ["final_model", "run_dir"])
def test_eval_reproduces_the_runs_final_accuracy(tiny_run, tmp_path, capsys, which):
    cfg, rdir, summary = tiny_run
    model = rdir / "final_model" if which == "final_model" else rdir
    out = tmp_path / "ev"
    assert main(["eval", "--model", str(model), "--out", str(out), "--no-progress", "--seed", "5"]) == 0
    got = json.loads((out / "arith_metrics.json").read_text())
    want = summary["final_eval"]
    assert got["metrics"]["eval/arith/num_problems"] == want["eval/arith/num_problems"] == 12
    assert got["metrics"]["eval/arith/acc"] == want["eval/arith/acc"]
    assert got["settings"]["task_spec"]["seed"] == 77  # the run's generator seed, not --seed
    # the same problems, in the same order, with the same greedy completions
    mine, theirs = read_jsonl(out / "arith.jsonl"), _final_records(rdir)
    assert [r["question"] for r in mine] == [r["question"] for r in theirs]
    assert [r["greedy"]["completion"] for r in mine] == [r["greedy"]["completion"] for r in theirs]
    assert "task from the run config" in capsys.readouterr().out


def test_sampling_seed_no_longer_picks_the_problems(tiny_run, tmp_path):
    """A model outside a run: --seed seeds sampling only; the problems are the task's default set."""
    cfg, rdir, _ = tiny_run
    shutil.copytree(rdir / "final_model", tmp_path / "model")
    runs = []
    for seed in ("0", "3"):
        out = tmp_path / f"s{seed}"
        assert main(["eval", "--model", str(tmp_path / "model"), "--task", "arith", "--limit", "5",
                     "--out", str(out), "--no-progress", "--seed", seed]) == 0
        runs.append([r["question"] for r in read_jsonl(out / "arith.jsonl")])
    default = get_task(TaskConfig(name="arith")).eval_problems()[:5]
    assert runs[0] == runs[1] == [p.question for p in default]


def test_config_option_gives_the_runs_task(tiny_run, tmp_path):
    cfg, rdir, summary = tiny_run
    out = tmp_path / "cfg"
    assert main(["eval", "--model", str(rdir / "final_model"), "--config", str(rdir / "config.yaml"),
                 "--out", str(out), "--no-progress"]) == 0
    got = read_json(out / "arith_metrics.json")
    assert got["metrics"]["eval/arith/acc"] == summary["final_eval"]["eval/arith/acc"]
    assert got["settings"]["run_config"] == str(rdir / "config.yaml")


def test_the_runs_config_yaml_writes_the_effective_algorithm(tiny_run):
    _, rdir, _ = tiny_run
    algo = yaml.safe_load((rdir / "config.yaml").read_text())["algorithm"]
    assert all(algo[k] is not None for k in COMPONENTS), algo
    assert (algo["advantage"], algo["kl_placement"], algo["kl_coef"]) == ("grpo", "loss", 0.04)
    assert rdir.name == run_dir(load_config(None, TINY + [f"output_dir={rdir.parent.parent}",
                                                          f"warmup.cache_dir={rdir.parent.parent / 'wc'}"])).name


def test_protocol_is_checked_before_the_model_loads(tiny_run, tmp_path, capsys, monkeypatch):
    """--protocol lighteval-5shot on an arith run: one line naming the problem, nothing loaded or written."""
    from harness.engine import models
    _, rdir, _ = tiny_run
    monkeypatch.setattr(models, "load_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "ev"
    assert main(["eval", "--model", str(rdir), "--protocol", "lighteval-5shot", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "protocol lighteval-5shot is defined for gsm8k only, not arith" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_lighteval_protocol_end_to_end_on_gsm8k(tiny_run, tmp_path, capsys):
    """The lighteval protocol through the CLI: 5-shot prompts, its 256-token default (as lighteval),
    the protocol in the settings, the printed line and the default folder name."""
    _, rdir, _ = tiny_run
    out = tmp_path / "ev"
    assert main(["eval", "--model", str(rdir / "final_model"), "--task", "gsm8k", "--limit", "2",
                 "--protocol", "lighteval-5shot-plain", "--no-greedy", "--n", "1", "--max-new-tokens", "3",
                 "--output-dir", str(out), "--no-progress"]) == 0
    got = json.loads((out / "gsm8k_metrics.json").read_text())
    assert got["settings"]["protocol"] == "lighteval-5shot-plain" and got["settings"]["max_new_tokens"] == 3
    rec = read_jsonl(out / "gsm8k.jsonl")
    assert len(rec) == 2 and all(s["num_tokens"] <= 3 for r in rec for s in r["samples"])
    printed = capsys.readouterr().out
    assert "gsm8k: final_model" not in printed and "protocol lighteval-5shot-plain" in printed
    assert "task from the run config" not in printed  # --task named another task than the run's


def test_eval_of_a_run_takes_the_runs_numerics_mode(tiny_run, tmp_path):
    """The run's config decides the numerics mode of its evaluation (harness.foundation.numerics.run_mode), not the
    process's default: a run trained in native numerics is evaluated natively; a bare model folder takes the
    process's mode (portable). In subprocesses: the mode is applied before torch runs a kernel."""
    import os
    import subprocess
    import sys

    _, rdir, _ = tiny_run
    native = tmp_path / "native.yaml"
    native.write_text((rdir / "config.yaml").read_text().replace("numerics: portable", "numerics: native"))
    assert "numerics: native" in native.read_text()
    shutil.copytree(rdir / "final_model", tmp_path / "model")
    env = {k: v for k, v in os.environ.items() if k != "GRPO_HARNESS_NUMERICS"}
    modes = {}
    for name, extra in (("run", ["--config", str(native)]), ("bare", ["--task", "arith", "--limit", "2"])):
        out = tmp_path / name
        p = subprocess.run([sys.executable, "-m", "harness.cli.main", "eval", "--model", str(tmp_path / "model"),
                            *extra, "--out", str(out), "--no-progress"], env=env, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        modes[name] = read_json(out / "arith_metrics.json")["provenance"]["numerics"]["mode"]
    assert modes == {"run": "native", "bare": "portable"}
