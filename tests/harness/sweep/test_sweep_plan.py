"""Sweep files: expansion, run ids, validation errors, the shipped sweeps (nothing runs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.rundir.ids import run_id
from harness.sweep.plan import expand_sweep, format_plan, load_sweep
from harness.sweep.run import summary_value
from harness.sweep.spec import SweepError
import support_paths

REPO = support_paths.REPO


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


BASE = """
name: ignored_by_the_sweep
model: {hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}
train: {lr: 1.0e-4, prompts_per_step: 4}
sampling: {samples_per_prompt: 4}
budget: {unit: steps, amount: 10, eval_points: 2}
"""

SWEEP = """
name: demo
base: cfg/base.yaml
config:
  train.micro_batch_size: 16
  task: {max_ops: 4}
grid:
  algorithm: [grpo, ppo, rft]
  seed: [0, 1]
algorithms:
  ppo: {train.lr: 5.0e-5, algorithm.critic_lr: 1.0e-4}
budget: {unit: samples, amount: 512, eval_points: 4}
"""


@pytest.fixture
def demo(tmp_path):
    write(tmp_path / "sweeps" / "cfg" / "base.yaml", BASE)
    return write(tmp_path / "sweeps" / "demo.yaml", SWEEP)


def test_expand_layers_grid_overrides_and_budget(demo, tmp_path):
    sw = load_sweep(demo, output_dir=str(tmp_path / "out"))
    assert sw.name == "demo" and len(sw.runs) == 6
    cells = [(r.config.algorithm.name, r.config.seed) for r in sw.runs]
    assert cells == [("grpo", 0), ("grpo", 1), ("ppo", 0), ("ppo", 1), ("rft", 0), ("rft", 1)]
    for r in sw.runs:
        c = r.config
        assert c.name == "demo"                                     # the sweep names its runs
        assert c.output_dir == str((tmp_path / "out").resolve())
        assert r.run_dir == (tmp_path / "out").resolve() / "demo" / r.run_id
        assert r.run_id == run_id(c) and r.run_id.startswith(f"{c.algorithm.name}-s{c.seed}-")
        assert (c.budget.unit, c.budget.amount, c.budget.eval_points) == ("samples", 512, 4)   # sweep budget wins
        assert c.model.hidden_size == 32 and c.train.prompts_per_step == 4                     # from base
        assert c.train.micro_batch_size == 16 and c.task.max_ops == 4                          # from config
        assert c.task.min_ops == 2                                  # nested override keeps siblings
        if c.algorithm.name == "ppo":
            assert (c.train.lr, c.algorithm.critic_lr) == (5e-5, 1e-4)
        else:
            assert (c.train.lr, c.algorithm.critic_lr) == (1e-4, 3e-4)
        assert r.state == "new" and r.cell == {"algorithm": c.algorithm.name, "seed": c.seed}
    assert sw.varying[:2] == ["algorithm.name", "seed"]
    assert set(sw.varying) == {"algorithm.name", "seed", "train.lr", "algorithm.critic_lr"}
    plan = format_plan(sw)
    for r in sw.runs:
        assert r.run_id in plan
    assert "512 samples per run" in plan and "at 4 point(s): 128, 256, 384, 512 samples" in plan and "6 to run" in plan


def test_run_ids_stable_across_processes_and_sensitive_to_every_field(demo, tmp_path):
    sw = load_sweep(demo, output_dir=str(tmp_path / "out"))
    ids = [r.run_id for r in sw.runs]
    assert len(set(ids)) == 6
    code = ("import json,sys; from harness.sweep.plan import load_sweep; "
            f"print(json.dumps([r.run_id for r in load_sweep({str(demo)!r}, output_dir='elsewhere').runs]))")
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED="123")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         check=True)
    assert json.loads(out.stdout) == ids      # another process, another output dir: same ids
    # any field that changes what a run computes changes every id
    for override in ("train.micro_batch_size=8", "task.max_ops=3", "budget.amount=256", "sampling.temperature=0.9"):
        other = [r.run_id for r in load_sweep(demo, output_dir=str(tmp_path / "out"), overrides=[override]).runs]
        assert not set(other) & set(ids), override
    # tracking does not
    same = [r.run_id for r in load_sweep(demo, overrides=["tracking.mlflow=true"]).runs]
    assert same == ids


def _finished(run) -> None:
    """A finished run as the trainer leaves it: summary and metrics rows that agree (512 samples)."""
    acc = {f"eval/{run.config.task.name}/acc": 0.5}
    counters = {"step": 32, "samples": 512, "tokens": 2048, "seconds": 3.0}
    write(run.run_dir / "metrics.jsonl", json.dumps({**counters, **acc}) + "\n")
    write(run.run_dir / "summary.json", json.dumps(
        {"status": "finished", "run_id": run.run_id, "final_eval": acc,
         "budget": {"unit": "samples", "amount": 512, "consumed": {"steps": 32, "samples": 512, "tokens": 2048,
                                                                  "seconds": 3.0}}}))


def test_sweep_state_read_from_disk(demo, tmp_path):
    sw = load_sweep(demo, output_dir=str(tmp_path / "out"))
    states = {sw.runs[1].run_id: "failed", sw.runs[2].run_id: "running", sw.runs[3].run_id: "finished"}
    _finished(sw.runs[0])
    for r in sw.runs[1:4]:
        write(r.run_dir / "summary.json", json.dumps({"status": states[r.run_id]}))
    sw2 = load_sweep(demo, output_dir=str(tmp_path / "out"))
    # a bare {"status": "finished"} (forged, or a run stopped part-way) is not counted finished
    assert [r.state for r in sw2.runs] == ["finished", "failed", "running", "unverified", "new", "new"]
    plan = format_plan(sw2)
    assert "finished (skip)" in plan and "failed (re-run)" in plan and "5 to run, 1 already finished" in plan
    assert "not borne out (resume)" in plan


def _err(tmp_path, text: str, name: str = "bad.yaml") -> str:
    p = write(tmp_path / name, text)
    with pytest.raises(SweepError) as ei:
        load_sweep(p, output_dir=str(tmp_path / "out"))
    return str(ei.value)


BAD = {
    "unknown_algorithm": ("name: x\ngrid: {algorithm: [grpo, ppoo]}\n",
                          ["unknown algorithm 'ppoo'", "did you mean 'ppo'", "valid: ", "rft", "grid.algorithm"]),
    "unknown_algorithm_in_overrides": ("name: x\ngrid: {seed: [0]}\nalgorithms: {grp0: {train.lr: 0.1}}\n",
                                       ["unknown algorithm 'grp0'", "algorithms.grp0", "'grpo'"]),
    "empty_grid": ("name: x\ngrid: {}\n", ["grid is empty"]),
    "missing_grid": ("name: x\nconfig: {seed: 1}\n", ["grid is missing"]),
    "empty_grid_list": ("name: x\ngrid: {seed: []}\n", ["grid.seed is an empty list"]),
    "grid_not_a_list": ("name: x\ngrid: {seed: 3}\n", ["grid.seed must be a list", "[3]"]),
    "budget_unit_typo": ("name: x\ngrid: {seed: [0]}\nbudget: {unit: sample, amount: 10}\n",
                         ["budget.unit='sample'", "did you mean 'samples'", "samples, tokens, steps, seconds"]),
    "budget_missing_amount": ("name: x\ngrid: {seed: [0]}\nbudget: {unit: steps}\n", ["budget.amount is missing"]),
    # the sweep's budget keeps the config's budget rule (issue 44): a limit per unit, whole steps, eval_points capped
    "budget_over_its_units_limit": ("name: x\ngrid: {seed: [0]}\nbudget: {unit: steps, amount: '1e9'}\n",
                                    ["bad.yaml: budget.amount=1000000000.0 is invalid: a budget in steps must be at "
                                     "most 1e+08"]),
    "budget_fractional_steps": ("name: x\ngrid: {seed: [0]}\nbudget: {unit: steps, amount: 2.5}\n",
                                ["bad.yaml: budget.amount=2.5 is invalid: a budget in steps must be a whole number"]),
    "budget_too_many_eval_points": ("name: x\ngrid: {seed: [0]}\nbudget: {unit: steps, amount: 4, "
                                    "eval_points: 200000}\n",
                                    ["bad.yaml: budget.eval_points=200000 is invalid: must be <= 100000"]),
    "budget_amount_not_a_number": ("name: x\ngrid: {seed: [0]}\nbudget: {unit: steps, amount: lots}\n",
                                   ["budget.amount: expected a number, got 'lots'"]),
    "name_with_a_newline": ('name: "x\\n"\ngrid: {seed: [0]}\n', ["name='x\\n' is invalid: must be a non-empty name"]),
    "budget_key_typo": ("name: x\ngrid: {seed: [0]}\nbudget: {unit: steps, amount: 3, evalpoints: 2}\n",
                        ["unknown key 'budget.evalpoints'", "'eval_points'"]),
    "missing_base": ("name: x\nbase: nowhere/cfg.yaml\ngrid: {seed: [0]}\n",
                     ["base config file not found", "nowhere/cfg.yaml"]),
    "unknown_top_level_key": ("name: x\ngrids: {seed: [0]}\n", ["unknown top-level key 'grids'", "did you mean 'grid'"]),
    "bad_yaml": ("name: x\ngrid: {seed: [0, 1\n", ["not valid YAML"]),
    "not_a_mapping": ("- name: x\n", ["must be a mapping"]),
    "missing_name": ("grid: {seed: [0]}\n", ["name=None is invalid"]),
    "bad_dotted_key_in_grid": ("name: x\ngrid: {train.lrr: [0.1]}\n",
                               ["grid", "unknown config key 'train.lrr'", "did you mean 'lr'"]),
    "bad_dotted_key_in_config": ("name: x\nconfig: {sampling.temprature: 0.5}\ngrid: {seed: [0]}\n",
                                 ["config", "unknown config key 'sampling.temprature'", "'temperature'"]),
    "bad_nested_key_in_config": ("name: x\nconfig: {model: {hiden_size: 8}}\ngrid: {seed: [0]}\n",
                                 ["unknown config key 'model.hiden_size'", "'hidden_size'"]),
    "bad_key_in_algorithm_override": ("name: x\ngrid: {algorithm: [ppo]}\nalgorithms: {ppo: {algorithm.critic_l: 1}}\n",
                                      ["algorithms.ppo", "unknown config key 'algorithm.critic_l'"]),
    "bad_value_type": ("name: x\ngrid: {train.lr: [abc]}\n", ["run [train.lr=abc]", "train.lr", "expected a number"]),
    "bad_value_range": ("name: x\ngrid: {sampling.top_p: [0.5, 2.0]}\n", ["run [sampling.top_p=2]", "sampling.top_p"]),
    "budget_in_grid": ("name: x\ngrid: {budget.amount: [1, 2]}\n", ["budget cannot vary"]),
    "budget_in_algorithm_override": ("name: x\ngrid: {algorithm: [ppo]}\nalgorithms: {ppo: {budget.amount: 3}}\n",
                                     ["budget cannot differ"]),
    "grid_and_override_conflict": ("name: x\ngrid: {algorithm: [ppo], train.lr: [0.1, 0.2]}\n"
                                   "algorithms: {ppo: {train.lr: 0.3}}\n", ["both in grid", "ambiguous"]),
    "duplicate_runs": ("name: x\ngrid: {seed: [0, 0]}\n", ["expand to the same config"]),
    "launcher_key_typo": ("name: x\ngrid: {seed: [0]}\nlauncher: {worker: 2}\n",
                          ["unknown key 'launcher.worker'", "'workers'"]),
    "launcher_type_typo": ("name: x\ngrid: {seed: [0]}\nlauncher: {type: rey}\n", ["launcher.type='rey'", "'ray'"]),
    "launcher_zero_stage": ("name: x\ngrid: {seed: [0]}\nlauncher: {zero_stage: 1}\n", ["launcher.zero_stage=1"]),
}


def test_a_sweep_budget_takes_what_a_config_budget_takes(tmp_path):
    """One budget rule: "1e3" as text, a whole float for eval_points (a config takes both)."""
    p = write(tmp_path / "ok.yaml", "name: x\ngrid: {seed: [0]}\nbudget: {unit: samples, amount: '1e3', "
                                     "eval_points: 2.0}\n")
    sw = load_sweep(p, output_dir=str(tmp_path / "out"))
    assert (sw.budget["unit"], sw.budget["amount"], sw.budget["eval_points"]) == ("samples", 1000, 2)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sweep_files_name_the_problem(tmp_path, case):
    text, needles = BAD[case]
    msg = _err(tmp_path, text)
    for n in needles:
        assert n in msg, f"{case}: {n!r} not in {msg!r}"
    if case not in ("missing_base", "bad_yaml"):
        assert "bad.yaml" in msg            # and the file it came from


def test_missing_sweep_file(tmp_path):
    with pytest.raises(SweepError, match="sweep file not found"):
        load_sweep(tmp_path / "nope.yaml")


def test_cli_errors_exit_2_and_dry_run_runs_nothing(tmp_path, demo):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    bad = write(tmp_path / "bad.yaml", "name: x\ngrid: {algorithm: [grpo, dpo]}\n")
    p = subprocess.run([sys.executable, "-m", "harness.cli.main", "sweep", str(bad), "--dry-run"], capture_output=True, text=True,
                       env=env, cwd=tmp_path)
    assert p.returncode == 2 and "unknown algorithm 'dpo'" in p.stderr and p.stdout == ""
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "harness.cli.main", "sweep", str(demo), "--dry-run", "--output-dir", str(out)],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "sweep demo: 6 run(s)" in p.stdout and "ppo-s1-" in p.stdout
    assert not out.exists()                 # a dry run writes nothing


def test_registered_as_harness_subcommand(demo, tmp_path, capsys):
    from harness.cli.main import main
    assert main(["sweep", str(demo), "--dry-run", "--output-dir", str(tmp_path / "o")]) == 0
    assert "sweep demo: 6 run(s)" in capsys.readouterr().out


def test_inline_config_only_and_algorithm_dicts(tmp_path):
    spec = {"name": "inline", "config": {"algorithm": {"kl_coef": 0.0}, "train": {"lr": 0.01}},
            "grid": {"algorithm": ["grpo", {"name": "rloo", "clip_eps": 0.3}], "train.inner_epochs": [1, 2]}}
    sw = expand_sweep(spec, base_dir=tmp_path, output_dir=str(tmp_path))
    got = [(r.config.algorithm.name, r.config.algorithm.kl_coef, r.config.algorithm.clip_eps,
            r.config.train.inner_epochs) for r in sw.runs]
    assert got == [("grpo", 0.0, 0.2, 1), ("grpo", 0.0, 0.2, 2), ("rloo", 0.0, 0.3, 1), ("rloo", 0.0, 0.3, 2)]
    assert sw.budget["unit"] == "steps"       # no sweep budget: the config's (here the default)
    assert all(r.config.train.lr == 0.01 for r in sw.runs)


def test_cli_set_applies_to_every_run(demo, tmp_path):
    sw = load_sweep(demo, output_dir=str(tmp_path), overrides=["budget.amount=64", "train.lr=0.5"])
    assert {r.config.budget.amount for r in sw.runs} == {64}
    assert {r.config.train.lr for r in sw.runs} == {0.5}          # --set is the last layer
    with pytest.raises(SweepError, match="unknown config key 'train.lrate'"):
        load_sweep(demo, overrides=["train.lrate=1"])


def test_summary_value_paths():
    s = {"final_eval": {"eval/arith/acc": 0.5, "eval/arith/pass@1": 0.4}, "peak": {"rss_mb": 12.0},
         "budget": {"consumed": {"samples": 10}}}
    assert summary_value(s, "final_eval.eval/arith/acc") == 0.5
    assert summary_value(s, "peak.rss_mb") == 12.0
    assert summary_value(s, "budget.consumed.samples") == 10
    assert summary_value(s, "peak.cuda_mb") is None and summary_value(s, "nope.x") is None


SHIPPED = sorted((REPO / "sweeps").glob("*.yaml"))


def test_shipped_sweeps_exist():
    names = {p.name for p in SHIPPED}
    assert {"quickstart.yaml", "grpo_vs_ppo.yaml"} <= names
    assert any(n.startswith("paper_") for n in names)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_sweep_validates(path, tmp_path):
    """Every shipped sweep expands and every run config validates. Hub models are only
    named here, never loaded (nothing in expansion touches the model)."""
    sw = load_sweep(path, output_dir=str(tmp_path))
    assert sw.runs and sw.name == yaml.safe_load(path.read_text())["name"]
    assert len({r.run_id for r in sw.runs}) == len(sw.runs)
    units = {(r.config.budget.unit, r.config.budget.amount, r.config.budget.eval_points) for r in sw.runs}
    assert len(units) == 1                  # one matched budget per sweep
    assert format_plan(sw)
    for r in sw.runs:
        assert not r.run_dir.exists()


def test_shipped_sweep_contents(tmp_path):
    q = load_sweep(REPO / "sweeps" / "quickstart.yaml", output_dir=str(tmp_path))
    assert sorted(r.config.algorithm.name for r in q.runs) == ["grpo", "ppo", "rft"]
    assert {r.config.seed for r in q.runs} == {0} and q.budget["unit"] == "samples"
    assert {r.config.task.name for r in q.runs} == {"arith"} and {r.config.model.name_or_path for r in q.runs} == {"tiny"}
    g = load_sweep(REPO / "sweeps" / "grpo_vs_ppo.yaml", output_dir=str(tmp_path))
    assert sorted({r.config.seed for r in g.runs}) == [0, 1, 2]
    assert {r.config.algorithm.name for r in g.runs} == {"grpo", "ppo"}
    assert "peak.rss_mb" in g.report_columns and "wall_seconds" in g.report_columns
    papers = [p for p in SHIPPED if p.name.startswith("paper_")]
    models = set()
    for p in papers:
        head = p.read_text()
        # each says what it assumes and how long it should take (issue: paper sweeps annotated)
        assert "Assumes:" in head and "Expected wall-clock" in head and "NOT measured" in head, p.name
        sw = load_sweep(p, output_dir=str(tmp_path))
        for r in sw.runs:
            c = r.config
            models.add(c.model.name_or_path)
            # DeepSeekMath §4.2 (arXiv 2402.03300)
            assert c.train.lr == 1e-6 and c.sampling.samples_per_prompt == 64
            assert c.sampling.max_new_tokens == 1024 and c.train.inner_epochs == 1
            assert c.train.prompts_per_step * c.sampling.samples_per_prompt == 1024
            if c.algorithm.name in ("grpo", "ppo"):
                assert c.algorithm.kl_coef == 0.04
            assert c.warmup.enabled is False and c.model.dtype == "bfloat16"
    assert {"deepseek-ai/deepseek-math-7b-instruct", "Qwen/Qwen2.5-Math-1.5B-Instruct"} <= models


def test_the_plan_prints_the_evaluation_points_that_happen(tmp_path):
    """512 samples at 4 points with 256-sample stages: thresholds round to stage boundaries and
    coincide, so 2 evaluations happen (256, 512); the plan says so and warns."""
    from harness.config.schema import load_config
    from harness.foundation.budget import eval_points, eval_thresholds, threshold_warning
    cfg = load_config("harness/configs/quickstart.yaml", ["budget.amount=512"])
    assert (cfg.budget.eval_points, cfg.train.prompts_per_step * cfg.sampling.samples_per_prompt) == (4, 256)
    assert eval_thresholds(cfg.budget, 256) == [256.0, 512.0, 512.0, 512.0]
    assert eval_points(cfg.budget, 256) == [256.0, 512.0]
    w = threshold_warning(cfg.budget, 256)
    assert w == ("budget.eval_points=4 asks for more evaluation points than the budget has stages (256 samples "
                 "each, evaluated at stage boundaries): 2 happen, at 256, 512 samples")
    sw = load_sweep("sweeps/quickstart.yaml", overrides=["budget.amount=512"], output_dir=str(tmp_path))
    plan = format_plan(sw)
    assert "evaluated before training and at 2 point(s): 256, 512 samples" in plan
    assert f"warning: {w}" in plan


def test_a_field_the_first_run_omits_at_its_default_still_varies(tmp_path):
    """sweeps/offpolicy.yaml's first run is on-policy: its config leaves train.staleness and algorithm.correction out
    (their defaults, 0 and none). They vary across the sweep all the same: the plan has their columns, and the runs
    that leave them out show the defaults, not None."""
    sw = load_sweep(REPO / "sweeps" / "offpolicy.yaml", output_dir=str(tmp_path))
    assert "train.staleness" not in json.dumps(sw.runs[0].config_dict)
    assert {"train.staleness", "algorithm.correction"} <= set(sw.varying)
    lines = format_plan(sw).splitlines()
    head = next(ln for ln in lines if ln.startswith("run id")).split()
    row = next(ln for ln in lines if ln.startswith(sw.runs[0].run_id)).split()
    i = head.index("train.staleness") - 1          # "run id" is two words in the header
    assert (row[i], row[i + 1]) == ("0", "none")
