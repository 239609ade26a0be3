"""Run under ``torchrun --nproc_per_node=2`` by tests/test_sweep_zero.py (CPU, gloo,
``DS_ACCELERATOR=cpu``): a few optimizer steps of a tiny Llama through
:class:`harness.engine.distributed.Distributed` in the modes given on the command line
(``zero2,zero3`` or ``ddp``), each compared with a single-process reference trained on
the union of both ranks' data. Writes ``<out>/rank<r>.json`` with what the test asserts.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from harness.config.schema import ModelConfig  # noqa: E402
from harness.engine.distributed import Distributed  # noqa: E402
from harness.engine.models import build_char_tokenizer, build_tiny_model  # noqa: E402

# 8 sequences of equal length (no padding: the mean of micro-batch means is the batch mean)
TEXTS = ["12+34=46", "23+45=68", "31+27=58", "40+19=59", "11+22=33", "52+36=88", "61+17=78", "25+25=50"]
STEPS, MICRO, LR = 3, 2, 0.5
OUT_DIR = Path(".")
MCFG = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_length=32)


def batch(tok, texts):
    enc = tok(texts, return_tensors="pt", padding=True)
    return {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "labels": enc.input_ids}


def flat_params(module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1).cpu() for p in module.parameters()])


def reference(tok) -> tuple[torch.nn.Module, list[float]]:
    """Single process, full batch: what the 2-rank run must reproduce."""
    model = build_tiny_model(MCFG, tok, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    b = batch(tok, TEXTS)
    losses = []
    for _ in range(STEPS):
        loss = model(**b).loss
        losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        losses.append(model(**b).loss.item())
    return model, losses


def run_mode(mode: str, tok, ref_model, ref_losses) -> dict:
    from accelerate.state import AcceleratorState
    AcceleratorState._reset_state(True)  # a fresh Accelerator per mode in this process
    zero = {"zero2": 2, "zero3": 3}.get(mode)
    t0 = time.time()
    dist = Distributed(zero_stage=zero, micro_batch_size=MICRO, max_grad_norm=1.0, cpu=True if zero is None else None)
    assert dist.mode == mode, (dist.mode, mode)
    model = build_tiny_model(MCFG, tok, seed=0)
    model, opt = dist.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    # a second trained model (PPO's critic) gets its own engine
    critic = build_tiny_model(MCFG, tok, seed=1)
    critic, copt = dist.prepare(critic, torch.optim.SGD(critic.parameters(), lr=0.1))
    mine = dist.shard(TEXTS, pad=True)
    mbs = [batch(tok, mine[i:i + MICRO]) for i in range(0, len(mine), MICRO)]
    losses = []
    for _ in range(STEPS):
        tot = 0.0
        for i, mb in enumerate(mbs):
            with dist.accumulate(model, last=i == len(mbs) - 1):
                loss = model(**mb).loss / len(mbs)
                dist.backward(model, loss)
            tot += loss.item()
        dist.step(model, opt)
        losses.append(dist.mean({"loss": tot})["loss"])
    # critic: one step, only to show the second engine trains
    with dist.accumulate(critic, last=True):
        closs = critic(**mbs[0]).loss
        dist.backward(critic, closs)
    dist.step(critic, copt)
    # final loss on all data, through the collective forward (every rank: same count)
    with torch.no_grad():
        final = model(**batch(tok, TEXTS)).loss.item()
    losses.append(final)
    # sampling-style use: full weights on every rank, different numbers of forwards per rank
    probe = batch(tok, ["7+8="])
    with dist.gathered(model) as m:
        with torch.no_grad():
            logits = [m(input_ids=probe["input_ids"]).logits for _ in range(dist.rank + 1)][0]
        params = flat_params(m)
        n_params = params.numel()
    ref_params = flat_params(ref_model)
    with torch.no_grad():
        ref_logits = ref_model(input_ids=probe["input_ids"]).logits
    # checkpoint, then train on: training still works after the gathered context (ZeRO-3
    # hooks restored), and loading the checkpoint brings the saved weights back
    ckpt = OUT_DIR / f"ckpt_{mode}"
    dist.save_state(ckpt)
    with dist.accumulate(model, last=True):
        dist.backward(model, model(**mbs[0]).loss)
    dist.step(model, opt)
    with dist.gathered(model) as m:
        moved = float((flat_params(m) - params).abs().max())
    dist.load_state(ckpt)
    with dist.gathered(model) as m:
        restored = float((flat_params(m) - params).abs().max())
    sd = dist.state_dict(model)
    out = {
        "mode": mode, "seconds": time.time() - t0, "world": dist.world_size, "rank": dist.rank,
        "losses": losses, "ref_losses": ref_losses, "n_params": n_params, "ref_n_params": ref_params.numel(),
        "max_param_diff_vs_reference": float((params - ref_params).abs().max()),
        "param_sum": float(params.double().sum()), "param_sqsum": float((params.double() ** 2).sum()),
        "max_logit_diff_vs_reference": float((logits - ref_logits).abs().max()),
        "state_dict_keys": len(sd) if sd is not None else None,
        "moved_after_extra_step": moved, "diff_after_load_state": restored,
        "engine": type(model).__name__,
    }
    gathered = dist.gather_objects(out["param_sum"])
    out["param_sums_all_ranks"] = gathered
    dist.barrier()
    return out


def main() -> None:
    modes = sys.argv[1].split(",")
    global OUT_DIR
    out_dir = OUT_DIR = Path(sys.argv[2])
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    ref_model, ref_losses = reference(tok)
    results = {}
    for mode in modes:
        results[mode] = run_mode(mode, tok, ref_model, ref_losses)
    rank = int(os.environ.get("RANK", 0))
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
