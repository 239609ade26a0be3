"""One learner micro-batch's forward and backward under each layer-recomputation mode of fastlm (issue 29.2a).

    python bench/recompute.py --mode selective               # 27.3M bench shape, 64 rows x 128 tokens, 1 thread
    python bench/recompute.py --mode full --flops            # + a FLOP-counted pass (forward / backward GFLOP)
    python bench/recompute.py --mode none --rows 16 --repeat 2
    python bench/recompute.py --mode selective --budget 1024 --repeat 0 --flops   # FLOPs only, under a memory budget

The model is profile_step.py's "27m" shape (hidden 512, 8 layers, 8 heads, MLP 1,536, character vocabulary,
random init, seed 0); the batch is one micro-batch as the learner runs it: ``--rows`` rows, G = 8 rows per
arith training prompt (left-padded as the sampler pads them), every completion ``--tokens`` long (forced
length, random tokens, seed 0). The loss is the sum of the completion tokens' log-probs through
``fastlm.completion_hidden`` and ``logprobs.token_logprobs_from_hidden`` (the learner's path), backward into
every parameter. ``--mode``: ``none`` (nothing recomputed: every activation kept), ``full`` (each layer keeps
its input and is recomputed in backward), ``selective`` (each layer keeps its matmul and attention outputs,
recomputes only the cheap ops; the default of ``fastlm.RECOMPUTE``); ``full`` and ``selective`` are forced
whatever ``fastlm.checkpoint_layers`` would choose, ``selective`` without a memory budget unless ``--budget``
gives one (``fastlm.RECOMPUTE_BUDGET_BYTES``, MiB: the first layers then recomputed fully, as few as fit; the
plan, one letter per layer, is printed).

Prints: the process's RSS before the forward and its peak (VmHWM) after the last backward, in MB, and the
peak above that base; the CPU seconds (user + sys of this process) of each forward + backward; with
``--flops``, one more forward + backward under torch's FLOP counter (matmuls and attention), forward and
backward separately (``--repeat 0 --flops``: that pass only); and a SHA-256 over the loss and every
parameter's gradient after each, so that runs in separate processes can be compared bit for bit. Run it in
a fresh process per mode (peak RSS is per process); for memory figures,
``MALLOC_TRIM_THRESHOLD_=0 MALLOC_MMAP_THRESHOLD_=65536`` (``_common.MALLOC_ENV``) makes
RSS follow live memory.
"""
from __future__ import annotations

import argparse
import hashlib
import random
import time

from _common import FlopCount, loadavg, numerics_line, vm_hwm_mb  # first: numerics
import torch

from evals.catalog import get_task
from harness.config.schema import load_config
from harness.engine import fastlm, logprobs
from harness.engine.models import build_char_tokenizer, build_tiny_model, num_params

SHAPE_27M = ["hidden_size=512", "num_layers=8", "num_heads=8", "intermediate_size=1536", "max_length=256"]


def vm_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) / 1024.0
    return float("nan")


def build(a):
    cfg = load_config(None, [f"model.{kv}" for kv in (a.model or SHAPE_27M)])
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.model, tok, seed=0)
    task = get_task(cfg.task)
    problems = task.sample_train(random.Random(0), max(1, a.rows // a.group))
    prompts = [task.format_prompt(p) for p in problems for _ in range(a.group)][:a.rows]
    enc = tok(prompts, return_tensors="pt", padding=True)
    g = torch.Generator().manual_seed(0)
    comp = torch.randint(4, len(tok), (a.rows, a.tokens), generator=g)
    cmask = torch.ones_like(comp)
    return model, enc["input_ids"], enc["attention_mask"], comp, cmask


def step(model, pid, pm, cid, cm):
    h = fastlm.completion_hidden(model, pid, pm, cid, cm)
    lp = logprobs.token_logprobs_from_hidden(h, model.lm_head.weight, cid)
    loss = (lp * cm).sum() / cm.sum()
    return loss


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("none", "full", "selective"), default="selective")
    ap.add_argument("--rows", type=int, default=64, help="rows of the micro-batch (default 64, the bench's)")
    ap.add_argument("--group", type=int, default=8, help="rows per prompt (G)")
    ap.add_argument("--tokens", type=int, default=128, help="completion tokens per row")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1, help="timed forward + backward passes")
    ap.add_argument("--flops", action="store_true", help="one more pass under the FLOP counter")
    ap.add_argument("--budget", type=float, metavar="MIB", default=float("inf"),
                    help="selective: fastlm.RECOMPUTE_BUDGET_BYTES in MiB (default: none)")
    ap.add_argument("--model", action="append", default=None, metavar="KEY=VALUE",
                    help="ModelConfig override (default: the 27.3M shape)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.mode == "none":
        fastlm.CHECKPOINT_MIN_BYTES = float("inf")
    else:
        fastlm.CHECKPOINT_MIN_BYTES, fastlm.RECOMPUTE = -1, a.mode
        fastlm.RECOMPUTE_BUDGET_BYTES = a.budget * 2**20
    model, pid, pm, cid, cm = build(a)
    params = [p for p in model.parameters()]
    print(f"# {numerics_line()}\n# {num_params(model) / 1e6:.2f}M params, {a.rows} rows x (prompt {pid.shape[1]} + "
          f"{a.tokens}) tokens, mode {a.mode}, {a.threads} thread(s), loadavg {loadavg()}", flush=True)
    plans, real_plan = [], fastlm.recompute_plan

    def recorded_plan(dec, tokens):  # what completion_hidden chooses, printed once
        plans.append((tokens, real_plan(dec, tokens)))
        if len(plans) == 1:
            print(f"# layers (k keep, s selective, f full) at {tokens} positions: "
                  f"{''.join(h[0] for h in plans[0][1])}, budget {a.budget} MiB", flush=True)
        return plans[-1][1]
    fastlm.recompute_plan = recorded_plan
    try:
        base = vm_rss_mb()
        cpu = []
        for _ in range(a.repeat):
            model.zero_grad(set_to_none=True)
            t0 = time.process_time()
            loss = step(model, pid, pm, cid, cm)
            loss.backward()
            cpu.append(time.process_time() - t0)
        peak = vm_hwm_mb()

        def digest(loss):
            h = hashlib.sha256(loss.detach().numpy().tobytes())
            for p in params:
                h.update(p.grad.numpy().tobytes())
            return h.hexdigest()[:16]
        if a.repeat:
            print(f"rss before forward {base:.0f} MB, peak {peak:.0f} MB, peak above base {peak - base:.0f} MB")
            print("cpu s per forward+backward: " + ", ".join(f"{c:.2f}" for c in cpu))
            print(f"loss {loss.item():.9g}  grads sha256 {digest(loss)}")
        if a.flops:
            model.zero_grad(set_to_none=True)
            fc = FlopCount()
            fc.start()
            loss = step(model, pid, pm, cid, cm)
            fwd = fc.so_far()
            loss.backward()
            total = fc.stop()
            print(f"GFLOP forward {fwd / 1e9:.2f}, backward {(total - fwd) / 1e9:.2f}, total {total / 1e9:.2f} "
                  f"(FLOP forward {fwd}, backward {total - fwd})")
            print(f"loss {loss.item():.9g}  grads sha256 {digest(loss)} (the counted pass)")
    finally:
        fastlm.recompute_plan = real_plan
    print(f"loadavg at end {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
