"""Config validation, round 3 (issue 25): seeds in the generators' range, YAML that expands
beyond reason, NUL bytes in paths, error messages that echo a bounded part of a value,
`--set algorithm=...` over an algorithm section, dataset knobs on arith, and arith problem
spaces too small to evaluate or to train on. Each case was a traceback, a hang or silently
wrong; each is refused (or warned about) here before any work."""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from evals.arith import ArithTask, problem_space
from evals.tasks import TaskSpec
from harness.config.schema import deep_merge
from harness.config.schema import (Config, ConfigError, TaskConfig, config_from_dict, config_warnings, load_config,
                                   parse_overrides, save_config, strict_yaml_load)
from harness.foundation.base import brief
from harness.foundation.yamlsafe import MAX_VALUES, YamlBadValue, YamlTooLarge
from harness.sweep.plan import load_sweep
from harness.sweep.spec import SweepError

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "harness" / "configs" / "quickstart.yaml"


def err(overrides=None, path=None) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides)
    return str(e.value)


def bomb(levels: int = 9) -> str:
    """A YAML flow list of ``levels`` nested levels of nine aliases: 9**levels values, ~400 bytes."""
    s = "&a0 [x, x, x, x, x, x, x, x, x]"
    for i in range(1, levels + 1):
        s = f"&a{i} [{s}, " + ", ".join([f"*a{i - 1}"] * 8) + "]"
    return s


# ------------------------------------------------------------------ 1. seed range

@pytest.mark.parametrize("seed", [2**70, 2**63, -1])
def test_seed_outside_the_generators_range_is_refused(seed):
    msg = err([f"seed={seed}"])
    assert msg.startswith(f"seed={seed} is invalid") and "2**63-1" in msg


def test_seed_at_the_limits_is_accepted():
    assert load_config(None, [f"seed={2**63 - 1}"]).seed == 2**63 - 1
    assert load_config(None, ["seed=0"]).seed == 0


# ------------------------------------------------------------------ 2. YAML size, bounded messages

def test_alias_bomb_is_refused_quickly_in_a_config_file(tmp_path):
    f = tmp_path / "bomb.yaml"
    f.write_text(f"name: {bomb()}\n")
    assert f.stat().st_size < 600
    t0 = time.monotonic()
    msg = err(path=f)
    assert time.monotonic() - t0 < 5
    assert "bomb.yaml" in msg and "aliases" in msg and f"{MAX_VALUES:,}" in msg and len(msg) < 400


def test_alias_bomb_is_refused_in_a_sweep_file(tmp_path):
    f = tmp_path / "sweep.yaml"
    f.write_text(f"name: sw\ndescription: {bomb()}\ngrid: {{seed: [0]}}\n")
    t0 = time.monotonic()
    with pytest.raises(SweepError, match="aliases"):
        load_sweep(f)
    assert time.monotonic() - t0 < 5


def test_alias_bomb_in_a_set_value_is_refused():
    with pytest.raises(ConfigError, match=r"--set name=\.\.\.: aliases"):
        parse_overrides([f"name={bomb()}"])


def test_small_aliases_still_load():
    data = strict_yaml_load("base: &b {lr: 1.0e-3}\ntrain: *b\nother: {<<: *b, x: 1}\n")
    assert data["train"] == {"lr": 1.0e-3} and data["other"] == {"lr": 1.0e-3, "x": 1}


def test_recursive_alias_and_deep_nesting_and_huge_ints_are_yaml_errors():
    with pytest.raises(YamlTooLarge, match="recursive"):
        strict_yaml_load("name: &a [1, *a]\n")
    with pytest.raises(YamlTooLarge, match="nested too deeply"):
        strict_yaml_load("name: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(YamlBadValue, match="4300 digits"):
        strict_yaml_load("seed: " + "9" * 5000 + "\n")


def test_huge_int_in_a_config_file_names_the_file(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text("seed: " + "9" * 5000 + "\n")
    msg = err(path=f)
    assert "big.yaml" in msg and len(msg) < 500


def test_error_messages_echo_a_bounded_part_of_the_value(tmp_path):
    f = tmp_path / "name.yaml"
    f.write_text("name: " + "n" * 2_000_000 + "\n")
    msg = err(path=f)
    assert msg.startswith("name='nnn") and "(2,000,000 characters)" in msg and len(msg) < 800
    # a structure of a billion shared elements (built without YAML) costs nothing to name
    big = [1] * 9
    for _ in range(9):
        big = [big] * 9
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        config_from_dict({"name": big})
    assert time.monotonic() - t0 < 1 and len(str(e.value)) < 400
    assert len(brief(10**5000)) < 60 and len(brief({"k": "v" * 10**6})) < 300


def test_unknown_key_of_two_megabytes_is_bounded():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"x" * 2_000_000: 1})
    assert len(str(e.value)) < 800


# ------------------------------------------------------------------ 3. NUL bytes

@pytest.mark.parametrize("text,field", [
    ('output_dir: "a\\0b"', "output_dir"),
    ('warmup: {cache_dir: "a\\0b"}', "warmup.cache_dir"),
    ('task: {name: gsm8k, data_path: "d\\0.jsonl"}', "task.data_path"),
    ('model: {name_or_path: "m\\0"}', "model.name_or_path"),
])
def test_nul_bytes_are_refused(tmp_path, text, field):
    f = tmp_path / "nul.yaml"
    f.write_text(text + "\n")
    msg = err(path=f)
    assert msg.startswith(f"{field}=") and "NUL" in msg


def test_empty_paths_are_refused_not_passed_over():
    assert err(["warmup.cache_dir="]).startswith("warmup.cache_dir=''")
    assert err(["output_dir="]).startswith("output_dir=''")
    assert load_config(None, ["warmup.cache_dir=null"]).warmup.cache_dir is None


# ------------------------------------------------------------------ 5. --set algorithm=... over a section

def test_set_algorithm_keeps_the_sections_explicit_fields(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("algorithm: {name: grpo, kl_coef: 0.0, clip_eps: 0.1}\n")
    for ov in (["algorithm=ppo"], ["algorithm.name=ppo"]):
        a = load_config(f, ov).algorithm
        assert (a.name, a.kl_coef, a.clip_eps) == ("ppo", 0.0, 0.1), ov


def test_switching_a_run_config_yaml_takes_the_new_presets(tmp_path):
    # a run's config.yaml writes every component of its algorithm out (effective config)
    out = tmp_path / "config.yaml"
    save_config(load_config(QUICKSTART, ["algorithm.clip_eps=0.3"]), out)
    a = load_config(out, ["algorithm=ppo"]).algorithm
    assert a.name == "ppo" and a.clip_eps == 0.3
    assert (a.advantage, a.kl_estimator, a.kl_placement, a.whiten_advantages) == (None, None, None, None)
    # a component set away from the old preset is kept
    a = load_config(out, ["algorithm.kl_coef=0.1", "algorithm=rft"]).algorithm
    assert a.kl_coef == 0.1 and a.filter is None


def test_sweep_grid_switch_over_a_named_base_takes_the_new_presets():
    merged = deep_merge({"algorithm": {"name": "grpo", "advantage": "grpo", "kl_estimator": "k3",
                                       "clip_eps": 0.1}}, {"algorithm": "ppo"})
    assert merged["algorithm"] == {"name": "ppo", "advantage": None, "kl_estimator": None, "clip_eps": 0.1}
    # a section that names no algorithm keeps everything (the shipped sweeps' run ids are unchanged)
    merged = deep_merge({"algorithm": {"kl_coef": 0.04}}, {"algorithm": "ppo"})
    assert merged["algorithm"] == {"kl_coef": 0.04, "name": "ppo"}


# ------------------------------------------------------------------ 6. dataset knobs on arith

def test_dataset_knobs_on_arith_are_refused():
    assert err(["task.data_path=x.jsonl"]).startswith("task.data_path='x.jsonl' is invalid: arith")
    assert err(["task.few_shot=2"]).startswith("task.few_shot=2 is invalid: arith")
    assert load_config(None, ["task.name=gsm8k", "task.data_path=x.jsonl"]).task.data_path == "x.jsonl"


# ------------------------------------------------------------------ 7. arith problem spaces

ONE_HELD_OUT = ["task.min_ops=1", "task.max_ops=1", "task.operators=+", "task.min_operand=1", "task.max_operand=2"]


def test_problem_space_counts():
    sp = problem_space(TaskSpec(min_ops=1, max_ops=1, operators="+", min_operand=1, max_operand=2))
    assert (sp.total, sp.heldout, sp.train, sp.exact) == (4, 1, 3, True)
    sp = problem_space(TaskSpec())  # the default: too large to enumerate, estimated
    assert sp.total == 9**3 * 3**2 + 9**4 * 3**3 and not sp.exact
    sp = problem_space(TaskSpec(min_ops=1, max_ops=10**9, operators="+", min_operand=1, max_operand=1))
    assert sp.total == 10**9  # counted in closed form, not in a billion steps


def test_eval_size_beyond_a_small_held_out_space_warns_and_draws_quickly():
    cfg = load_config(None, ONE_HELD_OUT + ["task.eval_size=100000"])
    (w,) = config_warnings(cfg)
    assert w.startswith("task.eval_size=100000") and "only 1 held-out problem" in w
    t0 = time.monotonic()
    assert len(ArithTask(cfg.task).eval_problems()) == 1
    assert time.monotonic() - t0 < 2  # it drew 20,000,000 times (~50 s) before


def test_empty_training_or_held_out_space_is_refused():
    msg = err(["task.min_ops=1", "task.max_ops=1", "task.operators=+", "task.max_operand=1"])
    assert msg.startswith("task: these arith knobs") and "nothing to train on" in msg
    msg = err(["task.min_ops=1", "task.max_ops=1", "task.operators='-'", "task.max_operand=2"])
    assert msg.startswith("task: these arith knobs") and "none is held out" in msg
    # the out-of-domain set's knobs need held-out problems (it trains on nothing: all held out is fine)
    msg = err(["eval.ood.enabled=true", "eval.ood.min_ops=2", "eval.ood.max_ops=2", "eval.ood.max_operand=1"])
    assert msg.startswith("eval.ood: task: these arith knobs") and "none is held out" in msg
    assert load_config(None, ["task.operators=+", "eval.ood.enabled=true", "eval.ood.min_ops=1", "eval.ood.max_ops=1",
                              "eval.ood.max_operand=1", "eval.ood.eval_size=1"]).eval.ood.enabled  # "1+1", held out


def test_sample_train_stops_on_an_empty_training_space():
    task = ArithTask(TaskSpec(min_ops=1, max_ops=1, operators="+", min_operand=1, max_operand=1))
    with pytest.raises(ValueError, match="nothing to train on"):
        task.sample_train(random.Random(0), 1)


def test_eval_size_beyond_a_large_space_is_refused():
    msg = err(["task.eval_size=100000"])
    assert msg.startswith("task.eval_size=100000 is invalid") and "about 18,370 held-out" in msg
    assert err(["task.eval_size=2000000"]).startswith("task.eval_size=2000000 is invalid: must be <= 1,000,000")


def test_validation_split_needs_room():
    msg = err(ONE_HELD_OUT + ["eval.validation=true"])
    assert msg.startswith("eval.validation=True is invalid")
    assert load_config(QUICKSTART, ["eval.validation=true"]).eval.validation


def test_shipped_configs_have_no_warnings():
    assert config_warnings(load_config(QUICKSTART)) == []
    assert isinstance(config_from_dict({}), Config) and TaskConfig().eval_size == 200
