"""Per-problem evaluation records and the metrics computed from them.

Evaluation itself (generating with a sampler) is :func:`harness.engine.evaluate.evaluate`;
this module grades completions into records and turns records into flat metrics::
    eval/<task>/acc            greedy accuracy (when greedy=True)
    eval/<task>/answered       fraction of greedy completions with an answer that counts
    eval/<task>/truncated      fraction of greedy completions cut at max_new_tokens
    eval/<task>/gen_tokens     mean generated tokens per greedy completion
    eval/<task>/mean_acc       mean accuracy of the n samples (= pass@1 = maj@1 when n > 0)
    eval/<task>/pass@k         k = 1..n, unbiased estimator (evals.metrics.pass_at_k)
    eval/<task>/maj@k          k = 1..n, majority vote averaged over all k-subsets
    eval/<task>/sample_answered, eval/<task>/sample_truncated, eval/<task>/sample_gen_tokens
    eval/<task>/num_problems, eval/<task>/seconds

Tasks with process rewards (``task.has_process_rewards``, e.g. ``arith``) add valid-step
metrics beside these (the ones above are unchanged): a completion is *valid* when it is
correct **and** every process step reward (``task.step_rewards``) is 1, so a right answer over
a skipped or wrong step (a coincidental answer) is correct but not valid::

    eval/<task>/valid_acc        greedy completions that are valid
    eval/<task>/valid_mean_acc   samples that are valid (= valid_pass@1)
    eval/<task>/valid_pass@k     k = 1..n, pass@k counting valid samples only
    eval/<task>/valid_maj@k      k = 1..n, maj@k where a correct but invalid sample votes for
                                 a wrong answer of its own (its key marked invalid), so only
                                 valid samples can carry the right answer to the majority

Per-problem records (JSONL, one line per problem, in problem order)::

    {"id", "question", "gold",
     "greedy": {"completion", "answer", "key", "correct", "finished", "num_tokens"} | null,
     "samples": [{"completion", "answer", "key", "correct", "finished", "num_tokens"}, ...],
     "num_correct", "pass@k": [...], "maj@k": [...]}

Items of a task with process rewards also hold ``"valid"`` (bool, see above), and the record
``"num_valid"``.

``answer`` is the answer that counts for grading (None when nothing was extracted or the
completion was truncated), ``key`` its voting key (:func:`evals.grading.answer_key`). With
the records, :func:`summarize` recomputes every metric above except ``seconds``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence

from evals.grading import answer_key
from evals.metrics import aggregate_curves, maj_curve_from_groups, maj_at_k_curve, pass_at_k_curve, problem_curves

__all__ = ["summarize", "write_records", "read_records", "counted_answer", "grade", "record_item", "valid_steps",
           "compact_record", "compact_curves", "compact_ks", "COMPACT_FIELDS",
           "valid_keys"]


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


def grade(task, completion: str, problem, finished: bool) -> bool:
    try:
        return bool(task.is_correct(completion, problem, finished))
    except Exception:  # graders must not raise; a buggy one scores 0 rather than ending a run
        return False


def valid_steps(task, completion: str, problem, finished: bool) -> bool:
    """Every process step reward of ``completion`` is 1 (False when there are none or the task
    raises). Valid = correct and this."""
    try:
        steps = task.step_rewards(completion, problem, finished)
        return bool(steps) and all(float(s.reward) == 1.0 for s in steps)
    except Exception:
        return False


def record_item(task, completion, problem, finished, ntok, keep_text: bool) -> dict:
    ans = counted_answer(task, completion, finished)
    ok = grade(task, completion, problem, finished)
    item = {"completion": completion if keep_text else None, "answer": ans, "key": answer_key(ans),
            "correct": ok, "finished": bool(finished), "num_tokens": int(ntok)}
    if getattr(task, "has_process_rewards", False):
        item["valid"] = bool(ok and valid_steps(task, completion, problem, finished))
    return item


def valid_keys(items: Sequence[dict]) -> list:
    """Voting keys for valid-step maj@k: a correct but invalid item votes for ``("invalid", key)``,
    a wrong answer of its own; the others keep their key."""
    return [("invalid", s["key"]) if s["correct"] and not s["valid"] and s["key"] is not None else s["key"]
            for s in items]


def _has_valid(items) -> bool:
    return bool(items) and all("valid" in s for s in items)


def summarize(records: Sequence[dict], task_name: str) -> dict:
    """Flat ``eval/<task>/...`` metrics from per-problem records (as written by :func:`evaluate`)."""
    ns = f"eval/{task_name}"
    out: dict = {f"{ns}/num_problems": len(records)}
    greedy = [r["greedy"] for r in records if r.get("greedy") is not None]
    if greedy:
        m = len(greedy)
        out[f"{ns}/acc"] = sum(g["correct"] for g in greedy) / m
        out[f"{ns}/answered"] = sum(g["answer"] is not None for g in greedy) / m
        out[f"{ns}/truncated"] = sum(not g["finished"] for g in greedy) / m
        out[f"{ns}/gen_tokens"] = sum(g["num_tokens"] for g in greedy) / m
        if _has_valid(greedy):
            out[f"{ns}/valid_acc"] = sum(bool(g["valid"]) for g in greedy) / m
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
        if _has_valid(flat):
            out[f"{ns}/valid_mean_acc"] = sum(bool(s["valid"]) for s in flat) / len(flat)
            vpass = [pass_at_k_curve(n, sum(bool(s["valid"]) for s in ss)) for ss in sampled]
            vmaj = [maj_at_k_curve(valid_keys(ss), [bool(s["valid"]) for s in ss]) for ss in sampled]
            for k, v in enumerate(aggregate_curves(vpass), 1):
                out[f"{ns}/valid_pass@{k}"] = v
            for k, v in enumerate(aggregate_curves(vmaj), 1):
                out[f"{ns}/valid_maj@{k}"] = v
    return out


def write_records(path: os.PathLike | str, records: Sequence[dict]) -> Path:
    """Write records as JSONL (atomically: a temp file renamed into place; a write that fails,
    e.g. on a full disk, removes its temp file and leaves any earlier file as it was)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_records(path: os.PathLike | str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------- compact records

COMPACT_FIELDS = ("pass@k", "maj@k", "valid_pass@k", "valid_maj@k")
"""Per-problem curves a compact record keeps, at the k of its ``ks`` only."""


def compact_ks(n: int) -> list[int]:
    """The k a compact record keeps its curves at: the powers of two up to n, and n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n] if n >= 1 else []


def _histogram(keys: Sequence, correct: Sequence[bool]) -> tuple[list, int]:
    """([[key, count, any correct], ...] in order of first appearance, samples without a key): the
    sufficient statistic of maj@k (``evals.metrics.maj_curve_from_groups``: group sizes, which group is
    right, and the rank order that breaks ties)."""
    order: dict = {}
    groups: list = []
    none = 0
    for key, ok in zip(keys, correct):
        if key is None:
            none += 1
            continue
        if key not in order:
            order[key] = len(groups)
            groups.append([key, 0, False])
        g = groups[order[key]]
        g[1] += 1
        g[2] = g[2] or bool(ok)
    return groups, none


def compact_record(rec: dict) -> dict:
    """A per-problem record without completion texts or per-sample items, small enough to commit:
    ``id``, ``gold``, ``greedy`` (its answer, key, correct, valid, finished, num_tokens), and for the
    n samples ``n``, ``num_correct`` (``num_valid``), the answer-key histograms ``answers`` (and
    ``valid_answers``: keys as :func:`valid_keys` makes them) with the samples that have no key
    (``no_answer``), and the curves of :data:`COMPACT_FIELDS` at ``ks`` (:func:`compact_ks`).
    From it pass@k and maj@k at every k are exact again (:func:`compact_curves`); the curves at
    ``ks`` are kept so a report does not recompute them."""
    out = {k: rec[k] for k in ("id", "gold") if k in rec}
    g = rec.get("greedy")
    kept = ("answer", "key", "correct", "valid", "finished", "num_tokens")
    out["greedy"] = None if g is None else {k: v for k, v in g.items() if k in kept}  # in the item's order
    samples = rec.get("samples") or []
    if not samples:
        return out
    n = len(samples)
    keys, correct = [s["key"] for s in samples], [bool(s["correct"]) for s in samples]
    out["n"] = n
    out["num_correct"] = sum(correct)
    out["answers"], out["no_answer"] = _histogram(keys, correct)
    ks = compact_ks(n)
    out["ks"] = ks
    curves = {"pass@k": pass_at_k_curve(n, sum(correct)), "maj@k": maj_at_k_curve(keys, correct)}
    if _has_valid(samples):
        valid, vkeys = [bool(s["valid"]) for s in samples], valid_keys(samples)
        out["num_valid"] = sum(valid)
        out["valid_answers"], _ = _histogram(vkeys, valid)
        curves["valid_pass@k"] = pass_at_k_curve(n, sum(valid))
        curves["valid_maj@k"] = maj_at_k_curve(vkeys, valid)
    for name, curve in curves.items():
        out[name] = [curve[k - 1] for k in ks]
    return out


def compact_curves(rec: dict) -> dict:
    """The full curves (k = 1..n) of :data:`COMPACT_FIELDS` from a compact record's counts and
    histograms: exactly what :func:`summarize`'s per-problem curves are for the samples it came from."""
    n = rec["n"]
    hist = rec["answers"]
    out = {"pass@k": pass_at_k_curve(n, rec["num_correct"]),
           "maj@k": maj_curve_from_groups(n, [c for _, c, _ in hist], [bool(ok) for _, _, ok in hist], rec["no_answer"])}
    if "valid_answers" in rec:
        vh = rec["valid_answers"]
        out["valid_pass@k"] = pass_at_k_curve(n, rec["num_valid"])
        out["valid_maj@k"] = maj_curve_from_groups(n, [c for _, c, _ in vh], [bool(ok) for _, _, ok in vh],
                                              rec["no_answer"])
    return out
