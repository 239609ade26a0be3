"""LoRA against full fine-tuning: seconds per training step and memory, on the tiny model or SmolLM2.

    python bench/lora_step.py --model tiny --rounds 2 --steps 4            # the quickstart's model and step shape
    python bench/lora_step.py --model smollm2 --rounds 1 --steps 2 --algorithm grpo
    python bench/lora_step.py --model tiny --algorithm ppo --rank 8 --json out.json

Each measurement is a fresh worker process (``--worker full|lora``; contenders alternate within a round
and the order flips every round), so peak RSS is the worker's own. A worker builds the starting policy
(tiny: ``harness/configs/quickstart.yaml``'s model, random init, seed 0; smollm2: the de-quantised
SmolLM2-135M-Instruct of ``harness/configs/gsm8k_smollm2.yaml``), applies ``model.lora`` (rank ``--rank``,
alpha ``--alpha``, all seven linear layers) for ``lora``, builds the reference (and PPO's critic) with
``harness.train.stage.build_models``, then runs ``--warmup`` + ``--steps`` trainer stages
(``run_stage``: sample, score with the task's grader, ``Learner.step``). Every row decodes exactly
``max_new_tokens`` tokens (``NoStopTokenizer``), so both contenders do equal sampling work.

Reported per contender: median step seconds (and its phases: generate, reference, policy_forward,
backward, optimizer), trainable parameters, the bytes of distinct parameter storage held by policy,
reference and critic together (a tensor shared by two models counted once), the bytes of optimizer
state after the last step, and peak RSS (VmHWM) of the worker, load included.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _common import ROOT, NoStopTokenizer, fmt, loadavg, median, print_table, run_rounds, vm_hwm_mb
import torch

from evals.catalog import get_task
from harness.config.schema import load_config
from harness.engine.learner import Learner
from harness.engine.lora import apply_lora, trainable_count
from harness.engine.models import build_tiny_model, build_char_tokenizer, load_policy
from harness.engine.perf import PerfTracker
from harness.train.loop import score
from harness.train.stage import build_models, run_stage, stage_problems

CONFIGS = {"tiny": ROOT / "harness" / "configs" / "quickstart.yaml",
           "smollm2": ROOT / "harness" / "configs" / "gsm8k_smollm2.yaml"}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(CONFIGS), default="tiny")
    p.add_argument("--algorithm", default="grpo")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the config's)")
    p.add_argument("--group", type=int, default=None, help="G (default: the config's)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="(default: the config's)")
    p.add_argument("--steps", type=int, default=4, help="timed steps per worker")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", choices=("full", "lora"), help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _config(a, lora: bool):
    sets = [f"algorithm={a.algorithm}"]
    sets += [f"train.prompts_per_step={a.prompts}"] if a.prompts else []
    sets += [f"sampling.samples_per_prompt={a.group}"] if a.group else []
    sets += [f"sampling.max_new_tokens={a.max_new_tokens}"] if a.max_new_tokens else []
    sets += [f"model.lora.rank={a.rank}", f"model.lora.alpha={a.alpha}"] if lora else []
    return load_config(CONFIGS[a.model], sets)


def _storage_bytes(*models) -> int:
    """Bytes of distinct parameter storage over ``models`` (a tensor two of them share counts once)."""
    seen = {}
    for m in models:
        for p in (m.parameters() if m is not None else ()):
            seen[p.untyped_storage().data_ptr()] = p.untyped_storage().nbytes()
    return sum(seen.values())


def _opt_bytes(opt) -> int:
    return sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))


def worker(a) -> dict:
    cfg = _config(a, a.worker == "lora")
    dev = torch.device("cpu")
    if a.model == "tiny":
        tok = build_char_tokenizer()
        policy = build_tiny_model(cfg.model, tok, seed=0)
    else:
        policy, tok = load_policy(cfg.model.name_or_path, cfg.model.gguf_file, cfg.model.dtype)
    torch.manual_seed(cfg.seed)
    policy = apply_lora(policy, cfg.model.lora)
    models = build_models(policy, cfg.algo, dev)
    load_peak = vm_hwm_mb()  # before the tracker's phases reset the high-water mark
    perf = PerfTracker(dev)
    learner = Learner(policy, cfg.algo, cfg, dev, perf, reference=models.reference, critic=models.critic)
    task = get_task(cfg.task)
    task.bind_tokenizer(tok)
    steps = []
    perf.pop_seconds()
    for k in range(a.warmup + a.steps):
        problems = stage_problems(task, cfg.seed, k, cfg.train.prompts_per_step)
        t0 = time.perf_counter()
        st = run_stage(learner, cfg, task, tok, k, problems, score, perf=perf, sampler_tok=NoStopTokenizer(tok))
        dt = time.perf_counter() - t0
        steps.append({"seconds": dt, "phases": perf.pop_seconds(), "tokens": st.rollouts.num_tokens})
    timed = steps[a.warmup:]
    trained = [learner.policy] + ([learner.critic] if learner.critic is not None else [])
    return {"step_seconds": median([s["seconds"] for s in timed]), "step_seconds_all": [s["seconds"] for s in timed],
            "phases": {p: median([s["phases"].get(p, 0.0) for s in timed]) for p in timed[0]["phases"]},
            "tokens": median([s["tokens"] for s in timed]), "trainable": sum(trainable_count(m) for m in trained),
            "param_storage_mb": _storage_bytes(learner.policy, learner.reference, learner.critic) / 2**20,
            "optimizer_state_mb": (_opt_bytes(learner.opt) + (_opt_bytes(learner.critic_opt) if learner.critic_opt
                                                              else 0)) / 2**20,
            # the worker's peak: the load's and every phase's (PerfTracker resets VmHWM at each phase, so VmHWM read
            # here alone is the last phase's, the optimizer's: what this script reported before)
            "peak_rss_mb": max(load_peak, perf.peak_rss_mb(), vm_hwm_mb()), "load_peak_rss_mb": load_peak,
            "peak_rss_phase_mb": dict(perf.peak_rss), "load": loadavg()[0]}


def main(argv=None) -> int:
    a = parse(argv)
    if a.worker:
        Path(a.worker_out).write_text(json.dumps(worker(a)))
        return 0
    common = ["--model", a.model, "--algorithm", a.algorithm, "--rank", str(a.rank), "--alpha", str(a.alpha),
              "--steps", str(a.steps), "--warmup", str(a.warmup)]
    for flag, v in (("--prompts", a.prompts), ("--group", a.group), ("--max-new-tokens", a.max_new_tokens)):
        common += [flag, str(v)] if v else []
    errors, loads = [], []
    res = run_rounds(sys.argv[0], lambda r: ("full", "lora") if r % 2 == 0 else ("lora", "full"), common, a,
                     lambda n, r: f"{n}: {r['step_seconds']:.3f} s/step, peak RSS {r['peak_rss_mb']:.0f} MiB",
                     errors, loads)
    for e in errors:
        print(e, file=sys.stderr)
    rows = []
    for n in ("full", "lora"):
        rs = res[n]
        if not rs:
            continue
        ph = {p: median([r["phases"].get(p, 0.0) for r in rs]) for p in rs[0]["phases"]}
        rows.append([n, fmt(median([r["step_seconds"] for r in rs])), f"{rs[0]['trainable']:,}",
                     f"{rs[0]['param_storage_mb']:.1f}", f"{rs[0]['optimizer_state_mb']:.1f}",
                     f"{median([r['peak_rss_mb'] for r in rs]):.0f}",
                     " ".join(f"{p}={v:.3f}" for p, v in ph.items() if v > 0.0005)])
    if rows:
        print_table(["contender", "s/step (median)", "trainable", "params MiB", "Adam MiB",
                     "peak RSS MiB", "phases (median s)"], rows)
    print(f"loadavg at end {loadavg()}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "results": res, "errors": errors, "loads": loads},
                                           indent=1))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
