"""bench/recompute.py at toy size: the three recomputation modes, and selective under a memory budget that
recomputes the first layer fully, give the same loss and gradients (one digest), and selective recomputation's
backward counts no more FLOPs than no recomputation's, full's more, the budgeted mix's in between."""
import re

import pytest

import recompute  # bench/ is on pytest's pythonpath (pyproject.toml)
from harness.engine import fastlm

TOY = ["--model", "hidden_size=32", "--model", "num_layers=2", "--model", "num_heads=2",
       "--model", "intermediate_size=64", "--rows", "4", "--group", "2", "--tokens", "5", "--flops"]


def test_modes_agree_bit_for_bit_and_selective_adds_no_flops(monkeypatch, capsys):
    # the script sets these module settings; restore them after the test
    monkeypatch.setattr(fastlm, "CHECKPOINT_MIN_BYTES", fastlm.CHECKPOINT_MIN_BYTES)
    monkeypatch.setattr(fastlm, "RECOMPUTE", fastlm.RECOMPUTE)
    monkeypatch.setattr(fastlm, "RECOMPUTE_BUDGET_BYTES", fastlm.RECOMPUTE_BUDGET_BYTES)
    real_plan = fastlm.recompute_plan
    out = {}
    for mode, extra in [("none", []), ("full", []), ("selective", []), ("mixed", ["--budget", "0.08"])]:
        assert recompute.main(["--mode", "selective" if mode == "mixed" else mode, *TOY, *extra]) == 0
        assert fastlm.recompute_plan is real_plan  # the script's recording wrapper is undone
        text = capsys.readouterr().out
        layers = re.search(r"# layers \(k keep, s selective, f full\) at \d+ positions: (\w+)", text).group(1)
        assert layers == {"none": "kk", "full": "ff", "selective": "ss", "mixed": "fs"}[mode], (mode, text)
        digest = re.search(r"grads sha256 (\w+)", text).group(1)
        fwd, bwd = (int(x) for x in re.search(r"\(FLOP forward (\d+), backward (\d+)\)", text).groups())
        assert re.search(r"peak above base -?\d+ MB", text)
        out[mode] = digest, fwd, bwd
    assert out["none"][0] == out["full"][0] == out["selective"][0] == out["mixed"][0]
    assert out["none"][1] == out["full"][1] == out["selective"][1] == out["mixed"][1]
    assert out["selective"][2] == out["none"][2] < out["mixed"][2] < out["full"][2]


def test_unknown_mode_is_refused():
    with pytest.raises(SystemExit):
        recompute.main(["--mode", "half"])
