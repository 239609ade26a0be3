"""DeepSpeed ZeRO-2 / ZeRO-3 (and plain DDP) through harness.engine.distributed, for real, on CPU:
two ranks under torchrun over gloo (``DS_ACCELERATOR=cpu``), a tiny Llama, a few
optimizer steps with two micro-batches each (tests/sweep_zero_worker.py).

Checked per mode: the loss goes down; both ranks end with identical (gathered)
parameters; those parameters, the per-step losses and the logits of the gathered model
match a single-process run on the union of both ranks' data (so sharding, gradient
averaging, accumulation boundaries and clipping are right); training goes on after the
ZeRO-3 gather-for-sampling context; save_state / load_state restores the weights.

The first run on a machine compiles DeepSpeed's shared-memory op into
~/.cache/torch_extensions (~90 s); later runs take ~30 s on 2 cores.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import support_paths

pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")

REPO = support_paths.REPO
MODES = ("zero2", "zero3", "ddp")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
               TORCH_CPP_LOG_LEVEL="ERROR")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(support_paths.SUPPORT / "sweep_zero_worker.py"), ",".join(MODES), str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=420, cwd=out)
    tail = (p.stdout + p.stderr)[-6000:]
    assert p.returncode == 0, tail
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    yield ranks
    shutil.rmtree(out, ignore_errors=True)


@pytest.mark.parametrize("mode", MODES)
def test_two_ranks_train_like_one_process(results, mode):
    r0, r1 = results[0][mode], results[1][mode]
    assert (r0["rank"], r1["rank"], r0["world"], r1["world"]) == (0, 1, 2, 2)
    assert r0["engine"] == ("DistributedDataParallel" if mode == "ddp" else "DeepSpeedEngine")
    for r in (r0, r1):
        losses = r["losses"]
        assert losses[-1] < losses[0] - 1.0, losses                     # it learns
        assert all(b < a for a, b in zip(losses, losses[1:])), losses
        # every step's loss (averaged over ranks) is the single-process loss
        assert max(abs(a - b) for a, b in zip(losses, r["ref_losses"])) < 1e-4
        assert r["n_params"] == r["ref_n_params"] > 20_000               # gathered: the full model
        assert r["max_param_diff_vs_reference"] < 1e-5
        assert r["max_logit_diff_vs_reference"] < 1e-4
        assert r["moved_after_extra_step"] > 1e-3                        # trains after the gather context
        assert r["diff_after_load_state"] == 0.0                         # checkpoint round-trip
    # both ranks hold the same parameters
    assert r0["param_sum"] == r1["param_sum"] and r0["param_sqsum"] == r1["param_sqsum"]
    assert r0["param_sums_all_ranks"] == r1["param_sums_all_ranks"] == [r0["param_sum"]] * 2
    # full state dict on the main process (ZeRO-3 consolidates it there only)
    assert r0["state_dict_keys"] == 21
    assert r1["state_dict_keys"] == (None if mode == "zero3" else 21)


def test_deepspeed_config_resolution():
    from harness.engine.distributed import DEEPSPEED_DIR, deepspeed_config
    c2 = deepspeed_config(2, micro_batch_size=4, max_grad_norm=0.5, dtype="bfloat16")
    assert c2["zero_optimization"]["stage"] == 2 and c2["train_micro_batch_size_per_gpu"] == 4
    assert c2["gradient_accumulation_steps"] == 1 and c2["gradient_clipping"] == 0.5
    assert c2["bf16"]["enabled"] is True and c2["fp16"]["enabled"] is False
    c3 = deepspeed_config(3, hidden_size=64, cpu=True)
    zo = c3["zero_optimization"]
    assert (zo["stage"], zo["reduce_bucket_size"], zo["stage3_param_persistence_threshold"]) == (3, 4096, 640)
    assert zo["overlap_comm"] is False and zo["stage3_gather_16bit_weights_on_model_save"] is True
    assert "auto" not in json.dumps(c3) and "_comment" not in c3
    for stage in (2, 3):   # the shipped files are valid JSON naming their stage
        raw = json.loads((DEEPSPEED_DIR / f"zero{stage}.json").read_text())
        assert raw["zero_optimization"]["stage"] == stage
    with pytest.raises(ValueError, match="zero_stage must be 2 or 3"):
        deepspeed_config(1)


def test_single_process_mode_is_plain_torch(monkeypatch):
    import torch
    from harness.engine.distributed import Distributed
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HARNESS_ZERO_STAGE", "3")
    d = Distributed.from_env(max_grad_norm=1.0, cpu=True)
    assert d.mode == "single" and d.zero_stage is None and d.is_main and d.world_size == 1
    model = torch.nn.Linear(4, 1)
    model, opt = d.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = torch.cat([p.detach().clone().reshape(-1) for p in model.parameters()])
    for i in range(2):
        with d.accumulate(model, last=i == 1):
            d.backward(model, (model(torch.ones(2, 4)) ** 2).mean() * 100)
    gn = d.step(model, opt)
    assert gn is not None and gn > 1.0                     # pre-clip norm reported
    delta = (torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - before).norm().item()
    assert abs(delta - 0.1) < 1e-5                          # clipped to norm 1, lr 0.1
    assert model.weight.grad is None
    assert d.shard([1, 2, 3]) == [1, 2, 3] and d.mean({"a": 2.0}) == {"a": 2.0}
    with d.gathered(model) as m:
        assert m is model
