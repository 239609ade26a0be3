"""Sampler `vllm` (optional, UNVERIFIED: written against vLLM's documented offline API, never run
here -- vllm does not import on the machines this was written on, and no GPU was lent).

vllm is imported at module level inside ``try``: where it does not import, :func:`available` is
False and :func:`harness.engine.sampling.get_sampler` refuses the backend with the reason.

Design (colocated, as TRL's ``vllm_mode="colocate"``): one ``vllm.LLM`` per policy object, held in
a module cache, built in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) from a Hugging Face
folder of the policy written once, with ``enable_sleep_mode=True`` on CUDA. Every call:

1. ``wake_up()`` (the engine sleeps between calls, so training has the GPU memory);
2. pushes the learner's current weights into the engine's model (``load_weights``, through
   ``LLM.apply_model`` where the vLLM version has it, else the in-process driver worker's model
   runner), so each update is visible to the next sampling call;
3. generates with ``SamplingParams(n, max_tokens, temperature, top_p, seed, logprobs=0,
   stop_token_ids=[eos])``;
4. ``sleep(level=1)``: the weights go to CPU memory and the KV cache is dropped.

Log-probs: vLLM's ``logprobs=0`` gives the sampled token's log-prob, of the distribution the
engine's ``logprobs_mode`` names. Its default, ``raw_logprobs``, is the model's log-softmax
BEFORE temperature, top-k and top-p; the learner's old-policy log-probs are those of ``logits /
T`` (:func:`harness.engine.learner.token_logprobs`), so at T != 1 raw values would make the PPO
ratio wrong from the first step. The engine is therefore built with
``logprobs_mode="processed_logprobs"`` (after temperature and the top-k/top-p cut; vLLM >=
0.10.2, where "processed" includes temperature: `PROCESSED_LOGPROBS_SINCE`), which equals
``logits / T`` at top_p = 1, the only case the caller takes the engine's values. Where the
installed vLLM is older, or ``want_logprobs`` is False (top_p < 1: the cut renormalises), no
engine log-probs are returned and the caller recomputes them with one scoring forward.
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional

import torch

try:  # optional dependency
    import vllm  # type: ignore
    _IMPORT_ERROR: Optional[str] = None
except Exception as e:  # ImportError, or a broken CUDA/runtime stack
    vllm = None
    _IMPORT_ERROR = f"vllm does not import ({type(e).__name__}: {e})"

_ENGINES: dict = {}
GPU_MEMORY_UTILIZATION = 0.3  # the engine's share of the GPU; the rest is the learner's
PROCESSED_LOGPROBS_SINCE = (0, 10, 2)
"""The first vLLM whose ``logprobs_mode="processed_logprobs"`` applies temperature (0.10.0 added the
mode without it; TRL's colocated GRPO requires 0.10.2 for the same reason)."""


def _version_tuple(text: str) -> tuple:
    out = []
    for part in str(text).split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out + [0] * (3 - len(out)))


def processed_logprobs_supported() -> bool:
    """Whether the installed vLLM returns post-temperature log-probs when asked (see the module doc)."""
    return vllm is not None and _version_tuple(getattr(vllm, "__version__", "0")) >= PROCESSED_LOGPROBS_SINCE


def available() -> bool:
    return vllm is not None


def unavailable_reason() -> str:
    return _IMPORT_ERROR or ""


def _sleep_mode() -> bool:
    """Sleep mode is a CUDA (and ROCm) feature of vLLM."""
    return torch.cuda.is_available()


def _engine(model, tokenizer):
    """The cached engine of ``model`` (built on first use from a saved copy of it)."""
    key = id(model)
    if key not in _ENGINES:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine's model in this process
        folder = tempfile.mkdtemp(prefix="vllm_policy_")
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        sleep = _sleep_mode()
        processed = processed_logprobs_supported()
        extra = {"logprobs_mode": "processed_logprobs"} if processed else {}
        llm = vllm.LLM(model=folder, dtype=str(model.dtype).replace("torch.", ""), enforce_eager=True,
                       gpu_memory_utilization=GPU_MEMORY_UTILIZATION, enable_sleep_mode=sleep, **extra)
        _ENGINES[key] = {"llm": llm, "sleep": sleep, "asleep": False, "processed": processed}
    return _ENGINES[key]


def _push_weights(llm, model) -> None:
    """Load ``model``'s current weights into the engine's copy of the model."""
    weights = [(k, v.detach()) for k, v in model.state_dict().items()]
    if hasattr(llm, "apply_model"):
        llm.apply_model(lambda m: m.load_weights(weights))
        return
    worker = llm.llm_engine.model_executor.driver_worker
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    runner.model.load_weights(weights)


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: list[list[int]], n: int, max_new_tokens: int, temperature: float,
             top_p: float, greedy: bool, seed: int, want_logprobs: bool = True):
    """(token lists, log-prob lists or None), one per sequence, prompt-major (like
    :mod:`harness.engine.paged`). Log-probs are returned only when asked (``want_logprobs``) and
    the engine gives post-temperature ones (`processed_logprobs_supported`); None tells the
    caller to recompute them."""
    if vllm is None:
        raise RuntimeError(unavailable_reason())
    eng = _engine(model, tokenizer)
    llm = eng["llm"]
    if eng["asleep"]:
        llm.wake_up()
        eng["asleep"] = False
    _push_weights(llm, model)
    params = vllm.SamplingParams(n=n, max_tokens=max_new_tokens, temperature=0.0 if greedy else temperature,
                                 top_p=1.0 if greedy else top_p, seed=int(seed), logprobs=0,
                                 stop_token_ids=[tokenizer.eos_token_id])
    try:
        outs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    finally:
        if eng["sleep"]:
            llm.sleep(level=1)
            eng["asleep"] = True
    toks, lps = [], []
    for o in outs:
        for c in o.outputs:
            ids = list(c.token_ids)
            toks.append(ids)
            lps.append([d[t].logprob for d, t in zip(c.logprobs or [], ids)])
    return toks, (lps if want_logprobs and eng["processed"] else None)
