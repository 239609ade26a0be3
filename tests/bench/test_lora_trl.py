"""bench/lora_trl.py at its tiniest shape (the tiny model with LoRA rank 2, 1 round, 1 step, 1 thread; ours in
portable numerics, TRL in native): both sides train the same adapters (trainable parameters by hand), on the same
prompts and equal token counts, with the adapter-off reference, and every reported figure is there (issue 47.5)."""
import importlib.util
import json
import math
import subprocess
import sys

import pytest

from support_paths import REPO

pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("trl", "peft")),
                                reason="trl and peft are not installed")

H, I, L, R = 32, 64, 1, 2  # hidden, MLP width, layers, LoRA rank


def test_tiny_lora_contest_reports_equal_work_and_its_figures(tmp_path):
    out = tmp_path / "lora_trl.json"
    prompts, group, new = 2, 2, 4
    cmd = [sys.executable, str(REPO / "bench" / "lora_trl.py"), "--model", "tiny", "--tiny", f"hidden_size={H}",
           "--tiny", f"num_layers={L}", "--tiny", "num_heads=2", "--tiny", f"intermediate_size={I}",
           "--rank", str(R), "--alpha", "4", "--prompts", str(prompts), "--group", str(group),
           "--max-new-tokens", str(new), "--micro-batch", str(prompts * group), "--rounds", "1", "--warmup", "0",
           "--steps", "1", "--threads", "1", "--numerics", "portable", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res["summary"]) == {"ours-portable", "trl"}  # ours portable, TRL native (the defaults)
    adapters = L * R * (4 * (H + H) + 2 * (H + I) + (I + H))  # q, k, v, o; gate, up; down: r x (in + out) each
    want = prompts * group * new  # every row decodes exactly max_new_tokens
    for c, s in res["summary"].items():
        (raw,) = res["raw"][c]
        assert raw["trainable"] == adapters, c
        assert raw["numerics"] == ("native" if c == "trl" else c.split("-")[1])
        assert s["median_tokens_per_step"] == want and s["tokens_per_step_min_max"] == [want, want], c
        assert s["median_step_seconds"] > 0 and s["median_gflop_per_step"] > 0, c
        assert math.isfinite(s["x_floor"]) and s["x_floor"] > 0, c
        assert s["median_peak_above_base_mb"] > 0 and s["median_peak_rss_mb"] > s["median_baseline_rss_mb"], c
        assert raw["train_peak_rss_mb"] > raw["baseline_rss_mb"], c  # the steps' own peak, the load left out
        assert s["phase_median_seconds"]["reference"] > 0, c  # both run the adapter-off reference pass
    assert res["raw"]["trl"][0]["reference"] == "policy under disable_adapter"
    assert res["raw"]["ours-portable"][0]["reference"] == "AdapterOffView"
    assert res["common_floor_seconds"] > 0
    cmp = res["compare"]["ours-portable"]
    assert cmp["tokens_equal"] and cmp["prompt_tokens_equal"] and cmp["prompts_equal"], cmp
    assert cmp["time_ratio"] > 0 and cmp["memory_ratio"] > 0 and cmp["flop_ratio"] > 0
    assert "ours-portable/trl s/step" in proc.stdout and "prompt texts equal" in proc.stdout
