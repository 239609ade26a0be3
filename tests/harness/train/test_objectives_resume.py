"""The objectives added in issue 45 survive a stop and a resume bit for bit (issue 48, item 7): a tiny run of each
preset stopped when stage 2 would start and resumed writes the same metrics rows (timings aside) and the same final
weights as the same run uninterrupted. DAPO's dynamic sampling draws extra prompts from a stream keyed by stage and
draw, so its resumed stages must draw exactly what the uninterrupted run drew; the rewards are made to vary (1 where the
completion's character codes sum to a multiple of 3), so every objective has mixed groups to learn from and DAPO
uniform ones to drop."""
from __future__ import annotations

import json

import pytest
import torch
from tiny_runs import TINY_RUN, run_result, stop_before_stage  # tests/support

from harness.config.schema import load_config
from harness.train import loop

QUICKSTART = "harness/configs/quickstart.yaml"


def _parity(task, reps, ro, prm=None):
    return torch.tensor([float(sum(map(ord, c)) % 3 == 0) for c in ro.completions]), []


@pytest.fixture(autouse=True)
def varied_rewards(monkeypatch):
    monkeypatch.setattr(loop, "score", _parity)


def _cfg(root, preset):
    return load_config(QUICKSTART, TINY_RUN + [f"output_dir={root}", f"warmup.cache_dir={root}/wc", "train.lr=0.01",
                                               "train.save_final_model=true", "sampling.samples_per_prompt=4",
                                               "train.prompts_per_step=4", f"algorithm={preset}"])


@pytest.mark.parametrize("preset", ["dapo", "gspo", "cispo", "reinforce_pp", "lite_ppo"])
def test_a_stopped_and_resumed_run_equals_the_uninterrupted_one(tmp_path, preset):
    whole = _cfg(tmp_path / "whole", preset)
    loop.train(whole, progress=False)
    want = run_result(whole)
    assert len([r for r in want[0] if "loss" in r or "train/loss" in r]) >= 1  # it trained
    stopped = _cfg(tmp_path / "stopped", preset)
    stop_before_stage(stopped, 2)
    loop.train(stopped, progress=False)
    got = run_result(stopped)
    summary = json.loads((loop.run_dir(stopped) / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["resumed_from_step"] == 2
    assert got == want
    if preset == "dapo":
        drawn = [r["rollout/samples_drawn"] for r in want[0] if "rollout/samples_drawn" in r]
        used = [r["rollout/samples_used"] for r in want[0] if "rollout/samples_used" in r]
        assert len(drawn) == 4 and sum(drawn) > sum(used)  # groups were dropped and drawn again, resumed alike
