"""Where a warm-up step's time goes (issue 29): the quickstart's supervised warm-up step (harness.train.warmup's
batches, loss, backward, clip and AdamW: 64 worked solutions of the quickstart config per step, its first steps) at 1 thread:
CPU seconds per step over 10 steps after 3, the padded shape against the real tokens, then torch.profiler's op
table over 5 more steps. Run: python bench/profile_warmup.py [--threads N] [--steps N]"""
import argparse
import time

from _common import ROOT  # noqa: F401  (first: pins the process's numerics)
import torch
from torch.profiler import ProfilerActivity, profile

import harness.train.warmup as W
from evals.catalog import get_task
from harness.config.schema import load_config
from harness.engine.models import build_char_tokenizer, build_tiny_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (after 3 untimed ones)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = load_config(str(ROOT / "harness" / "configs" / "quickstart.yaml"))
    if not 1 <= a.steps <= cfg.warmup.steps - 8:
        ap.error(f"--steps {a.steps}: expected 1 to {cfg.warmup.steps - 8} (the warm-up has {cfg.warmup.steps} "
                 f"steps: 3 untimed, the timed ones, then 5 profiled)")
    task, tok = get_task(cfg.task), build_char_tokenizer()
    task.bind_tokenizer(tok)
    model = build_tiny_model(cfg.model, tok, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)
    batches = W._warmup_batches(cfg, task, tok, "cpu")   # the warm-up's own batches, in its order

    def step():
        batch = next(batches)
        loss = W.sft_loss(model, *batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return batch

    for _ in range(3):
        step()
    t0, padded, real = time.process_time(), 0, 0
    for _ in range(a.steps):
        ids, mask = step()[:2]
        padded, real = padded + ids.numel(), real + int(mask.sum())
    cpu = (time.process_time() - t0) / a.steps / a.threads
    print(f"CPU s per step per thread: {cpu:.3f}; tokens per step: {padded / a.steps:.0f} padded, "
          f"{real / a.steps:.0f} real ({padded / real:.2f}x)")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
