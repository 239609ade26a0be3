"""bench/profile_warmup.py (issue 29): a warm-up step's CPU time, its padding against its real tokens, and the
profiler's op table, in one short run."""
import pytest

import profile_warmup  # bench/ is on pytest's pythonpath (pyproject.toml)


def test_prints_cpu_padding_and_the_op_table(capsys):
    assert profile_warmup.main(["--steps", "1"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("CPU s per step per thread:"))
    padded, real = (float(line.split(" padded")[0].split()[-1]), float(line.split(" real")[0].split()[-1]))
    assert 0 < real <= padded and f"({padded / real:.2f}x)" in line
    assert "aten::mm" in out and "Self CPU" in out


def test_more_steps_than_the_warmup_has_are_refused_before_any_work(capsys):
    with pytest.raises(SystemExit):
        profile_warmup.main(["--steps", "693"])
    assert "--steps 693: expected 1 to 692 (the warm-up has 700 steps" in capsys.readouterr().err
