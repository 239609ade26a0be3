"""bench/recompute.py at toy size: the three recomputation modes give the same loss and gradients (one digest),
and selective recomputation's backward counts no more FLOPs than no recomputation's, full's more."""
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
    out = {}
    for mode in ("none", "full", "selective"):
        assert recompute.main(["--mode", mode, *TOY]) == 0
        text = capsys.readouterr().out
        digest = re.search(r"grads sha256 (\w+)", text).group(1)
        fwd, bwd = (float(x) for x in re.search(r"GFLOP forward ([\d.]+), backward ([\d.]+)", text).groups())
        assert re.search(r"peak above base -?\d+ MB", text)
        out[mode] = digest, fwd, bwd
    assert out["none"][0] == out["full"][0] == out["selective"][0]
    assert out["none"][1] == out["full"][1] == out["selective"][1]
    assert out["selective"][2] == out["none"][2] < out["full"][2]


def test_unknown_mode_is_refused():
    with pytest.raises(SystemExit):
        recompute.main(["--mode", "half"])
