"""bench/grpo_step.py's forced-length mode gives both contenders the same tokens per step (issue 12)."""
import importlib.util
import json
import subprocess
import sys

import pytest

from support_paths import REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed")


def test_forced_length_mode_gives_equal_token_counts_on_both_sides(tmp_path):
    out = tmp_path / "grpo_step.json"
    prompts, group, new = 2, 2, 4
    cmd = [sys.executable, str(REPO / "bench" / "grpo_step.py"), "--rounds", "1", "--warmup", "0", "--steps", "1",
           "--prompts", str(prompts), "--group", str(group), "--max-new-tokens", str(new), "--threads", "1",
           "--length", "forced", "--trl-settings", "", "--model", "hidden_size=32", "--model", "num_layers=1",
           "--model", "num_heads=2", "--model", "intermediate_size=64", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())["settings_results"]["1t-forced"]
    want = prompts * group * new  # every row decodes exactly max_new_tokens
    for side in ("ours", "trl"):
        steps = [s for r in res["raw"][side] for s in r["steps"]]
        assert steps and all(s["tokens"] == want for s in steps), (side, [s["tokens"] for s in steps])
    assert res["compare"]["trl"]["tokens_equal"] is True
    assert res["compare"]["trl"]["tokens"] == [want, want]
