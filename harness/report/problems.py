"""Per-problem values of a run's evaluations, read back from its evaluation records (``eval/<task>_<step>.jsonl``).

Every evaluation point writes one JSONL line per problem (`evals.records`; the start's are
copied into each run from the warm-up's cache): ``{"id", "greedy": {"correct", ...},
"samples": [{"key", "correct", ...}, ...], "num_correct", "pass@k": [...], "maj@k": [...]}``.
When the n samples were drawn on a subset of the problems they are in
``eval/<task>_<step>_samples.jsonl`` instead. Trimmed copies (completions left out, as in a
committed reference) read the same; so do records that keep only ``greedy.correct``,
``num_correct`` and the sample ``key``/``correct`` fields: a missing ``pass@k`` list is
recomputed from ``num_correct`` (`evals.metrics.pass_at_k_curve`) and a missing ``maj@k`` from
the samples' keys (`evals.metrics.maj_at_k_curve`). Compact records (`evals.records.compact_record`,
what ``harness export`` commits: no per-sample items) hold the curves at their ``ks`` (1, 2, 4, ...,
n) and the answer-key histograms that give any other k exactly (`evals.records.compact_curves`).

`problem_values` returns ``{problem id: value}`` for one run, task, metric (``acc``: greedy
correct as 0/1; ``pass@K``, ``maj@K``: the problem's unbiased estimate at K; the valid-step
forms ``valid_acc`` (greedy ``valid``), ``valid_pass@K`` (from ``num_valid``, else the samples'
``valid`` flags) and ``valid_maj@K`` (the samples' keys, a correct but invalid sample voting for
a wrong answer of its own: `evals.records.valid_keys`), as `evals.records.summarize` counts
them) and side
(``initial``: step 0; ``final``: the run's last evaluation row; ``validation``: the final greedy scores on the
validation split, ``eval/<task>_validation.jsonl``, against the summary's ``final_val_eval``), or the reason why
there are none. The values are checked against the run's summary: their mean must equal the metric the
summary reports (to ``TOLERANCE``), else the records are not used (the report says why).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from evals.grading import answer_key
from evals.metrics import maj_at_k_curve, pass_at_k_curve
from evals.records import compact_curves, valid_keys
from harness.rundir.layout import RunFileError, read_jsonl
from harness.rundir.read import RunData, eval_metrics, is_number, k_of

TOLERANCE = 1e-6
"""Largest |mean of the per-problem values - the summary's metric| for the records to be used."""


def eval_step(run: RunData, side: str) -> Optional[int]:
    """The step of the run's start (0) or final (its last evaluation row's step) evaluation."""
    if side == "initial":
        return 0
    rows = run.eval_rows()
    step = rows[-1].get("step") if rows else None
    return int(step) if is_number(step) else None


def _compact(rec: dict) -> Optional[dict]:
    """What the report needs of one record: its id, greedy correctness, and the sample
    curves (or what rebuilds them); the completions are dropped at once."""
    if not isinstance(rec, dict) or "id" not in rec:
        return None
    g = rec.get("greedy")
    samples = [s for s in rec.get("samples") or [] if isinstance(s, dict)] if isinstance(rec.get("samples"), list) else []
    out = {"id": str(rec["id"]),
           "greedy": float(g["correct"]) if isinstance(g, dict) and isinstance(g.get("correct"), bool) else None,
           "greedy_valid": float(g["valid"]) if isinstance(g, dict) and isinstance(g.get("valid"), bool) else None,
           "gold": answer_key(str(rec["gold"])) if rec.get("gold") is not None else None}
    for kind in ("pass", "maj"):
        curve = rec.get(f"{kind}@k")
        out[kind] = [float(v) for v in curve] if isinstance(curve, list) and all(is_number(v) for v in curve) else None
    n = len(samples) or rec.get("n")
    c = rec.get("num_correct")
    if not is_number(c) and samples:
        c = sum(bool(s.get("correct")) for s in samples)
    out["n"], out["c"] = (int(n), int(c)) if is_number(n) and is_number(c) else (None, None)
    out["keys"] = ([s.get("key") for s in samples], [bool(s.get("correct")) for s in samples]) \
        if samples and out["maj"] is None else None
    has_valid = bool(samples) and all(isinstance(s.get("valid"), bool) for s in samples)
    nv = rec.get("num_valid")
    if not is_number(nv) and has_valid:
        nv = sum(s["valid"] for s in samples)
    out["v"] = int(nv) if is_number(nv) and out["n"] is not None else None
    out["vkeys"] = None
    if has_valid:
        items = [{"key": s.get("key"), "correct": bool(s.get("correct")), "valid": s["valid"]} for s in samples]
        out["vkeys"] = (valid_keys(items), [s["valid"] for s in samples])
    out["known"], out["hist"] = _compact_form(rec)
    if out["known"]:
        out["pass"] = out["maj"] = None  # a compact record's lists hold the values at its ks only
    return out


def _compact_form(rec: dict) -> tuple[dict, Optional[dict]]:
    """A compact record's (`evals.records.compact_record`) curves at its ``ks`` as ``{(kind, k):
    value}``, and the counts and histograms that give every other k (None when it has none)."""
    ks = rec.get("ks")
    if not (isinstance(ks, list) and ks and all(isinstance(k, int) and not isinstance(k, bool) for k in ks)):
        return {}, None
    known = {}
    for kind in ("pass", "maj", "valid_pass", "valid_maj"):
        vals = rec.get(f"{kind}@k")
        if isinstance(vals, list) and len(vals) == len(ks) and all(is_number(v) for v in vals):
            known.update({(kind, k): float(v) for k, v in zip(ks, vals)})
    need = ("n", "num_correct", "answers", "no_answer")
    hist = {k: rec[k] for k in need + ("num_valid", "valid_answers") if k in rec} \
        if all(k in rec for k in need) else None
    return known, hist


def _from_hist(rec: dict, kind: str, k: int) -> Optional[float]:
    """A compact record's ``kind``@k at a k outside its ``ks``, from its counts and histograms
    (the curves computed once per record)."""
    hist = rec["hist"]
    if hist is None or not 0 < k <= hist["n"] or (kind.startswith("valid_") and "valid_answers" not in hist):
        return None
    if "curves" not in rec:
        rec["curves"] = compact_curves(hist)
    curve = rec["curves"].get(f"{kind}@k")
    return float(curve[k - 1]) if curve else None


def _read(path: Path, cache: dict) -> Optional[list]:
    key = str(path)
    if key not in cache:
        try:
            recs = read_jsonl(path, warn=False) if path.is_file() else None
        except (RunFileError, OSError):
            recs = None
        cache[key] = [_compact(r) for r in recs] if recs else None
    return cache[key]


def _value(rec: dict, metric: str) -> Optional[float]:
    if metric == "acc":
        return rec["greedy"]
    if metric == "valid_acc":
        return rec["greedy_valid"]
    valid = metric.startswith("valid_")
    kind, k = k_of(metric.removeprefix("valid_"))
    name = f"valid_{kind}" if valid else kind
    if (name, k) in rec["known"]:
        return rec["known"][(name, k)]
    if rec["hist"] is not None:
        return _from_hist(rec, name, k)
    if valid:
        if kind == "pass" and rec["v"] is not None and 0 < k <= rec["n"]:
            return float(pass_at_k_curve(rec["n"], rec["v"])[k - 1])
        if kind == "maj" and rec["vkeys"] and 0 < k <= len(rec["vkeys"][0]):
            if "vmaj" not in rec:
                rec["vmaj"] = maj_at_k_curve(*rec["vkeys"])
            return float(rec["vmaj"][k - 1])
        return None
    kind, k = k_of(metric)
    curve = rec[kind]
    if curve is not None and len(curve) >= k:
        return curve[k - 1]
    if kind == "pass" and rec["n"] and 0 < k <= rec["n"]:
        return float(pass_at_k_curve(rec["n"], rec["c"])[k - 1])
    if kind == "maj" and rec["keys"] and k <= len(rec["keys"][0]):
        if "pmaj" not in rec:
            rec["pmaj"] = maj_at_k_curve(*rec["keys"])
        return float(rec["pmaj"][k - 1])
    return None


def problem_values(run: RunData, task: str, metric: str, side: str, cache: Optional[dict] = None) -> tuple:
    """``({problem id: value}, "")``, or ``(None, reason)`` when the run has no usable records
    for it (see the module doc)."""
    cache = {} if cache is None else cache
    if side == "validation":
        return _validation_values(run, task, metric, cache)
    step = eval_step(run, side)
    if step is None:
        return None, f"{run.run_id}: no final evaluation row"
    kk = k_of(metric.removeprefix("valid_"))
    if metric in ("acc", "valid_acc"):
        files = [f"{task}_{step}.jsonl"]
    elif kk:
        files = [f"{task}_{step}_samples.jsonl", f"{task}_{step}.jsonl"]
    else:
        return None, f"no per-problem form of {metric}"
    recs = next((r for r in (_read(run.run_dir / "eval" / f, cache) for f in files) if r), None)
    if not recs:
        return None, f"{run.run_id}: no records eval/{files[-1]}"
    summary = (run.initial_eval if side == "initial" else run.final_eval).get(f"{task}/{metric}")
    return _checked(run, recs, metric, summary, files[-1], f"step {step}")


def _checked(run: RunData, recs: list, metric: str, summary, name: str, where: str) -> tuple:
    """``({problem id: value}, "")`` from records whose mean equals the summary's ``metric``, else ``(None, why)``."""
    out = {}
    for rec in recs:
        v = _value(rec, metric) if rec is not None else None
        if v is None:
            return None, f"{run.run_id}: eval/{name} lacks {metric} for some problem"
        out[rec["id"]] = v
    mean = math.fsum(out.values()) / len(out)
    if not is_number(summary) or abs(mean - float(summary)) > TOLERANCE:
        return None, (f"{run.run_id}: eval records' mean {metric} {mean:.6f} differs from the summary's "
                      f"{summary} ({where})")
    return out, ""


def _validation_values(run: RunData, task: str, metric: str, cache: dict) -> tuple:
    """The final greedy scores on the validation split (``eval/<task>_validation.jsonl``, checked against the
    summary's ``final_val_eval``): ``acc`` and ``valid_acc`` only, as the validation evaluation is greedy."""
    if metric not in ("acc", "valid_acc"):
        return None, f"the validation split is scored greedily: no {metric}"
    name = f"{task}_validation.jsonl"
    recs = _read(run.run_dir / "eval" / name, cache)
    if not recs:
        return None, f"{run.run_id}: no records eval/{name}"
    summary = eval_metrics(run.summary.get("final_val_eval"), task).get(f"{task}/{metric}")
    return _checked(run, recs, metric, summary, name, "final_val_eval")


def gold_keys(run: RunData, task: str, cache: Optional[dict] = None) -> dict:
    """``{problem id: answer key of its gold answer}`` from the run's start and final greedy
    records of ``task`` (``gold`` through `evals.grading.answer_key`); empty without records."""
    cache = {} if cache is None else cache
    out: dict = {}
    for side in ("initial", "final"):
        step = eval_step(run, side)
        recs = _read(run.run_dir / "eval" / f"{task}_{step}.jsonl", cache) if step is not None else None
        for rec in recs or []:
            if rec is not None and rec["gold"] is not None:
                out.setdefault(rec["id"], rec["gold"])
    return out


def guessing_floor(golds: dict) -> Optional[dict]:
    """The accuracy of the best constant answer on a set: the share of its problems whose gold
    answer key is the most frequent one. ``golds``: ``{problem id: gold key}``. Returns
    ``{"floor", "answer", "count", "problems"}`` (ties between answers: the smallest key, as a
    string), or None for an empty set."""
    if not golds:
        return None
    counts: dict = {}
    for g in golds.values():
        counts[g] = counts.get(g, 0) + 1
    answer = min(counts, key=lambda a: (-counts[a], str(a)))
    return {"floor": counts[answer] / len(golds), "answer": answer, "count": counts[answer], "problems": len(golds)}
