"""Evaluation of a policy on a task: greedy accuracy, pass@k and maj@k curves.

:func:`evaluate` generates with the harness sampler (``harness.sampling.sample``), grades
with the task, writes one JSON record per problem and returns flat metrics::

    eval/<task>/acc            greedy accuracy (when greedy=True)
    eval/<task>/answered       fraction of greedy completions with an answer that counts
    eval/<task>/truncated      fraction of greedy completions cut at max_new_tokens
    eval/<task>/gen_tokens     mean generated tokens per greedy completion
    eval/<task>/mean_acc       mean accuracy of the n samples (= pass@1 = maj@1 when n > 0)
    eval/<task>/pass@k         k = 1..n, unbiased estimator (evals.metrics.pass_at_k)
    eval/<task>/maj@k          k = 1..n, majority vote averaged over all k-subsets
    eval/<task>/sample_answered, eval/<task>/sample_truncated, eval/<task>/sample_gen_tokens
    eval/<task>/num_problems, eval/<task>/seconds

Per-problem records (JSONL, one line per problem, in problem order)::

    {"id", "question", "gold",
     "greedy": {"completion", "answer", "key", "correct", "finished", "num_tokens"} | null,
     "samples": [{"completion", "answer", "key", "correct", "finished", "num_tokens"}, ...],
     "num_correct", "pass@k": [...], "maj@k": [...]}

``answer`` is the answer that counts for grading (None when nothing was extracted or the
completion was truncated), ``key`` its voting key (:func:`evals.grading.answer_key`). With
the records, :func:`summarize` recomputes every metric above except ``seconds``.

Sampling is deterministic given ``seed`` and ``batch_size``: prompts are processed in
chunks of ``batch_size`` sequences and chunk ``c`` is sampled with seed
``seed * 1_000_003 + c``.

Side effect: ``evaluate`` binds ``tokenizer`` to the task (``task.bind_tokenizer``) when the
task supports it, so prompts use the tokenizer's chat template; the trainer should bind the
same tokenizer before training so training and evaluation prompts agree.
"""
from __future__ import annotations

import inspect
import json
import os
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from evals.grading import answer_key
from evals.metrics import aggregate_curves, pass_at_k_curve, problem_curves

__all__ = ["evaluate", "summarize", "write_records", "read_records", "counted_answer"]


def counted_answer(task, completion: str, finished: bool) -> Optional[str]:
    """The answer of ``completion`` that grading counts (None if there is none, e.g. truncated)."""
    try:
        fa = getattr(task, "final_answer", None)
        if fa is not None:
            return fa(completion, finished)
        if not finished:
            return None
        return task.extract_answer(completion)
    except Exception:
        return None


def _grade(task, completion: str, problem, finished: bool) -> bool:
    try:
        return bool(task.is_correct(completion, problem, finished))
    except Exception:  # graders must not raise; a buggy one scores 0 rather than ending a run
        return False


def _record_item(task, completion, problem, finished, ntok, keep_text: bool) -> dict:
    ans = counted_answer(task, completion, finished)
    return {"completion": completion if keep_text else None, "answer": ans, "key": answer_key(ans),
            "correct": _grade(task, completion, problem, finished), "finished": bool(finished),
            "num_tokens": int(ntok)}


def _run_sampler(sampler, model, tokenizer, prompts, *, n, greedy, temperature, top_p, max_new_tokens, seed,
                 batch_size, bar_desc, progress):
    """Chunks of prompts through the sampler; returns [(completion, finished, ntok)] per prompt."""
    per_chunk = max(1, batch_size // max(n, 1))
    accepts = set(inspect.signature(sampler).parameters)
    extra = {"offsets": False} if "offsets" in accepts else {}
    chunks = list(range(0, len(prompts), per_chunk))
    it = chunks
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(chunks, desc=bar_desc, unit="batch", leave=False)
    out: list[list[tuple[str, bool, int]]] = []
    for c, s in enumerate(it):
        part = prompts[s:s + per_chunk]
        ro = sampler(model, tokenizer, part, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                     top_p=top_p, greedy=greedy, seed=seed * 1_000_003 + c, batch_size=batch_size, **extra)
        lengths = ro.completion_mask.sum(1).tolist() if getattr(ro, "completion_mask", None) is not None \
            else [0] * len(ro.completions)
        if len(ro.completions) != len(part) * n:
            raise RuntimeError(f"sampler returned {len(ro.completions)} completions for {len(part)} prompts x {n}")
        for i in range(len(part)):
            out.append([(ro.completions[i * n + j], bool(ro.finished[i * n + j]), int(lengths[i * n + j]))
                        for j in range(n)])
    return out


def evaluate(model, tokenizer, task, problems: Optional[Sequence] = None, *, greedy: bool = True, n: int = 0,
             temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int = 256, seed: int = 0,
             batch_size: int = 64, out_path: Optional[os.PathLike | str] = None, progress: bool = False,
             keep_completions: bool = True, sampler: Optional[Callable] = None) -> dict:
    """Evaluate ``model`` on ``problems`` (default ``task.eval_problems()``); see the module doc.

    ``greedy``: one greedy completion per problem (``eval/<task>/acc``). ``n``: samples per
    problem at ``temperature`` / ``top_p`` for pass@k / maj@k (0 = none). ``batch_size``:
    sequences decoded at once. ``out_path``: per-problem JSONL (parent folders are created;
    written atomically). ``keep_completions=False`` leaves completion texts out of the
    records. ``sampler``: defaults to ``harness.sampling.sample``."""
    t0 = time.time()
    if sampler is None:
        from harness.sampling import sample as sampler
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    bind = getattr(task, "bind_tokenizer", None)
    if bind is not None:
        bind(tokenizer)
    problems = list(task.eval_problems() if problems is None else problems)
    prompts = [task.format_prompt(p) for p in problems]
    name = task.name
    kw = dict(max_new_tokens=max_new_tokens, top_p=top_p, batch_size=max(1, int(batch_size)), progress=progress)
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
            rec["greedy"] = _record_item(task, c, p, f, L, keep_completions)
        if sampled_out is not None:
            rec["samples"] = [_record_item(task, c, p, f, L, keep_completions) for c, f, L in sampled_out[i]]
            curves = problem_curves([s["key"] for s in rec["samples"]], [s["correct"] for s in rec["samples"]])
            rec["num_correct"] = curves["num_correct"]
            rec["pass@k"] = curves["pass@k"]
            rec["maj@k"] = curves["maj@k"]
        records.append(rec)
    metrics = summarize(records, name)
    metrics[f"eval/{name}/seconds"] = time.time() - t0
    if out_path is not None:
        write_records(out_path, records)
    return metrics


def summarize(records: Sequence[dict], task_name: str) -> dict:
    """Flat ``eval/<task>/...`` metrics from per-problem records (as written by :func:`evaluate`)."""
    from evals.metrics import maj_at_k_curve
    ns = f"eval/{task_name}"
    out: dict = {f"{ns}/num_problems": len(records)}
    greedy = [r["greedy"] for r in records if r.get("greedy") is not None]
    if greedy:
        m = len(greedy)
        out[f"{ns}/acc"] = sum(g["correct"] for g in greedy) / m
        out[f"{ns}/answered"] = sum(g["answer"] is not None for g in greedy) / m
        out[f"{ns}/truncated"] = sum(not g["finished"] for g in greedy) / m
        out[f"{ns}/gen_tokens"] = sum(g["num_tokens"] for g in greedy) / m
    sampled = [r["samples"] for r in records if r.get("samples")]
    if sampled:
        ns_set = {len(s) for s in sampled}
        if len(ns_set) != 1:
            raise ValueError(f"records have different numbers of samples: {sorted(ns_set)}")
        n = ns_set.pop()
        flat = [s for ss in sampled for s in ss]
        pass_curves = [pass_at_k_curve(n, sum(s["correct"] for s in ss)) for ss in sampled]
        maj_curves = [maj_at_k_curve([s["key"] for s in ss], [s["correct"] for s in ss]) for ss in sampled]
        out[f"{ns}/mean_acc"] = sum(s["correct"] for s in flat) / len(flat)
        out[f"{ns}/sample_answered"] = sum(s["answer"] is not None for s in flat) / len(flat)
        out[f"{ns}/sample_truncated"] = sum(not s["finished"] for s in flat) / len(flat)
        out[f"{ns}/sample_gen_tokens"] = sum(s["num_tokens"] for s in flat) / len(flat)
        for k, v in enumerate(aggregate_curves(pass_curves), 1):
            out[f"{ns}/pass@{k}"] = v
        for k, v in enumerate(aggregate_curves(maj_curves), 1):
            out[f"{ns}/maj@{k}"] = v
    return out


def write_records(path: os.PathLike | str, records: Sequence[dict]) -> Path:
    """Write records as JSONL (atomically: a temp file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def read_records(path: os.PathLike | str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
