"""Sampler `vllm` (optional, UNVERIFIED: written against vLLM's documented offline API, never run
here -- vllm does not import on the machines this was written on).

vllm is imported at module level inside ``try``: where it does not import, :func:`available` is
False and :func:`harness.engine.sampling.get_sampler` refuses the backend with the reason.

Design: one ``vllm.LLM`` per (model object, tokenizer path) held in a module cache, built from a
Hugging Face folder of the policy written once; before every call the learner's current weights
are pushed into the engine (``load_weights``), so updates are visible to the next sampling call.
Log-probs: vLLM's ``logprobs=0`` gives the sampled token's log-prob (which distribution --
raw or processed -- depends on the vLLM version's ``logprobs_mode``); the caller recomputes them
with one scoring forward when ``want_logprobs`` is False (top_p < 1).
"""
from __future__ import annotations

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


def available() -> bool:
    return vllm is not None


def unavailable_reason() -> str:
    return _IMPORT_ERROR or ""


def _engine(model, tokenizer):
    key = id(model)
    if key not in _ENGINES:
        folder = tempfile.mkdtemp(prefix="vllm_policy_")
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        _ENGINES[key] = vllm.LLM(model=folder, dtype=str(model.dtype).replace("torch.", ""),
                                 enforce_eager=True, gpu_memory_utilization=0.3)
    return _ENGINES[key]


def _push_weights(llm, model) -> None:
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    runner.model.load_weights(((k, v.detach()) for k, v in model.state_dict().items()))


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: list[list[int]], n: int, max_new_tokens: int, temperature: float,
             top_p: float, greedy: bool, seed: int, want_logprobs: bool = True):
    """(token lists, log-prob lists), one per sequence, prompt-major (like :mod:`harness.engine.paged`)."""
    if vllm is None:
        raise RuntimeError(unavailable_reason())
    llm = _engine(model, tokenizer)
    _push_weights(llm, model)
    params = vllm.SamplingParams(n=n, max_tokens=max_new_tokens, temperature=0.0 if greedy else temperature,
                                 top_p=1.0 if greedy else top_p, seed=int(seed), logprobs=0,
                                 stop_token_ids=[tokenizer.eos_token_id])
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    toks, lps = [], []
    for o in outs:
        for c in o.outputs:
            ids = list(c.token_ids)
            toks.append(ids)
            lps.append([d[t].logprob for d, t in zip(c.logprobs or [], ids)])
    return toks, lps

