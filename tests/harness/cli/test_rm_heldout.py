"""`harness rm train`: sample counts and held-out fractions that leave one side of the split empty (no
held-out problem: `"heldout": {}` and exit 0; no training problem) are refused before any sampling, one
line naming the numbers and a sample count that leaves both sides; so are counts the sampler would
round up, and counts past the caps. Nothing here samples: the training is a stub that fails the test."""
from __future__ import annotations

import re

import pytest

from harness.cli import rm as cli_rm
from harness.cli.main import main
from harness.config.schema import load_config
from support_paths import REPO

QS = str(REPO / "harness" / "configs" / "quickstart.yaml")


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    import harness.rewards.fit as fit
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fit, "train_reward_model", lambda *a, **k: pytest.fail("sampling started"))
    return tmp_path


def _refused(capsys, sandbox, extra, must) -> str:
    rc = main(["rm", "train", QS, "--type", "orm", "--output-dir", str(sandbox / "r"), *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert must in err, (must, err)
    assert not (sandbox / "r").exists()
    return err.strip()


def _cfg(*sets):
    return load_config(QS, list(sets))


def test_the_split_check_draws_what_the_training_draws():
    import harness.rewards.fit as fit
    from harness.rewards import data
    assert cli_rm.training_problems is fit.training_problems is data.training_problems


def test_no_held_out_problem_is_refused(sandbox, capsys):
    """The audit's case: 8 samples at 4 per prompt are 2 problems, and the hash split holds out neither."""
    cfg = _cfg("sampling.samples_per_prompt=4")
    problems = next(p for p in range(1, 50) if cli_rm.split_sizes(cfg, p, 0.2)[1] == 0)
    train, _ = cli_rm.split_sizes(cfg, problems, 0.2)
    err = _refused(capsys, sandbox, ["--samples", str(4 * problems), "--set", "sampling.samples_per_prompt=4"],
                   f"--samples {4 * problems} with sampling.samples_per_prompt 4 draws {problems} problem")
    distinct = f" ({train} distinct)" if train != problems else ""
    assert f"{distinct} and --heldout-frac 0.2 holds out none of them: no held-out accuracy or AUC" in err
    suggested = int(re.search(r"e\.g\. --samples (\d+):", err).group(1))
    assert all(cli_rm.split_sizes(cfg, suggested // 4, 0.2)), "the suggested count leaves a side empty too"
    assert "or raise --heldout-frac" in err


def test_no_training_problem_is_refused(sandbox, capsys):
    seed = next(s for s in range(200) if cli_rm.split_sizes(_cfg(f"seed={s}"), 1, 0.9) == (0, 1))
    err = _refused(capsys, sandbox, ["--samples", "8", "--heldout-frac", "0.9", "--set", f"seed={seed}"],
                   "--samples 8 with sampling.samples_per_prompt 8 draws 1 problem and --heldout-frac "
                   "0.9 holds out all of them: nothing to train on")
    assert "or lower --heldout-frac" in err


def test_the_configs_sample_count_is_checked_too(sandbox, capsys):
    """Without --samples, reward_model.samples_per_round is what is drawn: the same check, naming it."""
    cfg = _cfg()
    problems = next(p for p in range(1, 50) if cli_rm.split_sizes(cfg, p, 0.2)[1] == 0)
    _refused(capsys, sandbox, ["--set", f"reward_model.samples_per_round={8 * problems}"],
             f"reward_model.samples_per_round {8 * problems} with sampling.samples_per_prompt 8 draws")


@pytest.mark.parametrize("extra,must", [
    (["--samples", "7", "--set", "sampling.samples_per_prompt=4"],
     "--samples=7 is invalid: must be a multiple of sampling.samples_per_prompt (4): whole groups of the policy's "
     "samples (7 would draw 8); give 4 or 8"),
    (["--samples", "3"], "--samples=3 is invalid: must be a multiple of sampling.samples_per_prompt (8)"),
    (["--set", "reward_model.samples_per_round=12"],
     "reward_model.samples_per_round=12 is invalid: must be a multiple"),
    (["--samples", "2000000"], "--samples=2000000 is invalid: must be between 1 and 1000000 (drawn at once"),
    (["--heldout-frac", "0.00001"], "--heldout-frac 1e-05 is invalid: the split is a hash of each problem's id in "
                                    "steps of 1/10,000, so it holds out no problem"),
    (["--heldout-frac", "0.99999"], "--heldout-frac 0.99999 is invalid: the split is a hash of each problem's id in "
                                    "steps of 1/10,000, so it holds out every problem"),
    (["--mc-rollouts", "100000"], "--mc-rollouts=100000 is invalid: must be <= 65536"),
], ids=["not-a-multiple", "fewer-than-a-group", "config-not-a-multiple", "samples-cap", "frac-tiny", "frac-all",
        "mc-rollouts-cap"])
def test_counts_and_fractions_refused(extra, must, sandbox, capsys):
    _refused(capsys, sandbox, extra, must)


def test_omp_num_threads_past_the_cap(sandbox, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "100000")
    _refused(capsys, sandbox, ["--set", "train.threads=0"], "OMP_NUM_THREADS=100000 is invalid: the OpenMP and MKL runtimes read it as a thread count")


def test_a_split_with_both_sides_passes(sandbox):
    """The quickstart's 1,024 samples (128 problems) leave problems on both sides: the stub is reached."""
    with pytest.raises(pytest.fail.Exception, match="sampling started"):
        main(["rm", "train", QS, "--type", "orm", "--output-dir", str(sandbox / "r")])
    train, held = cli_rm.split_sizes(_cfg(), 128, 0.2)
    assert train > 0 and held > 0
