"""Evaluation of a policy on a task with a sampler: greedy accuracy, pass@k and maj@k curves.

:func:`evaluate` generates with the harness sampler (:func:`harness.engine.sampling.sample`
unless another is passed), grades each completion with the task into per-problem records
(:mod:`evals.records`, which also documents the metric names and record format), writes
them as JSONL and returns flat ``eval/<task>/...`` metrics.

Sampling is deterministic given ``seed`` and ``batch_size``: prompts are processed in
chunks of ``batch_size`` sequences and chunk ``c`` is sampled with seed
``seed * 1_000_003 + c``. More than `N_DRAW_MAX` samples per problem (and more than
``batch_size``) are drawn one problem at a time in draws of at most `N_DRAW_MAX` sequences,
draw ``j`` with seed ``(seed * 1_000_003 + c) * 4_099 + j``, so memory stays that of a
256-sequence batch whatever ``n`` (n <= 256 is sampled exactly as before).

Side effect: ``evaluate`` binds ``tokenizer`` to the task (``task.bind_tokenizer``) when the
task supports it, so prompts use the tokenizer's chat template; the trainer binds the same
tokenizer before training so training and evaluation prompts agree.

``protocol`` (:mod:`evals.protocols`) decides the prompts, where a completion ends and the grader:
``chat`` (the default) is the task's own prompt and grader, exactly as before protocols existed;
``lighteval-5shot`` scores GSM8K as lighteval does for SmolLM2's model card (5 worked examples,
completions cut at ``Question`` after generation, first ``#### N`` exact match). The records then
hold the cut completions, and ``finished`` is true for a completion cut at a stop sequence.
"""
from __future__ import annotations

import inspect
import os
import time
from typing import Callable, Optional, Sequence

from tqdm.auto import tqdm

from evals.metrics import problem_curves
from evals.protocols import DEFAULT_PROTOCOL, get_protocol
from evals.records import record_item, summarize, write_records
from harness.engine.sampling import sample


N_DRAW_MAX = 256
"""Most sequences one problem's samples are decoded in at once (see the module doc)."""


def _run_sampler(sampler, model, tokenizer, prompts, *, n, greedy, temperature, top_p, max_new_tokens, seed,
                 batch_size, bar_desc, progress, stop=()):
    """Chunks of prompts through the sampler; returns [(completion, finished, ntok)] per prompt.
    ``stop``: the protocol's stop strings, for a sampler that can end completions there (the
    completions are cut at them afterwards either way, so the graded text is the same)."""
    per_chunk = max(1, batch_size // max(n, 1))
    accepts = set(inspect.signature(sampler).parameters)
    extra = {"offsets": False} if "offsets" in accepts else {}
    if stop and "stop" in accepts:
        extra["stop"] = tuple(stop)
    chunks = list(range(0, len(prompts), per_chunk))
    it = chunks
    if progress:
        it = tqdm(chunks, desc=bar_desc, unit="batch", leave=False)
    out: list[list[tuple[str, bool, int]]] = []
    for c, s in enumerate(it):
        part = prompts[s:s + per_chunk]
        if n > N_DRAW_MAX and n > batch_size:  # one problem (per_chunk is 1), in draws of <= N_DRAW_MAX
            row: list[tuple[str, bool, int]] = []
            for j, lo in enumerate(range(0, n, N_DRAW_MAX)):
                m = min(N_DRAW_MAX, n - lo)
                ro = sampler(model, tokenizer, part, n=m, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_p=top_p, greedy=greedy, seed=(seed * 1_000_003 + c) * 4_099 + j,
                             batch_size=batch_size, **extra)
                row += _rows(ro, part, m)[0]
            out.append(row)
            continue
        ro = sampler(model, tokenizer, part, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                     top_p=top_p, greedy=greedy, seed=seed * 1_000_003 + c, batch_size=batch_size, **extra)
        out += _rows(ro, part, n)
    return out


def _rows(ro, part, n) -> list[list[tuple[str, bool, int]]]:
    """[(completion, finished, ntok)] * n per prompt of ``part`` from one sampler call."""
    lengths = ro.completion_mask.sum(1).tolist() if getattr(ro, "completion_mask", None) is not None \
        else [0] * len(ro.completions)
    if len(ro.completions) != len(part) * n:
        raise RuntimeError(f"sampler returned {len(ro.completions)} completions for {len(part)} prompts x {n}")
    return [[(ro.completions[i * n + j], bool(ro.finished[i * n + j]), int(lengths[i * n + j]))
             for j in range(n)] for i in range(len(part))]


def _item(view, completion, problem, finished, ntok, keep_completions) -> dict:
    """One graded completion: cut as the protocol says, then recorded (``evals.records.record_item``)."""
    completion, finished = view.finish(completion, finished)
    return record_item(view.grader, completion, problem, finished, ntok, keep_completions)


def evaluate(model, tokenizer, task, problems: Optional[Sequence] = None, *, greedy: bool = True, n: int = 0,
             temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 256, seed: int = 0,
             batch_size: int = 64, out_path: Optional[os.PathLike | str] = None, progress: bool = False,
             keep_completions: bool = True, sampler: Optional[Callable] = None,
             protocol: str = DEFAULT_PROTOCOL) -> dict:
    """Evaluate ``model`` on ``problems`` (default ``task.eval_problems()``); see the module doc.

    ``greedy``: one greedy completion per problem (``eval/<task>/acc``). ``n``: samples per
    problem at ``temperature`` / ``top_p`` for pass@k / maj@k (0 = none). ``batch_size``:
    sequences decoded at once. ``out_path``: per-problem JSONL (parent folders are created;
    written atomically). ``keep_completions=False`` leaves completion texts out of the
    records. ``sampler``: defaults to ``harness.engine.sampling.sample``. ``protocol``: a name in
    ``evals.protocols.PROTOCOLS``; one not defined for ``task`` raises ``ProtocolError`` before
    anything is generated. ``max_new_tokens`` stays the caller's under every protocol (lighteval's
    GSM8K is defined with ``PROTOCOLS["lighteval-5shot"].max_new_tokens`` = 256, this default)."""
    t0 = time.time()
    sampler = sampler or sample
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    proto = get_protocol(protocol)
    proto.check(task.name, int(getattr(getattr(task, "cfg", None), "few_shot", 0) or 0))
    view = proto.bind(task, tokenizer)  # chat: task.bind_tokenizer(tokenizer), prompts task.format_prompt
    problems = list(task.eval_problems() if problems is None else problems)
    prompts = view.prompts(problems)
    name = task.name
    kw = dict(max_new_tokens=max_new_tokens, top_p=top_p, batch_size=max(1, int(batch_size)), progress=progress,
              stop=view.stop)
    greedy_out = None
    if greedy and problems:
        greedy_out = _run_sampler(sampler, model, tokenizer, prompts, n=1, greedy=True, temperature=1.0,
                                  seed=seed, bar_desc=f"eval {name} greedy", **kw)
    sampled_out = None
    if n > 0 and problems:
        sampled_out = _run_sampler(sampler, model, tokenizer, prompts, n=n, greedy=False, temperature=temperature,
                                   seed=seed + 1, bar_desc=f"eval {name} n={n}", **kw)
    records = []
    for i, p in enumerate(problems):
        rec = {"id": p.id, "question": p.question, "gold": p.answer, "greedy": None, "samples": []}
        if greedy_out is not None:
            c, f, L = greedy_out[i][0]
            rec["greedy"] = _item(view, c, p, f, L, keep_completions)
        if sampled_out is not None:
            rec["samples"] = [_item(view, c, p, f, L, keep_completions) for c, f, L in sampled_out[i]]
            curves = problem_curves([s["key"] for s in rec["samples"]], [s["correct"] for s in rec["samples"]])
            rec["num_correct"] = curves["num_correct"]
            rec["pass@k"] = curves["pass@k"]
            rec["maj@k"] = curves["maj@k"]
            if rec["samples"] and all("valid" in s for s in rec["samples"]):
                rec["num_valid"] = sum(bool(s["valid"]) for s in rec["samples"])
        records.append(rec)
    metrics = summarize(records, name)
    metrics[f"eval/{name}/seconds"] = time.time() - t0
    if out_path is not None:
        write_records(out_path, records)
    return metrics
