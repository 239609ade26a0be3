"""Seconds per GRPO step: grpo-harness vs TRL's ``GRPOTrainer`` on the same model and settings.

Method
------
1. The parent process builds the default-config policy (``harness.config.schema.ModelConfig()``: a
   0.87M-parameter Llama with the character tokenizer, random init, seed 0) and saves it with
   ``harness.engine.models.save_policy`` to a temporary directory. Both contenders load *that*
   directory, so they start from identical weights.
2. Each measurement is a fresh worker process (``--worker ours|trl``) pinned to ``--threads``
   torch threads (also OMP/MKL env vars). A worker runs ``--warmup`` steps, then ``--steps``
   timed steps, and writes per-step figures as JSON. Contenders alternate within a round and
   the order flips every round (ours,trl / trl,ours / ...), so slow drifts of the shared
   machine's load hit both alike. Reported figures are medians over all timed steps of all
   rounds; the ratio is also given per round (paired) and as the median of those.
3. Equal settings: G = 8 completions for each of 16 prompts (128 sequences) per step, 24 new
   tokens, temperature 1, beta = 0.04 (k3 KL in the loss, reference = frozen copy),
   eps = 0.2, one optimizer step per generation batch (TRL: num_iterations=1,
   per_device_train_batch_size=64 x gradient_accumulation_steps=2 = steps_per_generation=2,
   like our micro_batch_size=64), AdamW (torch, betas 0.9/0.99, no weight decay), constant
   lr, grad-norm clip 1.0, no gradient checkpointing, fp32 on CPU, sequence-mean-token-mean
   aggregation (TRL ``loss_type="grpo"``), group-std advantage scaling. Prompts: the arith
   task's training problems (same problems in the same order for both); reward = ``task.reward``.
   Equal work (``--length``): in the *forced* mode, used for the headline ratio, every row of
   both contenders decodes exactly ``max_new_tokens`` tokens (TRL: ``min_new_tokens =
   max_new_tokens``; ours: the sampler is given a tokenizer whose EOS id is no token's id,
   :class:`bench._common.NoStopTokenizer`, so no row stops); in the *eos* mode both stop rows at
   EOS (TRL: no ``min_new_tokens``; ours: the sampler as the trainer runs it). The tokens each
   side generated and trained on per step are printed beside its time.
4. Phases. Ours: the trainer's PerfTracker phases (generate, score, reference,
   policy_forward, backward, optimizer); the step is timed around sampling + scoring +
   ``Learner.step``, exactly as ``harness.train.loop`` does. TRL: the step is the time between
   consecutive ``on_step_end`` callbacks; generate = ``GRPOTrainer._generate`` (tokenize +
   ``model.generate`` + decode), reference = ``_get_per_token_logps_and_entropies`` on the
   reference model, score+other = the rest of ``_generate_and_score_completions``,
   policy_forward = ``compute_loss``, backward = ``accelerator.backward``, optimizer = from the
   last backward to ``on_optimizer_step`` (grad clip + AdamW step, as in ours), other = rest.
5. Memory: peak RSS of the worker (ours: PerfTracker peak over phases, load included; TRL:
   VmHWM) and the same above the worker's RSS right after its imports.
6. Threads (``--threads 1,2``, default both): every thread count is a separate set of rounds.
   The compute floor of a step is its counted FLOPs at the sgemm roof measured at that thread
   count (:func:`bench._common.sgemm_roof`); every time is also printed as "x floor".
7. TRL settings a user would turn on (``--trl-settings static,paged``, forced mode only):
   ``cache_implementation="static"`` and ``use_transformers_continuous_batching=True`` (paged
   generation); each is a further contender, and its figure or its error is printed.

Run:  python bench/grpo_step.py [--rounds 3 --warmup 2 --steps 8 --threads 1,2 --length both --json out.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _common import (FlopCount, NoStopTokenizer, finish, fmt, fmt_spread, loadavg, median,  # first: numerics
                     parse_threads, print_floor, print_table, run_rounds, sgemm_roof, spread, vm_hwm_mb, x_floor)
import torch
import transformers  # noqa: F401  (in both workers' baselines)
from transformers import AutoTokenizer, LlamaForCausalLM, TrainerCallback  # noqa: F401

from algorithms.presets import resolve
from evals.catalog import get_task
from harness.config.schema import ModelConfig, TaskConfig, load_config
from harness.engine import fastlm, heap
from harness.engine.learner import Learner
from harness.engine.models import build_char_tokenizer, build_tiny_model, load_policy, num_params, save_policy
from harness.engine.perf import PerfTracker, rss_mb
from harness.train.loop import score
from harness.train.stage import build_models, run_stage, stage_problems

TARGET_RATIO = 0.6  # issue 12: ours <= 0.6x TRL's s/step at equal tokens on the 0.87M model
TRL_SETTINGS = {"static": {"cache_implementation": "static"},
                "paged": {"use_transformers_continuous_batching": True}}
"""``trl+SETTING`` contenders. ``paged`` also gets ``num_blocks`` = :func:`paged_blocks` (TRL's default,
``max_memory_percent`` 0.5, reserved 10 GiB on the 128 GiB machine and took 47 s a step here)."""
PHASES_OURS = ("generate", "score", "reference", "policy_forward", "backward", "optimizer")
PHASES_TRL = ("generate", "score+other", "reference", "policy_forward", "backward", "optimizer", "other")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (one process per contender each)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of every process")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per process")
    ap.add_argument("--threads", default="1,2", help="torch threads per worker; a comma list runs each (default 1,2)")
    ap.add_argument("--length", choices=("forced", "eos", "both"), default="both",
                    help="forced: every row decodes max_new_tokens (equal tokens, the headline ratio); eos: rows "
                         "stop at EOS; both (default): forced, then eos")
    ap.add_argument("--trl-settings", default=",".join(TRL_SETTINGS),
                    help=f"extra TRL contenders in the forced mode ({', '.join(TRL_SETTINGS)}; '' for none)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="G: completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--micro-batch", type=int, default=64, help="sequences per forward/backward (both)")
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--eps", type=float, default=0.2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", action="append", default=[], metavar="KEY=VALUE",
                    help="ModelConfig override for the benchmark model, e.g. --model hidden_size=256")
    ap.add_argument("--only", choices=("ours", "trl"), help="run one contender only")
    ap.add_argument("--no-count", action="store_true",
                    help="skip the extra FLOP-counted step of every worker (GFLOP/step and x floor print '-')")
    ap.add_argument("--recompute", choices=("default", "selective", "full", "off"), default="default",
                    help="ours: fastlm's layer recomputation in backward. default: fastlm's own rule; selective / "
                         "full: every micro-batch above fastlm.CHECKPOINT_MIN_BYTES recomputes each layer that way "
                         "(no memory budget); off: nothing recomputed")
    ap.add_argument("--recompute-budget", type=float, metavar="MIB",
                    help="ours, with --recompute default: fastlm.RECOMPUTE_BUDGET_BYTES in MiB (default: fastlm's)")
    ap.add_argument("--release-heap", choices=("on", "off"),
                    help="ours: harness.engine.heap.RELEASE_FREED_HEAP, glibc's malloc_trim(0) after each recomputed "
                         "layer's forward and backward (default: the module's, as in training)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per worker process")
    ap.add_argument("--json", metavar="OUT", help="also write the figures to this JSON file")
    # internal
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # ours | trl | trl+SETTING
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# workers
# ----------------------------------------------------------------------------------------------
def _overrides(a) -> list[str]:
    return ["algorithm=grpo", f"algorithm.kl_coef={a.beta}", f"algorithm.clip_eps={a.eps}",
            f"sampling.samples_per_prompt={a.group}", f"sampling.max_new_tokens={a.max_new_tokens}",
            f"sampling.temperature={a.temperature}", f"train.prompts_per_step={a.prompts}",
            f"train.micro_batch_size={a.micro_batch}", f"train.lr={a.lr}", f"train.threads={a.threads}",
            f"seed={a.seed}", "device=cpu", *[f"model.{kv}" for kv in a.model]]  # the saved model's shape


def set_recompute(mode: str, budget_mib=None) -> None:
    """``--recompute``: fastlm's layer recomputation forced to one mode (``default`` leaves fastlm's rule,
    with ``--recompute-budget`` as its memory budget if given)."""
    if mode == "off":
        fastlm.CHECKPOINT_MIN_BYTES = float("inf")
    elif mode != "default":
        fastlm.RECOMPUTE, fastlm.RECOMPUTE_BUDGET_BYTES = mode, float("inf")
    elif budget_mib is not None:
        fastlm.RECOMPUTE_BUDGET_BYTES = budget_mib * 2**20


def _budget() -> float:
    return fastlm.RECOMPUTE_BUDGET_BYTES


def record_plans() -> dict:
    """{plan: times}: what ``fastlm.recompute_plan`` chose for each forward under autograd (one letter per
    layer: k keep, s selective, f full)."""
    seen: dict[str, int] = defaultdict(int)
    real = fastlm.recompute_plan

    def plan(dec, tokens):
        out = real(dec, tokens)
        seen["".join(h[0] for h in out)] += 1
        return out
    fastlm.recompute_plan = plan
    return seen


def record_releases(setting) -> dict:
    """``--release-heap``: sets ``heap.RELEASE_FREED_HEAP`` (``None``: the module's); returns {"on", "calls",
    "released", "cpu_seconds"} of fastlm's ``release_freed_heap`` calls, filled as they happen."""
    if setting is not None:
        heap.RELEASE_FREED_HEAP = setting == "on"
    rec = {"on": heap.RELEASE_FREED_HEAP, "calls": 0, "released": 0, "cpu_seconds": 0.0}
    real = fastlm.release_freed_heap

    def release():
        c0 = time.process_time()
        out = real()
        rec["calls"] += 1
        rec["released"] += bool(out)
        rec["cpu_seconds"] += time.process_time() - c0
        return out
    fastlm.release_freed_heap = release
    return rec


def worker_ours(a) -> dict:
    torch.set_num_threads(a.threads)
    set_recompute(a.recompute, a.recompute_budget)
    plans = record_plans()
    releases = record_releases(a.release_heap)
    perf = PerfTracker(torch.device("cpu"))  # baseline RSS: right after the imports
    cfg = load_config(None, _overrides(a))
    algo = resolve(cfg.algorithm)
    task = get_task(cfg.task)
    torch.manual_seed(cfg.seed)
    with perf.phase("load"):
        policy, tok = load_policy(a.model_dir)
        models = build_models(policy, algo, torch.device("cpu"))
    learner = Learner(policy, algo, cfg, torch.device("cpu"), perf, reference=models.reference, critic=models.critic)
    stok = NoStopTokenizer(tok) if a.length == "forced" else tok  # forced: no row stops at EOS
    perf.pop_seconds()
    steps = []
    flops = FlopCount()
    counted = not a.no_count
    life: dict[str, float] = {}
    for k in range(a.warmup + a.steps + counted):  # the last step is counted (FLOPs), not timed
        if k == a.warmup + a.steps:
            flops.start()
        problems = stage_problems(task, a.seed, k, a.prompts)
        t0, c0 = time.perf_counter(), time.process_time()
        st = run_stage(learner, cfg, task, tok, k, problems, score, perf=perf, sampler_tok=stok)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        secs = perf.pop_seconds()
        ro = st.rollouts
        steps.append({"seconds": dt, "cpu_seconds": dc, "phases": secs, "tokens": ro.num_tokens,
                      "phase_peak_rss_mb": {p: perf.peak_rss[p] for p in secs if p in perf.peak_rss},
                      "decode_steps": int(ro.completion_ids.shape[1]), "sequences": ro.num_sequences,
                      "reward_mean": st.rewards.mean().item()})
        for p in secs:  # the next step's phase peaks are its own (the lifetime ones: phase_peak_rss_mb below)
            life[p] = max(life.get(p, 0.0), perf.peak_rss.pop(p, 0.0))
    flops.stop()
    perf.peak_rss.update({p: max(v, perf.peak_rss.get(p, 0.0)) for p, v in life.items()})
    s = perf.summary()
    pre = "perf/peak_rss_mb/"
    return {"contender": "ours", "steps": steps[a.warmup:a.warmup + a.steps], "warmup_steps": steps[:a.warmup],
            "counted_step": {"flops": flops.total, "tokens": steps[-1]["tokens"]} if counted else None,
            "baseline_rss_mb": s["perf/baseline_rss_mb"], "peak_rss_mb": s["perf/peak_rss_mb"],
            "phase_peak_rss_mb": {k[len(pre):]: v for k, v in s.items() if k.startswith(pre)},
            "recompute": a.recompute, "recompute_budget_bytes": _budget(), "recompute_plans": dict(plans),
            "heap_releases": releases,
            "cpu_seconds": time.process_time(),
            "params": num_params(policy), "threads": torch.get_num_threads(), "length": a.length}


def _trl_config(a, B: int, accum: int) -> dict:
    """GRPOConfig fields: the shared settings, the length mode, and the ``trl+SETTING`` extras."""
    wanted = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), report_to="none", save_strategy="no",
        logging_strategy="no", logging_steps=10**9, disable_tqdm=True, use_cpu=True, bf16=False, fp16=False,
        use_vllm=False, gradient_checkpointing=False, max_steps=a.warmup + a.steps + 1, learning_rate=a.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.99,
        optim="adamw_torch", max_grad_norm=1.0, per_device_train_batch_size=B // accum,
        gradient_accumulation_steps=accum, steps_per_generation=accum, num_iterations=1,
        num_generations=a.group, max_completion_length=a.max_new_tokens, temperature=a.temperature,
        top_p=1.0, top_k=0, beta=a.beta, epsilon=a.eps, loss_type="grpo", scale_rewards="group",
        mask_truncated_completions=False, shuffle_dataset=False, seed=a.seed, dataloader_num_workers=0,
        dataloader_pin_memory=False, remove_unused_columns=False, log_completions=False,
        disable_dropout=True,
    )
    if a.length == "forced":
        wanted["generation_kwargs"] = {"min_new_tokens": a.max_new_tokens}
    setting = a.worker.partition("+")[2]
    if setting:
        wanted.update(TRL_SETTINGS[setting])
    if setting == "paged":  # a KV pool for the whole batch, not TRL's default of half the machine's memory
        wanted["transformers_continuous_batching_config"] = {"num_blocks": paged_blocks(a, B)}
    return wanted


def paged_blocks(a, B: int) -> int:
    """KV blocks (256 tokens each) for every row at once, prompts taken as up to 128 tokens."""
    return B * -(-(128 + a.max_new_tokens) // 256) + 4


def _trl_timers(trainer, T: dict, marks: dict, shapes: list) -> None:
    """Wrap the trainer's phases so that their seconds add up in ``T`` (see the module docstring). With a PEFT
    model and no reference model (TRL's LoRA path: the reference is the policy under ``disable_adapter``), the
    reference is the log-prob pass inside ``_generate_and_score_completions`` (the only one there while
    ``gradient_accumulation_steps`` is a multiple of ``steps_per_generation x num_iterations``, as here)."""
    ref = getattr(trainer, "ref_model", None)
    adapter_off_ref = ref is None and getattr(trainer, "beta", 0.0) != 0.0 and hasattr(trainer.model, "peft_config")
    inside = {"gen_and_score": False}

    def timed(obj, name, key, when=None, after=None, flag=None):
        orig = getattr(obj, name)

        def wrapper(*args_, **kw):
            t0 = time.perf_counter()
            if flag:
                inside[flag] = True
            try:
                return orig(*args_, **kw)
            finally:
                t1 = time.perf_counter()
                if flag:
                    inside[flag] = False
                if when is None or when(args_, kw):
                    T[key] += t1 - t0
                if after is not None:
                    after(t1)
        setattr(obj, name, wrapper)

    def is_reference(args_, kw) -> bool:
        if adapter_off_ref:
            return inside["gen_and_score"]
        return ref is not None and (args_[0] if args_ else kw.get("model")) is ref

    timed(trainer, "_generate", "generate")
    timed(trainer, "_generate_and_score_completions", "_gen_and_score", flag="gen_and_score")
    timed(trainer, "_get_per_token_logps_and_entropies", "reference", when=is_reference)
    timed(trainer, "compute_loss", "policy_forward")
    orig_cl = trainer.compute_loss

    def compute_loss_probe(model_, inputs, *args_, **kw):
        if not shapes:
            shapes.append([list(inputs["prompt_ids"].shape), list(inputs["completion_ids"].shape)])
        return orig_cl(model_, inputs, *args_, **kw)
    trainer.compute_loss = compute_loss_probe
    timed(trainer.accelerator, "backward", "backward", after=lambda t: marks.__setitem__("last_backward_end", t))


def _trl_step_timer(a, T: dict, marks: dict, steps: list, gen_tokens: list, flops, B: int):
    """A TrainerCallback: one entry in ``steps`` per optimizer step; FLOPs counted in the extra last step."""
    n_steps = a.warmup + a.steps
    state = {"t": None}

    class StepTimer(TrainerCallback):
        def on_train_begin(self, args_, st, control, **kw):
            state["t"] = time.perf_counter()

        def on_optimizer_step(self, args_, st, control, **kw):
            if marks["last_backward_end"] is not None:
                T["optimizer"] += time.perf_counter() - marks["last_backward_end"]

        def on_step_end(self, args_, st, control, **kw):
            now = time.perf_counter()
            total = now - state["t"]
            ph = dict(T)
            gs = ph.pop("_gen_and_score", 0.0)
            ph["score+other"] = max(gs - ph.get("generate", 0.0) - ph.get("reference", 0.0), 0.0)
            ph["other"] = max(total - gs - ph.get("policy_forward", 0.0) - ph.get("backward", 0.0)
                              - ph.get("optimizer", 0.0), 0.0)
            steps.append({"seconds": total, "phases": ph, "tokens": gen_tokens[-1] if gen_tokens else None,
                          "decode_steps": a.max_new_tokens, "sequences": B})
            T.clear()
            marks["last_backward_end"] = None
            if len(steps) == n_steps:  # bracket the extra step with the FLOP counter
                flops.start()
            elif len(steps) == n_steps + 1:
                flops.stop()
            state["t"] = time.perf_counter()
    return StepTimer()


def worker_trl(a) -> dict:
    torch.set_num_threads(a.threads)
    import datasets  # noqa: F401  (optional: the eval and test extras)
    import trl  # optional: the bench extra
    from trl import GRPOConfig, GRPOTrainer

    datasets.disable_progress_bars()
    baseline = rss_mb()
    task = get_task(TaskConfig())
    n_steps = a.warmup + a.steps
    # one more step than timed: the last one is counted (FLOPs), not timed
    problems = [p for k in range(n_steps + 1) for p in stage_problems(task, a.seed, k, a.prompts)]
    ds = datasets.Dataset.from_dict({"prompt": [task.format_prompt(p) for p in problems],
                                     "pid": list(range(len(problems)))})
    tok = AutoTokenizer.from_pretrained(a.model_dir, local_files_only=True)
    tok.padding_side = "left"
    eos = tok.eos_token_id
    gen_tokens: list[int] = []

    def arith_reward(prompts, completions, completion_ids, pid, **kw):
        gen_tokens.append(sum(len(c) for c in completion_ids))
        return [task.reward(c, problems[i], bool(ids) and ids[-1] == eos)
                for c, i, ids in zip(completions, pid, completion_ids)]

    B = a.prompts * a.group
    accum = max(1, B // a.micro_batch)
    wanted = _trl_config(a, B, accum)
    params = inspect.signature(GRPOConfig).parameters
    dropped = sorted(k for k in wanted if k not in params)
    if a.worker != "trl" and any(k in dropped for k in TRL_SETTINGS[a.worker.partition("+")[2]]):
        raise SystemExit(f"{a.worker}: TRL {trl.__version__}'s GRPOConfig has no {dropped}")
    args = GRPOConfig(**{k: v for k, v in wanted.items() if k in params})
    T: dict[str, float] = defaultdict(float)
    marks = {"last_backward_end": None}
    trainer = GRPOTrainer(model=a.model_dir, reward_funcs=arith_reward, args=args, train_dataset=ds,
                          processing_class=tok)
    shapes: list = []
    _trl_timers(trainer, T, marks, shapes)
    steps: list[dict] = []
    flops = FlopCount()
    trainer.add_callback(_trl_step_timer(a, T, marks, steps, gen_tokens, flops, B))
    trainer.train()
    model = trainer.model
    flops.stop()
    return {"contender": a.worker, "trl_version": trl.__version__, "steps": steps[a.warmup:n_steps],
            "counted_step": {"flops": flops.total, "tokens": steps[-1]["tokens"] if steps else None},
            "warmup_steps": steps[:a.warmup], "baseline_rss_mb": baseline, "peak_rss_mb": vm_hwm_mb(),
            "params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads(),
            "dropped_config_fields": dropped, "has_reference": getattr(trainer, "ref_model", None) is not None,
            "accumulation": accum, "per_device_batch": B // accum, "loss_input_shapes": shapes, "length": a.length,
            "gradient_checkpointing": bool(getattr(model, "is_gradient_checkpointing", False)),
            "attn_implementation": getattr(model.config, "_attn_implementation", None), "dtype": str(model.dtype)}


# ----------------------------------------------------------------------------------------------
# parent
# ----------------------------------------------------------------------------------------------
def summarize(results: list[dict], phases, roof: float) -> dict:
    steps = [s for r in results for s in r["steps"]]
    gen = [s["phases"].get("generate") for s in steps]
    toks = [s["tokens"] / s["phases"]["generate"] for s in steps
            if s.get("tokens") and s["phases"].get("generate")]
    gflop = median([r["counted_step"]["flops"] / 1e9 for r in results
                    if (r.get("counted_step") or {}).get("flops")])
    step_s = median([s["seconds"] for s in steps])
    return {
        "median_step_seconds": step_s,
        "phase_median_seconds": {p: median([s["phases"].get(p, 0.0) for s in steps]) for p in phases},
        "median_gen_tokens_per_s": median(toks),
        "median_tokens_per_step": median([s.get("tokens") for s in steps]),
        "tokens_per_step_min_max": list(spread([s.get("tokens") for s in steps])[1:]),
        "median_peak_rss_mb": median([r["peak_rss_mb"] for r in results]),
        "median_peak_above_base_mb": median([r["peak_rss_mb"] - r["baseline_rss_mb"] for r in results]),
        "median_baseline_rss_mb": median([r["baseline_rss_mb"] for r in results]),
        "round_median_step_seconds": [median([s["seconds"] for s in r["steps"]]) for r in results],
        "timed_steps": len(steps),
        "median_generate_seconds": median(gen),
        "median_gflop_per_step": gflop,
        "sgemm_roof_gflops": roof,
        "x_floor": x_floor(step_s, gflop, roof),
        "round_x_floor": [x_floor(median([s["seconds"] for s in r["steps"]]), gflop, roof) for r in results],
    }


def _label(c: str, results: dict) -> str:
    if c == "ours":
        return "ours"
    v = (results.get(c) or [{}])[0].get("trl_version", "")
    return f"trl {v}{' ' + c.partition('+')[2] if '+' in c else ''}"


def print_setting(summ: dict, results: dict) -> None:
    """The table of one (threads, length) setting: medians [min-max over rounds], x floor, phases, tokens."""
    rows = []
    for c, s in summ.items():
        ph = s["phase_median_seconds"]
        other = ph.get("score", 0.0) if c == "ours" else ph.get("score+other", 0.0) + ph.get("other", 0.0)
        rows.append([_label(c, results), fmt_spread(s["round_median_step_seconds"]),
                     fmt_spread(s["round_x_floor"], ".1f"), fmt(ph.get("generate")), fmt(ph.get("reference")),
                     fmt(ph.get("policy_forward")), fmt(ph.get("backward")), fmt(ph.get("optimizer")), fmt(other),
                     fmt(s["median_tokens_per_step"], ".0f"), fmt(s["median_gflop_per_step"], ".2f"),
                     fmt(s["median_gen_tokens_per_s"], ".0f"), fmt(s["median_peak_rss_mb"], ".0f"),
                     fmt(s["median_peak_above_base_mb"], ".0f")])
    print_table(["contender", "s/step [round min-max]", "x floor", "generate", "reference", "policy_fwd",
                 "backward", "optimizer", "score/other", "tok/step", "GFLOP/step", "gen tok/s", "peak RSS MiB",
                 "above base"], rows)


def compare(summ: dict, other: str, length: str, headline: bool) -> dict:
    """Ours / ``other``: time ratio (all steps, and per round [min-max]), FLOP ratio, tokens per side."""
    so, st = summ["ours"], summ[other]
    ratio = so["median_step_seconds"] / st["median_step_seconds"]
    paired = [o / t for o, t in zip(so["round_median_step_seconds"], st["round_median_step_seconds"])]
    fo, ft = so["median_gflop_per_step"], st["median_gflop_per_step"]
    fr = fo / ft if fo == fo and ft == ft and ft else float("nan")
    to, tt = so["median_tokens_per_step"], st["median_tokens_per_step"]
    eq = "equal" if so["tokens_per_step_min_max"] == st["tokens_per_step_min_max"] and to == tt else "NOT equal"
    tag = "HEADLINE " if headline else ""
    verdict = (f"   target (issue 12): at most {TARGET_RATIO}x -> {'met' if ratio <= TARGET_RATIO else 'not met'}"
               if headline else "")
    print(f"  {tag}[{length}] ours/{other} s/step: {ratio:.3f} (per-round ratios {fmt_spread(paired)}){verdict}")
    print(f"      tokens per step (generated = trained on): ours {fmt(to, '.0f')}, {other} {fmt(tt, '.0f')} -> {eq}; "
          f"FLOP ratio {fmt(fr)} ({fmt(fo, '.2f')} / {fmt(ft, '.2f')} GFLOP): time ratio "
          f"{'<=' if ratio <= fr else '>'} FLOP ratio")
    return {"ratio": ratio, "ratio_per_round": paired, "flop_ratio": fr, "tokens": [to, tt], "tokens_equal": eq == "equal"}


def run_setting(a, mdir: str, threads: int, length: str, roof: float, errors: list, loads: list) -> dict:
    """Rounds of one (threads, length) setting; prints its table and ratios; returns its figures."""
    contenders = [a.only] if a.only else ["ours", "trl"]
    if length == "forced" and a.only != "ours":
        contenders += [f"trl+{x.strip()}" for x in a.trl_settings.split(",") if x.strip()]
    common = ["--model-dir", mdir, "--threads", str(threads), "--prompts", str(a.prompts),
              "--group", str(a.group), "--max-new-tokens", str(a.max_new_tokens),
              "--micro-batch", str(a.micro_batch), "--beta", str(a.beta), "--eps", str(a.eps),
              "--lr", str(a.lr), "--temperature", str(a.temperature), "--seed", str(a.seed),
              "--warmup", str(a.warmup), "--steps", str(a.steps), "--length", length,
              "--recompute", a.recompute, *(["--release-heap", a.release_heap] if a.release_heap else []),
              *(["--no-count"] if a.no_count else []),
              *(["--recompute-budget", str(a.recompute_budget)] if a.recompute_budget is not None else []),
              *[x for kv in a.model for x in ("--model", kv)]]
    print(f"\n## {threads} thread(s), {length} length"
          f"{' (every row ' + str(a.max_new_tokens) + ' new tokens)' if length == 'forced' else ' (rows stop at EOS)'}"
          f", sgemm roof {roof:.1f} GFLOP/s", flush=True)

    def describe(c, res):
        st = [s["seconds"] for s in res["steps"]]
        line = f"{c}: median {median(st):.3f} s/step over {len(st)} steps, peak RSS {res['peak_rss_mb']:.0f} MiB"
        if res.get("phase_peak_rss_mb"):  # ours: per phase (max over the process's steps), base, CPU seconds
            line += (" (" + ", ".join(f"{k} {v:.0f}" for k, v in res["phase_peak_rss_mb"].items())
                     + f"; base {res['baseline_rss_mb']:.0f}; recompute {res['recompute']} "
                     f"{res.get('recompute_plans')}; heap releases {res.get('heap_releases')}; "
                     f"process CPU {res['cpu_seconds']:.1f} s)")
        return line
    results = run_rounds(__file__, lambda r: contenders if r % 2 == 0 else contenders[::-1], common, a,
                         describe, errors, loads, threads=threads, tag=f"[{threads}t {length}] ")
    summ = {c: summarize(v, PHASES_OURS if c == "ours" else PHASES_TRL, roof) for c, v in results.items() if v}
    for c in contenders:
        if not results.get(c):
            msg = next((e for e in errors if f"{c}: worker" in e), "no result").splitlines()
            print(f"  {c}: FAILED: {msg[-1][:200] if msg else ''}")
    if summ:
        print_setting(summ, results)
        print("(s/step: median over all timed steps [min-max of the per-round medians]; x floor: s/step over the "
              "time of the step's counted FLOPs at the sgemm roof; phases: medians)")
    cmp = {c: compare(summ, c, length, headline=(length == "forced" and c == "trl"))
           for c in summ if c != "ours" and "ours" in summ}
    return {"summary": summ, "raw": results, "compare": cmp}


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        a.threads = parse_threads(a.threads)[0]
        res = (worker_ours if a.worker == "ours" else worker_trl)(a)
        res["loadavg_end"] = loadavg()
        Path(a.worker_out).write_text(json.dumps(res))
        return 0

    la0 = loadavg()
    threads_list = parse_threads(a.threads)
    lengths = ["forced", "eos"] if a.length == "both" else [a.length]
    mcfg = load_config(None, [f"model.{kv}" for kv in a.model]).model if a.model else ModelConfig()
    tok = build_char_tokenizer()
    model = build_tiny_model(mcfg, tok, seed=a.seed)
    n_params = num_params(model)
    print(f"# GRPO step benchmark: ours (grpo-harness) vs TRL GRPOTrainer | model {n_params / 1e6:.2f}M params "
          f"(hidden {mcfg.hidden_size}, layers {mcfg.num_layers}, heads {mcfg.num_heads}, "
          f"inter {mcfg.intermediate_size}), random init")
    print(f"# G={a.group} x {a.prompts} prompts = {a.group * a.prompts} completions/step, {a.max_new_tokens} new "
          f"tokens, beta={a.beta}, eps={a.eps}, lr={a.lr}, T={a.temperature}, micro-batch {a.micro_batch}, "
          f"threads {threads_list}, lengths {lengths}, torch {torch.__version__}, glibc allocator "
          f"{' '.join(f'{k}={v}' for k, v in sorted(os.environ.items()) if k.startswith('MALLOC_')) or 'defaults'}")
    print(f"# {a.rounds} rounds x ({a.warmup} warm-up + {a.steps} timed steps) per contender, alternating, "
          f"fresh process each | loadavg at start {la0} on {os.cpu_count()} CPUs", flush=True)
    roofs = {t: sgemm_roof(t) for t in threads_list}
    print_floor(roofs)
    errors: list[str] = []
    loads = [la0]
    out = {"settings": {k: v for k, v in vars(a).items() if k not in ("worker", "model_dir", "worker_out")},
           "model_params": n_params, "model_config": dataclasses.asdict(mcfg), "loadavg_start": la0,
           "sgemm_roof_gflops": roofs, "settings_results": {}, "errors": errors}
    with tempfile.TemporaryDirectory(prefix="grpo-bench-model-") as mdir:
        save_policy(model, tok, mdir)
        del model
        for t in threads_list:
            for length in lengths:
                out["settings_results"][f"{t}t-{length}"] = run_setting(a, mdir, t, length, roofs[t], errors, loads)
    out["loadavg"] = loads
    return finish(out, errors, loads, a.json)


if __name__ == "__main__":
    sys.exit(main())
