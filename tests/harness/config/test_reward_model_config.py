"""The reward_model section: strict, one-line errors naming the field, and no change to the ids of runs that
leave it at its defaults."""
import dataclasses

import pytest

from algorithms.presets import ALGORITHMS, DISPLAY_NAMES
from harness.config.schema import ConfigError, RewardModelConfig, load_config, save_config
from harness.foundation.base import to_dict
from harness.rundir.ids import DEFAULT_REWARD_MODEL, run_id
from support_paths import REPO

QS = REPO / "harness" / "configs" / "quickstart.yaml"


def test_the_ids_default_is_the_sections_default():
    assert to_dict(RewardModelConfig()) == DEFAULT_REWARD_MODEL


def test_default_section_keeps_run_ids_and_a_set_one_changes_them(tmp_path):
    ids = {a: run_id(load_config(QS, [f"algorithm={a}"])) for a in ("grpo", "ppo", "rft")}
    assert ids == {"grpo": "grpo-s0-22f487ed", "ppo": "ppo-s0-39d7964f", "rft": "rft-s0-1691e0a8"}  # pinned before
    explicit = load_config(QS, ["algorithm=grpo", "reward_model.rounds=1", "reward_model.replay_fraction=0.1"])
    assert run_id(explicit) == ids["grpo"]
    orm = load_config(QS, ["reward_model.type=orm"])
    assert run_id(orm) != ids["grpo"]
    save_config(orm, tmp_path / "c.yaml")  # its config.yaml names the same run
    assert run_id(load_config(tmp_path / "c.yaml")) == run_id(orm)


@pytest.mark.parametrize("sets,match", [
    (["reward_model.type=value"], "reward_model.type"),
    (["reward_model.type=prm"], "reward_model.type.*process"),                      # grpo is outcome
    (["algorithm=grpo_ps", "reward_model.type=orm"], "reward_model.type.*outcome"),
    (["algorithm=grpo_ps", "reward_model.type=prm", "algorithm.prm=/x"], "algorithm.prm"),
    (["reward_model.rounds=3"], "reward_model.rounds.*orm or prm"),
    (["reward_model.init=/x"], "reward_model.init"),
    (["algorithm=prime", "reward_model.type=implicit", "reward_model.rounds=2"], "implicit PRM trains online"),
    (["reward_model.type=orm", "reward_model.rounds=2", "algorithm.ref_reset_every=4"], "ref_reset_every"),
    (["reward_model.type=orm", "reward_model.samples_per_round=100"], "multiple of sampling.samples_per_prompt"),
    (["reward_model.type=orm", "reward_model.rounds=4", "reward_model.samples_per_round=8192"], "budget"),
    (["reward_model.replay_fraction=1.5"], "replay_fraction"),
    (["reward_model.lr=0"], "reward_model.lr"),
    (["reward_model.beta=-1"], "reward_model.beta"),
    (["task.name=gsm8k", "algorithm=grpo_ps", "reward_model.type=prm"], "no exact step checker"),
    (["task.name=gsm8k", "algorithm=grpo_ps"], "reward_model.type to implicit"),
])
def test_bad_settings_are_one_line_errors(sets, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(QS, sets)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("sets", [
    ["algorithm=grpo", "reward_model.type=orm", "reward_model.rounds=4"],
    ["algorithm=rloo", "reward_model.type=orm"],
    ["algorithm=grpo_ps", "reward_model.type=prm", "reward_model.rounds=4"],
    ["algorithm=prime", "reward_model.type=implicit"],
    ["algorithm=grpo_ps", "reward_model.type=implicit"],
    ["algorithm=prime"],                                                 # PRIME's estimator, exact step rewards
    ["task.name=gsm8k", "algorithm=prime", "reward_model.type=implicit"],
    ["task.name=gsm8k", "algorithm=grpo", "reward_model.type=orm", "reward_model.rounds=2"],
    ["task.name=gsm8k", "algorithm=grpo_ps", "reward_model.type=prm", "reward_model.init=/some/folder"],
])
def test_good_settings_load(sets):
    cfg = load_config(QS, sets)
    assert dataclasses.is_dataclass(cfg.reward_model)


def test_grpo_iter_is_named_for_what_it_is():
    assert ALGORITHMS["grpo_iter"] == ALGORITHMS["grpo"]  # GRPO whose reference is reset: nothing else
    src = (REPO / "algorithms" / "presets.py").read_text()
    assert "reference resets ONLY" in src and "reward_model.rounds" in src
    assert DISPLAY_NAMES["grpo_iter"] == "GRPO + reference resets"  # what reports call it
