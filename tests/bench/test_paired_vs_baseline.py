"""bench/paired_vs_baseline.py against a hand computation: per-seed mean differences, the seed term s^2/n and the
test set's term sigma_b^2 / P of a two-way decomposition written out here, the t half-width."""
import json
import sys

import numpy as np
import pytest
from scipy import stats

from support_paths import REPO

sys.path.insert(0, str(REPO / "bench"))
import paired_vs_baseline as pvb  # noqa: E402


def _run(root, arm, seed, correct, config=None, name=None):
    """A finished run folder as far as the report's reader looks: the evaluation rows, the summary's final
    accuracy, the start's and the final evaluation's per-problem records (and the validation half's)."""
    d = root / (name or f"{arm}-s{seed}-x")
    (d / "eval").mkdir(parents=True)
    acc = float(np.mean(correct))
    cfg = {"seed": seed, "algorithm": {"name": arm}, **(config or {})}
    (d / "summary.json").write_text(json.dumps({
        "run_id": d.name, "algorithm": arm, "seed": seed, "status": "finished", "config": cfg,
        "budget": {"unit": "steps", "amount": 8, "consumed": {"steps": 8}},
        "initial_eval": {"eval/arith/acc": 0.0}, "final_eval": {"eval/arith/acc": acc}}))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "eval/arith/acc": v}) + "\n"
                                             for k, v in ((0, 0.0), (8, acc))))
    (d / "eval" / "arith_0.jsonl").write_text("".join(  # the start: not the final evaluation
        json.dumps({"id": f"p{i}", "greedy": {"correct": False}}) + "\n" for i in range(len(correct))))
    (d / "eval" / "arith_validation.jsonl").write_text("")
    (d / "eval" / "arith_8.jsonl").write_text("".join(
        json.dumps({"id": f"p{i}", "greedy": {"correct": bool(c)}}) + "\n" for i, c in enumerate(correct)))


def test_interval_equals_a_hand_computation(tmp_path, capsys):
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2, size=(3, 40))
    arm = rng.integers(0, 2, size=(3, 40))
    for s in range(3):
        _run(tmp_path, "grpo", s, base[s])
        _run(tmp_path, "dapo", s, arm[s])
    assert pvb.main([str(tmp_path), "--baseline", "grpo"]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    d = 100.0 * (arm - base)                                   # seeds x problems
    means = d.mean(1)
    resid = d - d.mean(1, keepdims=True) - d.mean(0, keepdims=True) + d.mean()
    ms_e = (resid ** 2).sum() / (2 * 39)
    sb2 = max(0.0, d.mean(0).var(ddof=1) - ms_e / 3)
    se = np.sqrt(means.var(ddof=1) / 3 + sb2 / 40)
    assert row[0] == "dapo" and row[1] == "3"
    assert float(row[5]) == pytest.approx(means.mean(), abs=0.005)
    assert float(row[7]) == pytest.approx(np.sqrt(sb2 / 40), abs=0.005)
    assert float(row[9]) == pytest.approx(stats.t.ppf(0.975, 2) * se, abs=0.005)


def test_an_unknown_baseline_is_named(tmp_path, capsys):
    _run(tmp_path, "grpo", 0, [1, 0])
    with pytest.raises(SystemExit):
        pvb.main([str(tmp_path), "--baseline", "ppo"])
    assert "--baseline 'ppo': no finished run of it" in capsys.readouterr().err


def test_arms_by_config_keys_with_defaults_filled_in(tmp_path, capsys):
    """--arm: runs told apart by config values; a file that leaves train.staleness out is the default (0), and the
    algorithm's correction is read resolved (none where the config names none)."""
    rng = np.random.default_rng(2)
    base, late = rng.integers(0, 2, size=(2, 30)), rng.integers(0, 2, size=(2, 30))
    for s in range(2):
        _run(tmp_path, "grpo", s, base[s], name=f"grpo-s{s}-a")
        _run(tmp_path, "grpo", s, late[s], config={"train": {"staleness": 4},
                                                   "algorithm": {"name": "grpo", "correction": "token_tis"}},
             name=f"grpo-s{s}-b")
    assert pvb.main([str(tmp_path), "--arm", "train.staleness", "--arm", "algorithm.correction",
                     "--baseline", "train.staleness=0,algorithm.correction=none"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 2
    row = rows[1].split()
    assert row[0] == "train.staleness=4,algorithm.correction=token_tis" and row[1] == "2"
    assert float(row[4]) == pytest.approx(100 * (late - base).mean(), abs=0.005)


def test_where_keeps_only_the_runs_with_that_value(tmp_path, capsys):
    """--where: the corrections compared at one staleness; runs at another staleness are not arms at all."""
    rng = np.random.default_rng(3)
    for s in range(2):
        for k, corr, name in ((0, "none", "a"), (8, "none", "b"), (8, "token_tis", "c")):
            algo = {"name": "grpo", "correction": corr}
            _run(tmp_path, "grpo", s, rng.integers(0, 2, 20), config={"train": {"staleness": k}, "algorithm": algo},
                 name=f"grpo-s{s}-{name}")
    argv = [str(tmp_path), "--arm", "algorithm.correction", "--baseline", "algorithm.correction=none"]
    assert pvb.main(argv + ["--where", "train.staleness=8"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[0] for r in rows[1:]] == ["algorithm.correction=token_tis"]
    with pytest.raises(SystemExit, match="two finished runs of arm algorithm.correction=none seed 0"):
        pvb.main(argv)   # without the filter k = 0 and k = 8 would be one arm


def test_an_unknown_config_key_is_named(tmp_path):
    _run(tmp_path, "grpo", 0, [1, 0])
    with pytest.raises(SystemExit, match="train.stalenes: a run config has no field 'stalenes'"):
        pvb.main([str(tmp_path), "--arm", "train.stalenes", "--baseline", "x"])
