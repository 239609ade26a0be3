"""The effective config: config.yaml, `harness config --show` and the trackers' params write out the
algorithm's preset-filled components (no nulls, ``cfg.algo``), and run ids hash the same effective
config, so a run's config.yaml names the same run as the config it came from."""
import pytest
import yaml

from algorithms.presets import COMPONENTS
from harness.cli.main import main
from harness.config.schema import config_from_dict, effective_dict, load_config, save_config, settings
from harness.foundation.base import flatten, to_dict
from harness.rundir.ids import run_id
from harness.tracking.base import TrackerSet, config_dict


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "rft"])
def test_config_yaml_has_no_null_algorithm_component(algorithm, tmp_path):
    cfg = load_config(None, [f"algorithm={algorithm}"])
    assert any(getattr(cfg.algorithm, k) is None for k in COMPONENTS)  # the user config leaves them to the preset
    save_config(cfg, tmp_path / "config.yaml")
    written = yaml.safe_load((tmp_path / "config.yaml").read_text())["algorithm"]
    assert all(written[k] is not None for k in COMPONENTS), written
    # what is written loads back as a valid config that resolves to the same algorithm
    assert config_from_dict(yaml.safe_load((tmp_path / "config.yaml").read_text())).algorithm.name == algorithm


def test_grpo_and_ppo_differ_exactly_where_their_presets_differ():
    g = flatten(effective_dict(load_config(None, ["algorithm=grpo"])))
    p = flatten(effective_dict(load_config(None, ["algorithm=ppo"])))
    differ = {k for k in g.keys() | p.keys() if g.get(k) != p.get(k)}
    assert differ == {"algorithm.name", "algorithm.advantage", "algorithm.kl_estimator", "algorithm.kl_placement",
                      "algorithm.whiten_advantages"}
    assert (p["algorithm.kl_placement"], g["algorithm.kl_placement"]) == ("reward", "loss")


def test_user_overrides_win_over_the_preset():
    e = effective_dict(load_config(None, ["algorithm=ppo", "algorithm.kl_coef=0.1"]))["algorithm"]
    assert e["kl_coef"] == 0.1 and e["advantage"] == "gae"


def test_run_id_hashes_the_effective_config():
    """A run's config.yaml (effective values written out) names the same run as the config it came
    from, and a real difference in a component is another run."""
    cfg = config_from_dict(to_dict(load_config(None, ["algorithm=ppo"])))  # (a round trip makes budget.amount float)
    assert to_dict(cfg)["algorithm"]["advantage"] is None
    assert run_id(cfg) == run_id(config_from_dict(effective_dict(cfg)))
    assert run_id(cfg) != run_id(config_from_dict(to_dict(load_config(None, ["algorithm=ppo",
                                                                           "algorithm.kl_coef=0.05"]))))


def test_config_show_prints_effective_values(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("algorithm: ppo\n")
    assert main(["config", "--show", str(tmp_path / "c.yaml")]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)["algorithm"]
    assert shown["advantage"] == "gae" and shown["kl_placement"] == "reward" and shown["kl_coef"] == 0.04


def test_trackers_get_effective_params_and_config():
    cfg = load_config(None, ["algorithm=grpo"])
    assert config_dict(cfg)["algorithm"]["kl_placement"] == "loss"
    assert config_dict({"algorithm": "rft"})["algorithm"]["filter"] == "correct"  # a summary's dict, shorthand

    class Rec:
        name = "rec"

        def start(self, params, tags):
            self.params = params

    rec = Rec()
    TrackerSet([rec]).start(flatten(cfg.effective_dict()), {})  # what the trainer passes
    assert rec.params["algorithm.advantage"] == "grpo" and rec.params["algorithm.kl_coef"] == 0.04
    assert rec.params == flatten(effective_dict(to_dict(cfg)))  # the same as the config read back resolves to


def test_the_algorithm_is_resolved_once_when_the_config_is_loaded():
    from algorithms.presets import resolve
    cfg = load_config(None, ["algorithm=ppo", "algorithm.kl_coef=0.1"])
    assert "algo" in vars(cfg)  # built by the validation that loading runs
    assert cfg.algo is cfg.algo and cfg.algo == resolve(cfg.algorithm) == resolve(cfg.algo)
    assert (cfg.algo.advantage, cfg.algo.kl_coef, cfg.algo.kl_placement, cfg.algo.clip_eps) == ("gae", 0.1, "reward", 0.2)
    assert cfg.algo.critic and cfg.algo.uses_reference
    assert cfg.algorithm.advantage is None and to_dict(cfg)["algorithm"]["advantage"] is None  # as given
    rft = load_config(None, ["algorithm=rft"]).algo
    assert not rft.critic and not rft.uses_reference and rft.filter == "correct"


def test_settings_reads_every_setting_in_force_from_a_run_config():
    """`settings`: the one reader of a run's settings (the report's rows, bench/paired_vs_baseline.py,
    bench/offpolicy.py): the preset's components filled in, the knobs config.yaml leaves out at their defaults
    read as those defaults, a config it cannot resolve read as written (never an error)."""
    flat = settings({"algorithm": {"name": "grpo"}, "train": {"lr": 1e-4}})
    assert flat["train.lr"] == 1e-4 and flat["train.staleness"] == 0 and flat["algorithm.correction"] == "none"
    assert flat["algorithm.advantage"] == "grpo" and flat["train.heap_mmap_threshold_kib"] == 0
    assert settings({"algorithm": {"name": "grpo", "correction": "token_tis"}, "train": {"staleness": 8}})[
        "algorithm.correction"] == "token_tis"
    odd = settings({"algorithm": {"name": "no_such_algorithm"}, "train": "garbage"})
    assert odd["algorithm.name"] == "no_such_algorithm" and odd["train"] == "garbage" and "train.lr" not in odd
