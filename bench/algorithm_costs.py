"""GRPO, PPO and online RFT side by side: seconds per step and peak memory on one policy size.

Method
------
* Every algorithm runs in its own fresh worker process (``--worker NAME``) pinned to
  ``--threads`` torch threads, and uses the real pieces of the trainer: the config from
  ``harness.config.schema.load_config(None, ["algorithm=NAME", ...])``, the components from
  ``algorithms.presets.resolve``, the trainer's models (``harness.train.stage.build_models``: the
  reference, a frozen copy of the policy, only when ``algo.uses_reference``; the critic, same size as
  the policy, only when ``algo.critic``) and the trainer's stage (``harness.train.stage.run_stage``:
  sample, score, ``harness.engine.learner.Learner.step``).
* The benchmark model is larger than the default tiny model (default: hidden 384, 10 layers,
  6 heads, SwiGLU 1152, about 19M parameters; change it with ``--model KEY=VALUE``) so that
  the model's share of memory dominates; on the 0.87M default model the libraries alone
  (~350-460 MiB of RSS) would hide it. Random init, same seed in every worker.
* Memory: PerfTracker's baseline (RSS right after the imports, before any model exists),
  the peak RSS over all phases (model construction included) and the peak above that
  baseline, which is the figure compared between algorithms. Parameter memory is also
  printed: policy, reference, critic, gradients and optimizer states (AdamW keeps two fp32
  tensors per parameter, allocated at the first optimizer step).
* Rewards: a random-init model never solves an arith problem, and online RFT learns only
  from correct samples (it would skip its update and never allocate optimizer state), so by
  default (``--reward synthetic``) the first ceil(G/4) completions of every group are scored
  1 and the rest 0. Every algorithm then runs its full update path. ``--reward task`` uses the
  task's reward instead.
* Equal rollout lengths (``--length forced``, the default): every row decodes exactly
  ``--max-new-tokens`` tokens for every algorithm (the sampler gets a tokenizer whose EOS id is
  no token's id, ``bench/_common.py``'s ``NoStopTokenizer``); ``--length eos`` stops rows at EOS as
  the trainer does. Tokens per step are printed per algorithm.
* Allocator: the workers run with ``MALLOC_ENV`` of ``bench/_common.py`` (``MALLOC_TRIM_THRESHOLD_=0``,
  ``MALLOC_MMAP_THRESHOLD_=65536``) so that RSS follows live memory rather than blocks glibc
  keeps after ``free``; ``--malloc default`` leaves glibc's defaults. The values are printed.
* Timing: ``--warmup`` untimed steps, then ``--steps`` timed steps, then one extra step counted
  with the FLOP counter; figures are medians over timed steps with the min-max of the
  per-round medians (algorithm order rotates each round). Every thread count of ``--threads``
  (default 1,2) is a separate set of rounds; the compute floor is the counted FLOPs at the
  sgemm roof measured at that thread count ("x floor"). The load average is printed.

Run:  python bench/algorithm_costs.py [--prompts 8 --group 8 --steps 3 --json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from _common import (MALLOC_ENV, FlopCount, NoStopTokenizer, finish, fmt, fmt_spread, loadavg,  # first: numerics
                     median, parse_threads, print_floor, print_table, run_rounds, sgemm_roof, x_floor)
import torch
import transformers  # noqa: F401  (a worker's library share goes into its baseline)
from transformers import LlamaForCausalLM  # noqa: F401

from algorithms.presets import resolve
from evals.catalog import get_task
from harness.config.schema import load_config
from harness.engine.learner import Learner
from harness.engine.models import build_char_tokenizer, build_tiny_model, num_params, param_bytes
from harness.engine.perf import PerfTracker
from harness.train.loop import score
from harness.train.stage import build_models, run_stage, stage_problems

ALGOS = ("grpo", "ppo", "rft")
TARGET = 0.6  # GRPO's peak above baseline <= 0.6 x PPO's
DEFAULT_MODEL = ["hidden_size=384", "num_layers=10", "num_heads=6", "intermediate_size=1152", "max_length=128"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algorithms", default=",".join(ALGOS), help="comma-separated algorithm names")
    ap.add_argument("--rounds", type=int, default=1, help="rounds (one process per algorithm each)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per process")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per process")
    ap.add_argument("--threads", default="1,2", help="torch threads per worker; a comma list runs each (default 1,2)")
    ap.add_argument("--length", choices=("forced", "eos"), default="forced",
                    help="forced (default): every rollout row has max_new_tokens tokens; eos: rows stop at EOS")
    ap.add_argument("--malloc", choices=("fixed", "default"), default="fixed",
                    help="fixed (default): workers run with MALLOC_TRIM_THRESHOLD_/MALLOC_MMAP_THRESHOLD_ set "
                         "(MALLOC_ENV of bench/_common.py); default: glibc's defaults")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="G: completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--model", action="append", default=None, metavar="KEY=VALUE",
                    help=f"ModelConfig field of the benchmark model (default: {' '.join(DEFAULT_MODEL)})")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config override for every algorithm, e.g. --set train.inner_epochs=2")
    ap.add_argument("--reward", choices=("synthetic", "task"), default="synthetic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", metavar="OUT", help="also write the figures to this JSON file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def model_overrides(a) -> list[str]:
    kv = DEFAULT_MODEL if a.model is None else a.model
    base = {k.split("=", 1)[0]: k for k in DEFAULT_MODEL}
    for item in kv:
        base[item.split("=", 1)[0]] = item
    return [f"model.{v}" for v in base.values()]


def overrides(a, name: str) -> list[str]:
    return [f"algorithm={name}", f"sampling.samples_per_prompt={a.group}",
            f"sampling.max_new_tokens={a.max_new_tokens}", f"train.prompts_per_step={a.prompts}",
            f"train.micro_batch_size={a.micro_batch}", f"train.threads={a.threads}", f"seed={a.seed}",
            "device=cpu", *model_overrides(a), *a.set]


def _mb(nbytes: int) -> float:
    return nbytes / 2**20


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def worker(a) -> dict:
    torch.set_num_threads(a.threads)
    perf = PerfTracker(torch.device("cpu"))  # baseline: after imports, before any model
    cfg = load_config(None, overrides(a, a.worker))
    algo = resolve(cfg.algorithm)
    task = get_task(cfg.task)
    G = cfg.sampling.samples_per_prompt
    torch.manual_seed(cfg.seed)
    with perf.phase("load"):
        tok = build_char_tokenizer()
        models = build_models(build_tiny_model(cfg.model, tok, seed=cfg.seed), algo, torch.device("cpu"))
    policy, reference, critic = models.policy, models.reference, models.critic
    learner = Learner(policy, algo, cfg, torch.device("cpu"), perf, reference=reference, critic=critic)
    perf.pop_seconds()
    n_pos = max(1, math.ceil(G / 4))

    def scorer(task_, reps, ro, prm):
        rewards, step_rewards = score(task_, reps, ro, prm)
        if a.reward == "synthetic":
            rewards = torch.tensor([1.0 if i % G < n_pos else 0.0 for i in range(len(reps))])
        return rewards, step_rewards
    stok = NoStopTokenizer(tok) if a.length == "forced" else tok
    steps = []
    flops = FlopCount()
    for k in range(a.warmup + a.steps + 1):  # the last step is counted (FLOPs), not timed
        if k == a.warmup + a.steps:
            s = perf.summary()  # memory of the timed steps, not of the counted one
            flops.start()
        problems = stage_problems(task, cfg.seed, k, cfg.train.prompts_per_step)
        t0 = time.perf_counter()
        st = run_stage(learner, cfg, task, tok, k, problems, scorer, perf=perf, sampler_tok=stok)
        dt = time.perf_counter() - t0
        ro, m = st.rollouts, st.metrics
        steps.append({"seconds": dt, "phases": perf.pop_seconds(), "tokens": ro.num_tokens,
                      "sequences": ro.num_sequences, "kept_fraction": m.get("train/kept_fraction"),
                      "skipped": bool(m.get("train/skipped", 0.0))})
    flops.stop()
    steps = steps[:-1]
    grads = sum(_tensor_bytes(p.grad) for mdl in (policy, critic) if mdl is not None for p in mdl.parameters())
    return {
        "algorithm": a.worker, "resolved": {k: getattr(algo, k) for k in ("advantage", "policy_loss", "kl_placement",
                                                                         "kl_coef", "filter", "critic")},
        "uses_reference": algo.uses_reference, "steps": steps[a.warmup:], "warmup_steps": steps[:a.warmup],
        "baseline_rss_mb": s["perf/baseline_rss_mb"], "peak_rss_mb": s["perf/peak_rss_mb"],
        "peak_above_base_mb": s["perf/peak_rss_above_base_mb"],
        "phase_peak_above_base_mb": {k.split("/")[-1]: v for k, v in s.items()
                                     if k.startswith("perf/peak_rss_above_base_mb/")},
        "params": {"policy": num_params(policy), "reference": num_params(reference) if reference is not None else 0,
                   "critic": num_params(critic) if critic is not None else 0},
        "param_mb": {"policy": _mb(param_bytes(policy)),
                     "reference": _mb(param_bytes(reference)) if reference is not None else 0.0,
                     "critic": _mb(param_bytes(critic)) if critic is not None else 0.0,
                     "grads": _mb(grads),
                     "optimizer": _mb(_tensor_bytes(learner.opt.state_dict()["state"])
                                      + (_tensor_bytes(learner.critic_opt.state_dict()["state"])
                                         if learner.critic_opt is not None else 0))},
        "threads": torch.get_num_threads(), "counted_flops": flops.total, "length": a.length,
        "malloc_env": {k: os.environ.get(k) for k in MALLOC_ENV},
    }


def summarize(rs: list[dict], roof: float) -> dict:
    steps = [s for r in rs for s in r["steps"]]
    phases = sorted({p for s in steps for p in s["phases"]})
    step_s = median([s["seconds"] for s in steps])
    gflop = median([r["counted_flops"] / 1e9 for r in rs if r.get("counted_flops")])
    return {
        "median_step_seconds": step_s,
        "round_median_step_seconds": [median([s["seconds"] for s in r["steps"]]) for r in rs],
        "phase_median_seconds": {p: median([s["phases"].get(p, 0.0) for s in steps]) for p in phases},
        "median_tokens_per_step": median([s["tokens"] for s in steps]),
        "gflop_per_step": gflop, "x_floor": x_floor(step_s, gflop, roof),
        "round_x_floor": [x_floor(median([s["seconds"] for s in r["steps"]]), gflop, roof) for r in rs],
        "median_peak_rss_mb": median([r["peak_rss_mb"] for r in rs]),
        "round_peak_above_base_mb": [r["peak_above_base_mb"] for r in rs],
        "median_peak_above_base_mb": median([r["peak_above_base_mb"] for r in rs]),
        "median_baseline_rss_mb": median([r["baseline_rss_mb"] for r in rs]),
        "param_mb": rs[0]["param_mb"], "params": rs[0]["params"], "resolved": rs[0]["resolved"],
        "skipped_steps": sum(s["skipped"] for s in steps),
        "kept_fraction": median([s["kept_fraction"] for s in steps]),
    }


def print_summary(summ: dict) -> None:
    def ph(s, *names):
        return sum(v for p, v in s["phase_median_seconds"].items() if p in names or p.startswith("critic")
                   and "critic" in names)
    print_table(
        ["algorithm", "s/step [round min-max]", "x floor", "generate", "ref", "critic", "policy f+b+opt",
         "tok/step", "GFLOP/step", "peak RSS MiB", "base", "above base [round min-max]", "kept"],
        [[n, fmt_spread(s["round_median_step_seconds"]), fmt_spread(s["round_x_floor"], ".1f"),
          fmt(s["phase_median_seconds"].get("generate")), fmt(s["phase_median_seconds"].get("reference")),
          fmt(ph(s, "critic")), fmt(ph(s, "old_logprobs", "policy_forward", "backward", "optimizer")),
          fmt(s["median_tokens_per_step"], ".0f"), fmt(s["gflop_per_step"], ".2f"), fmt(s["median_peak_rss_mb"], ".0f"),
          fmt(s["median_baseline_rss_mb"], ".0f"), fmt_spread(s["round_peak_above_base_mb"], ".0f"),
          fmt(s["kept_fraction"], ".2f")] for n, s in summ.items()])
    print("\nparameter memory (MiB, fp32):")
    print_table(["algorithm", "policy", "reference", "critic", "grads", "optimizer states", "sum",
                 "params (policy/ref/critic)"],
                [[n, *(fmt(s["param_mb"][k], ".1f") for k in ("policy", "reference", "critic", "grads", "optimizer")),
                  fmt(sum(s["param_mb"].values()), ".1f"),
                  "/".join(f"{s['params'][k] / 1e6:.2f}M" for k in ("policy", "reference", "critic"))]
                 for n, s in summ.items()])
    for n, s in summ.items():
        phs = ", ".join(f"{p} {v:.3f}" for p, v in sorted(s["phase_median_seconds"].items(), key=lambda kv: -kv[1])
                        if v > 0)
        print(f"  {n} phases (median s): {phs}")


def run_threads(a, names, common, threads: int, roof: float, errors, loads) -> dict:
    """Rounds at one thread count; prints the tables and the GRPO/PPO ratios; returns the figures."""
    print(f"\n## {threads} thread(s), sgemm roof {roof:.1f} GFLOP/s", flush=True)

    def describe(n, res):
        return (f"{n:5s}: median {median([s['seconds'] for s in res['steps']]):.3f} s/step, "
                f"peak RSS {res['peak_rss_mb']:.0f} MiB ({res['peak_above_base_mb']:.0f} above base "
                f"{res['baseline_rss_mb']:.0f})")
    results = run_rounds(__file__, lambda r: names[r % len(names):] + names[:r % len(names)],
                         [*common, "--threads", str(threads)], a, describe, errors, loads, threads=threads,
                         extra_env=MALLOC_ENV if a.malloc == "fixed" else None, tag=f"[{threads}t] ")
    summ = {n: summarize(rs, roof) for n, rs in results.items() if rs}
    out = {"summary": summ, "raw": results}
    if summ:
        print()
        print_summary(summ)
    if "grpo" in summ and "ppo" in summ:
        g, q = summ["grpo"], summ["ppo"]
        ratio = g["median_peak_above_base_mb"] / q["median_peak_above_base_mb"]
        out.update(grpo_over_ppo_peak_above_base=ratio, target=TARGET)
        print(f"\nGRPO/PPO peak above baseline: {ratio:.3f} at tokens per step GRPO {fmt(g['median_tokens_per_step'], '.0f')}"
              f", PPO {fmt(q['median_tokens_per_step'], '.0f')} ({a.length} length)   target: <= {TARGET}x -> "
              f"{'met' if ratio <= TARGET else 'not met'}")
        print(f"GRPO/PPO peak RSS (absolute): {g['median_peak_rss_mb'] / q['median_peak_rss_mb']:.3f}"
              f"; GRPO/PPO s/step: {g['median_step_seconds'] / q['median_step_seconds']:.3f}"
              f"; GRPO/PPO FLOPs: {fmt(g['gflop_per_step'] / q['gflop_per_step'])}")
    return out


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        a.threads = parse_threads(a.threads)[0]
        res = worker(a)
        res["loadavg_end"] = loadavg()
        Path(a.worker_out).write_text(json.dumps(res))
        return 0

    la0 = loadavg()
    threads_list = parse_threads(a.threads)
    names = [n.strip() for n in a.algorithms.split(",") if n.strip()]
    mcfg = load_config(None, model_overrides(a)).model
    n_params = num_params(build_tiny_model(mcfg, build_char_tokenizer(), seed=a.seed))
    malloc = (" ".join(f"{k}={v}" for k, v in MALLOC_ENV.items()) if a.malloc == "fixed" else "glibc defaults")
    print(f"# Algorithms benchmark: {', '.join(names)} | model {n_params / 1e6:.2f}M params (hidden {mcfg.hidden_size}, "
          f"layers {mcfg.num_layers}, heads {mcfg.num_heads}, inter {mcfg.intermediate_size}), random init, fp32 CPU")
    print(f"# {a.prompts} prompts x G={a.group} = {a.prompts * a.group} completions/step, {a.max_new_tokens} new "
          f"tokens ({a.length} length), micro-batch {a.micro_batch}, threads {threads_list}, reward={a.reward}, "
          f"extra: {a.set or '-'}")
    print(f"# worker allocator: {malloc}")
    print(f"# {a.rounds} round(s) x ({a.warmup} warm-up + {a.steps} timed steps + 1 FLOP-counted step), one fresh "
          f"process per algorithm | loadavg at start {la0} on {os.cpu_count()} CPUs", flush=True)
    roofs = {t: sgemm_roof(t) for t in threads_list}
    print_floor(roofs)
    common = ["--prompts", str(a.prompts), "--group", str(a.group), "--length", a.length,
              "--max-new-tokens", str(a.max_new_tokens), "--micro-batch", str(a.micro_batch),
              "--reward", a.reward, "--seed", str(a.seed), "--warmup", str(a.warmup), "--steps", str(a.steps)]
    for kv in (a.model if a.model is not None else []):
        common += ["--model", kv]
    for kv in a.set:
        common += ["--set", kv]
    errors, loads = [], [la0]
    out = {"settings": {k: v for k, v in vars(a).items() if k not in ("worker", "worker_out")},
           "model_params": n_params, "model_overrides": model_overrides(a), "loadavg_start": la0,
           "malloc_env": MALLOC_ENV if a.malloc == "fixed" else None, "sgemm_roof_gflops": roofs, "errors": errors,
           "threads": {t: run_threads(a, names, common, t, roofs[t], errors, loads) for t in threads_list}}
    out["loadavg"] = loads
    return finish(out, errors, loads, a.json)


if __name__ == "__main__":
    sys.exit(main())
