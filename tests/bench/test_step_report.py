"""bench/step_report.py (issue 29.3) in its reduced mode: ours vs TRL at the toy shape in one run, the summary's
figures in its JSON (s/step, x floor, peak above base, equal tokens); the shapes are grpo_step.py's."""
import importlib.util
import json
import subprocess
import sys

import pytest

import grpo_step  # bench/ is on pytest's pythonpath (pyproject.toml)
import step_report
from support_paths import REPO


def test_the_27m_shape_is_the_readme_command():
    g = grpo_step.parse_args(step_report.shape_argv(step_report.parse_args([]), "27m"))
    assert (g.threads, g.length, g.trl_settings, g.max_new_tokens, g.prompts, g.group, g.micro_batch) == \
        ("2", "forced", "", 128, 16, 8, 64)
    assert g.model == ["hidden_size=512", "num_layers=8", "num_heads=8", "intermediate_size=1536", "max_length=256"]
    g = grpo_step.parse_args(step_report.shape_argv(step_report.parse_args([]), "small"))
    assert (g.threads, g.max_new_tokens, g.model) == ("1", 24, [])


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed")
def test_reduced_mode_prints_ours_vs_trl_with_floor_and_memory(tmp_path):
    out = tmp_path / "report.json"
    cmd = [sys.executable, str(REPO / "bench" / "step_report.py"), "--shapes", "toy", "--rounds", "1", "--warmup",
           "0", "--steps", "1", "--no-quickstart", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "# summary" in proc.stdout and "ours/TRL" in proc.stdout
    res = json.loads(out.read_text())
    toy = res["shapes"]["toy"]
    for side in ("ours", "trl"):
        s = toy["summary"][side]
        assert s["median_step_seconds"] > 0 and s["x_floor"] > 0 and s["median_peak_above_base_mb"] > 0
    assert toy["compare"]["trl"]["tokens_equal"] is True
    assert res["cpu"] and res["numerics"].startswith("numerics: ") and "quickstart" not in res
