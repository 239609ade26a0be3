"""Sampler `paged`: transformers' continuous batching (paged attention, ``model.generate_batch``'s
engine) behind the same contract as the reference sampler `hf`. This module only generates
(token ids and log-probs per sequence); :func:`harness.engine.sampling.sample` with
``backend="paged"`` turns them into :class:`~harness.engine.sampling.Rollouts`.

How it maps onto transformers' API (5.x, ``transformers.generation.continuous_batching``):

- every prompt is submitted ``n`` times (prompt-major, one request per sequence) to a
  ``ContinuousBatchingManager`` from ``model.init_continuous_batching``; all requests are queued
  *before* its generation thread starts, so the scheduler sees the same batch every time;
- sampling is the manager's: softmax of the processed logits (temperature, then top-p; top-k
  off), ``torch.multinomial`` on the global CPU/GPU generator, seeded by
  ``ContinuousBatchingConfig.seed``. The global RNG state is saved and restored around the call,
  so the caller's random stream is left as the ``hf`` sampler leaves it;
- log-probs: with ``top_p == 1`` the manager's own (``return_logprobs=True``: log softmax of
  logits / T; greedy: of the raw logits), which is the quantity the learner recomputes. With
  ``top_p < 1`` the manager's log-probs are those of the renormalised nucleus, so they are
  recomputed by the caller with one scoring forward (``harness.engine.sampling`` calls
  :func:`harness.engine.learner.token_logprobs` at T) -- the same convention as ``hf``
  (log-prob under logits / T, before the nucleus cut);
- a fresh manager per call (its paged cache sized for this call's requests): the model is read
  in place, so weight updates are visible to the next call; nothing is cached on the model;
- per-call cost: tearing a manager down runs ``gc.collect()`` twice (its ``stop`` and its batch
  processor's ``__del__``), which walks every object of the process: 0.31 s of a 0.45 s call
  (1 row, 4 tokens, 0.87M model, ~400k objects) when measured. The objects that exist before the
  call are frozen (``gc.freeze``, unfrozen after; skipped when the caller froze some itself), so
  those collections only walk what the call created; cyclic garbage from before is collected at
  the next collection after the call instead. bench/samplers.py measures the backends.

Reproducibility: seeded and repeatable on CPU for the same prompts, n, and batch sizes (the
whole workload is one queue). The random stream differs from ``hf``'s (Gumbel-max on its own
generator), so the two backends draw different samples for the same seed; on GPU, kernels and
CUDA graphs may make repeated runs differ.
"""
from __future__ import annotations

import contextlib
import gc
import math

import torch

PAGE_SIZE = 32  # tokens per cache page: small, since RL prompts+completions are short


def _configs(tokenizer, max_new_tokens: int, temperature: float, top_p: float, greedy: bool, seed: int,
             num_requests: int, longest: int, want_logprobs: bool):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    gen = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad)
    if greedy:
        gen.update(do_sample=False, temperature=1.0, top_p=1.0)
    else:  # top_k=0: no top-k cut (GenerationConfig's default is 50; the hf sampler has none)
        gen.update(do_sample=True, temperature=float(temperature), top_p=float(top_p), top_k=0)
    pages_per_request = math.ceil((longest + max_new_tokens + 1) / PAGE_SIZE)
    cb = ContinuousBatchingConfig(
        page_size=PAGE_SIZE, num_blocks=pages_per_request * num_requests + 1,
        max_batch_tokens=max(num_requests * (longest + 1), 256), max_requests_per_batch=num_requests,
        return_logprobs=want_logprobs, seed=int(seed) & 0x7FFFFFFF, use_cuda_graph=False,
        allow_block_sharing=False)
    return GenerationConfig(**gen), cb


@contextlib.contextmanager
def _gc_frozen():
    """Freeze the garbage collector's view of the objects that exist now (see the module doc)."""
    if gc.get_freeze_count() > 0:  # the caller manages frozen objects itself: leave them alone
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: list[list[int]], n: int, max_new_tokens: int, temperature: float,
             top_p: float, greedy: bool, seed: int, want_logprobs: bool):
    """(generated token lists, log-prob lists or None), one per sequence (prompt-major)."""
    inputs = [ids for ids in prompt_ids for _ in range(n)]
    gen_cfg, cb_cfg = _configs(tokenizer, max_new_tokens, temperature, top_p, greedy, seed, len(inputs),
                               max(len(i) for i in inputs), want_logprobs)
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), _gc_frozen():
        manager = model.init_continuous_batching(generation_config=gen_cfg, continuous_batching_config=cb_cfg)
        try:
            req_ids = manager.add_requests(inputs=inputs, max_new_tokens=max_new_tokens)
            if req_ids is None or any(r is None for r in req_ids):
                raise RuntimeError("paged sampler: the continuous-batching manager refused requests")
            manager.start()
            results = {}
            while len(results) < len(req_ids):
                res = manager.get_result(timeout=1)
                if res is not None and res.is_finished():
                    if res.error is not None:
                        raise RuntimeError(f"paged sampler: request {res.request_id} failed: {res.error}")
                    results[res.request_id] = res
                elif res is None and not manager.is_running():
                    raise RuntimeError("paged sampler: the generation thread stopped before finishing")
        finally:
            if manager.is_running():
                manager.stop(block=True)
            manager.destroy()
    outs = [results[r] for r in req_ids]
    toks = [list(o.generated_tokens[:max_new_tokens]) for o in outs]
    lps = [list(o.logprobs[:max_new_tokens]) for o in outs] if want_logprobs else None
    return toks, lps
