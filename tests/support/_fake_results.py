"""Realistic fake results directories (docs/architecture.md layout) for the tracking and report
tests, written without training anything. Imported by tests/test_tracking_*.py and
tests/test_report*.py (not collected: the name does not start with ``test_``)."""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import yaml

from harness.config.schema import config_from_dict
from harness.foundation.base import to_dict
from harness.rundir.ids import run_id

KS = (1, 2, 4, 8)
STEPS = 8
SAMPLES_PER_STEP = 128          # 8 prompts x 16 samples
EVAL_STEPS = (2, 4, 6, 8)
T0 = 1_790_000_000.0

# (algorithm, seed, eval.n, status). ppo evaluates greedily only (no pass@k / maj@k);
# rft has a single seed (no interval); ppo seed 2 failed part-way.
DEFAULT_SPEC = [
    ("grpo", 0, 8, "finished"), ("grpo", 1, 8, "finished"), ("grpo", 2, 8, "finished"),
    ("ppo", 0, 0, "finished"), ("ppo", 1, 0, "finished"), ("ppo", 2, 0, "failed"),
    ("rft", 0, 8, "finished"),
]
_LIFT = {"grpo": 0.30, "ppo": 0.22, "rft": 0.15}
_MEM = {"grpo": 310.0, "ppo": 520.0, "rft": 280.0}


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _k_metrics(acc: float, rng) -> dict[str, float]:
    out = {}
    for k in KS:
        out[f"pass@{k}"] = round(min(1.0, 1 - (1 - acc) ** k + rng.uniform(0, 0.01)), 4)
        out[f"maj@{k}"] = round(min(1.0, acc + 0.02 * np.log2(k) + rng.uniform(0, 0.01)), 4)
    return out


def _eval(acc_arith: float, acc_gsm: float, n: int, rng) -> dict[str, float]:
    """Keys as harness.engine.evaluate.evaluate returns them (the trainer logs them as a row and stores
    them as summary initial_eval / final_eval)."""
    e = {"eval/arith/acc": round(acc_arith, 4), "eval/arith/answered": 0.97, "eval/arith/truncated": 0.01,
         "eval/arith/num_problems": 200, "eval/arith/seconds": round(float(rng.uniform(1, 2)), 3),
         "eval/gsm8k/acc": round(acc_gsm, 4)}
    if n:
        e["eval/arith/mean_acc"] = round(acc_arith - 0.01, 4)
        e.update({f"eval/arith/{m}": v for m, v in _k_metrics(acc_arith, rng).items()})
    return e


def make_run(root: Path, sweep: str, algo: str, seed: int, n: int, status: str = "finished",
             unit: str = "samples", overrides: dict | None = None) -> Path:
    """One run directory; ``overrides`` are extra config sections merged in (e.g.
    ``{"train": {"lr": 1e-5}}`` or ``{"tracking": {"mlflow_uri": ...}}``)."""
    amount = {"samples": STEPS * SAMPLES_PER_STEP, "steps": STEPS}[unit]
    data = {"name": sweep, "seed": seed, "output_dir": str(root), "algorithm": algo,
            "budget": {"unit": unit, "amount": amount, "eval_points": len(EVAL_STEPS)},
            "eval": {"n": n}, "train": {"prompts_per_step": 8}, "sampling": {"samples_per_prompt": 16}}
    for section, values in (overrides or {}).items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    cfg = config_from_dict(data)
    rid = run_id(cfg)
    d = Path(root) / sweep / rid
    (d / "eval").mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    rng = _rng(algo, seed)
    start_rng = _rng("start", seed)            # the starting checkpoint depends on the seed only
    a0, g0 = 0.40 + start_rng.uniform(-0.03, 0.03), 0.10 + start_rng.uniform(-0.02, 0.02)
    initial = _eval(a0, g0, n, _rng("start-k", seed))
    last_step = STEPS if status == "finished" else 3
    rows, t, secs, toks = [], T0 + 1000 * seed + 100 * list(_LIFT).index(algo), 0.0, 0

    def counters(step):
        return {"step": step, "samples": step * SAMPLES_PER_STEP, "tokens": toks, "seconds": round(secs, 3),
                "time": round(t, 3)}

    rows.append({**counters(0), **initial})
    final = None
    peak_rss = peak_above = 0.0
    for step in range(1, last_step + 1):
        frac = step / STEPS
        dt = 0.8 + rng.uniform(0, 0.2) + (0.3 if algo == "ppo" else 0.0)
        secs += dt
        t += dt
        toks += int(SAMPLES_PER_STEP * rng.uniform(18, 24))
        reward = 0.35 + _LIFT[algo] * frac + rng.uniform(-0.03, 0.03)
        train = {"train/loss": round(float(rng.normal(0, 0.05)), 5), "train/kl": round(0.001 * step, 5),
                 "train/grad_norm": round(float(rng.uniform(0.2, 1.0)), 4), "train/clip_frac": 0.01,
                 "rollout/reward_mean": round(reward, 4), "rollout/reward_std": 0.4,
                 "rollout/len_mean": round(float(rng.uniform(15, 25)), 2)}
        if algo == "ppo":
            train["train/value_loss"] = round(float(rng.uniform(0.01, 0.1)), 4)
        rows.append({**counters(step), **train})
        if step % 4 == 0 or step == last_step:
            peak_above = max(peak_above, _MEM[algo] + 10 * seed + step)
            peak_rss = 900.0 + peak_above
            rows.append({**counters(step), "perf/peak_rss_mb": peak_rss, "perf/peak_rss_above_base_mb": peak_above,
                         "perf/rollout_seconds": round(0.6 * secs, 3), "perf/update_seconds": round(0.3 * secs, 3),
                         "perf/gen_tokens_per_s": round(toks / max(secs, 1e-9), 1)})
        if step in EVAL_STEPS:
            acc = a0 + _LIFT[algo] * frac + rng.uniform(-0.02, 0.02)
            gsm = g0 + 0.3 * _LIFT[algo] * frac + rng.uniform(-0.01, 0.01)
            e = _eval(acc, gsm, n if step == STEPS else 0, rng)
            t += 2.0  # evaluation time: wall-clock, not budget
            rows.append({**counters(step), **e})
            if step == STEPS:
                final = e
    with open(d / "metrics.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    for step, e in ((0, initial), (STEPS, final)):
        if e is None:
            continue
        with open(d / "eval" / f"arith_{step}.jsonl", "w") as f:
            for i in range(5):
                f.write(json.dumps({"id": f"arith-{i}", "question": f"{i}+{i}*2", "answer": str(3 * i),
                                    "greedy": str(3 * i), "greedy_correct": i % 2 == 0,
                                    "completions": [str(3 * i)] * 2, "correct": [True, i % 3 == 0]}) + "\n")
    consumed = {"samples": last_step * SAMPLES_PER_STEP, "tokens": toks, "steps": last_step, "seconds": round(secs, 3)}
    summary = {
        "run_id": rid, "name": sweep, "algorithm": algo, "seed": seed, "status": status,
        "budget": {"unit": unit, "amount": amount, "consumed": consumed},
        "initial_eval": initial, "final_eval": final or {},
        "peak": {"rss_mb": peak_rss, "rss_above_base_mb": peak_above, "cuda_mb": None},
        "params": {"policy": 812_416, "reference": 812_416 if algo != "rft" else 0,
                   "critic": 812_545 if algo == "ppo" else 0},
        "wall_seconds": round(t - rows[0]["time"] + 3.0, 3),
        "error": None if status == "finished" else "RuntimeError: fake out-of-memory at step 3",
        "config": to_dict(cfg),
    }
    (d / "summary.json").write_text(json.dumps(summary, indent=2))
    if status == "failed":
        (d / "error.txt").write_text("Traceback (most recent call last):\n  ...\n"
                                     "RuntimeError: fake out-of-memory at step 3\n")
    return d


def make_sweep(root: Path, sweep: str = "demo", spec=DEFAULT_SPEC, unit: str = "samples") -> Path:
    for algo, seed, n, status in spec:
        make_run(Path(root), sweep, algo, seed, n, status, unit=unit)
    return Path(root) / sweep


# --------------------------------------------------------------------------- study sweeps with per-problem records

STUDY_SAMPLES = [128 * i for i in range(9)]      # evaluation points: 0 .. 1024 samples (8 after the start)
STUDY_PROBLEMS = 500                             # held-out problems per task (accuracies in steps of 0.002)
STUDY_TASKS = ("arith", "arith_ood")


def eval_records(task: str, correct: list, curves: dict | None = None, spread: float = 0.0,
                 valid: list | None = None, golds: list | None = None) -> list[dict]:
    """Per-problem records in `evals.records`' format (completions left out, as in a trimmed
    copy): ``greedy.correct`` from ``correct``; with ``curves`` (``{"pass": [pass@1..n],
    "maj": [...]}``) every problem's ``pass@k`` / ``maj@k`` lists are those values, plus and
    minus ``spread`` on alternate problems (an even count: the mean is exactly the curve).
    ``valid``: the greedy items' ``valid`` flags; ``golds``: the gold answers (default ``str(i)``)."""
    recs = []
    for i, ok in enumerate(correct):
        gold = golds[i] if golds else str(i)
        rec = {"id": f"{task}-{i}", "question": None, "gold": gold,
               "greedy": {"completion": None, "answer": gold if ok else "x", "key": gold if ok else "x",
                          "correct": bool(ok), "finished": True, "num_tokens": 12},
               "samples": []}
        if valid is not None:
            rec["greedy"]["valid"] = bool(valid[i])
        if curves:
            sign = spread if i % 2 == 0 else -spread
            for kind in ("pass", "maj"):
                rec[f"{kind}@k"] = [min(1.0, max(0.0, v + (sign if 0 < v < 1 else 0.0))) for v in curves[kind]]
        recs.append(rec)
    return recs


def greedy_pattern(acc: float, n: int, key: tuple, jitter: float = 0.3) -> list[bool]:
    """Which of ``n`` problems a greedy run gets right at accuracy ``acc`` (exactly
    ``round(acc * n)`` of them): problems have a fixed difficulty order (shared by every run,
    so arms and seeds agree on most problems, as on a real test set), jittered per ``key``."""
    difficulty = _rng("difficulty", n).permutation(n) / n
    score = difficulty + jitter * _rng(*key).uniform(0, 1, n)
    k = int(round(acc * n))
    right = set(np.argsort(score, kind="stable")[:k].tolist())
    return [i in right for i in range(n)]


def sample_records(task: str, problems: list, golds: list | None = None) -> list[dict]:
    """Records with samples, valid-step flags included: ``problems`` is one list per problem of
    ``(correct, valid)`` per sample (every sample of a problem answers the gold, or "x" when
    wrong); the greedy item is the first sample. ``num_correct`` / ``num_valid`` are counted."""
    recs = []
    for i, items in enumerate(problems):
        gold = golds[i] if golds else str(i)
        samples = [{"completion": None, "answer": gold if ok else "x", "key": gold if ok else "x", "correct": ok,
                    "finished": True, "num_tokens": 10, "valid": ok and va} for ok, va in items]
        recs.append({"id": f"{task}-{i}", "question": None, "gold": gold, "greedy": dict(samples[0]),
                     "samples": samples, "num_correct": sum(s["correct"] for s in samples),
                     "num_valid": sum(s["valid"] for s in samples)})
    return recs


def _study_evals(v: dict, ks: tuple) -> dict:
    e = {"eval/arith/acc": v["acc"], "eval/arith/mean_acc": v["acc"], "eval/arith_ood/acc": v["ood"],
         "eval/arith/seconds": 1.5, "eval/arith_ood/seconds": 0.5,
         "eval/arith/num_problems": STUDY_PROBLEMS, "eval/arith_ood/num_problems": STUDY_PROBLEMS}
    for k, p, m in zip(ks, v["pass"], v["maj"]):
        e.update({f"eval/arith/pass@{k}": p, f"eval/arith/maj@{k}": m,
                  f"eval/arith_ood/pass@{k}": min(1.0, p - 0.2), f"eval/arith_ood/maj@{k}": m - 0.2})
    for key, task in (("valid_acc", "arith"), ("ood_valid", "arith_ood")):
        if key in v:
            e[f"eval/{task}/valid_acc"] = v[key]
    return e


def make_study_run(root: Path, algo: str, seed: int, *, start: dict, final: dict, rss: float,
                   iterative: bool = False, reward_model: dict | None = None, samples=STUDY_SAMPLES,
                   records: bool = True, spread: float = 0.01, flops_per_sample: float | None = None,
                   uncontended: bool = False, arm_key: str | None = None, lr: float | None = None,
                   kl_coef: float | None = None, val_acc: float | None = None, start_val_acc: float | None = None,
                   provenance: dict | None = None,
                   started: float | None = None, wall: float | None = None, config: dict | None = None) -> Path:
    """One finished study run: summary.json, metrics.jsonl (evaluation rows at ``samples``,
    accuracy rising from ``start`` to ``final`` along a saturating curve) and, with ``records``,
    the per-problem records of the start and final evaluations of both tasks, consistent with
    the summary (their means are its accuracies, pass@K and maj@K). ``start`` / ``final``:
    ``{"acc", "ood", "pass": [pass@1..], "maj": [maj@1..]}`` (K = 1..len). ``reward_model``: the
    config section (``{"type": "prm", "rounds": 4}``); ``flops_per_sample``: a ``flops``
    counter on every row; ``uncontended``: the summary's ``timing.uncontended`` flag. ``start`` /
    ``final`` may add ``valid_acc`` / ``ood_valid`` (greedy valid-step accuracies: the records'
    greedy ``valid`` flags, the first correct problems in order). ``lr`` / ``kl_coef``: config
    ``train.lr`` / ``algorithm.kl_coef``; ``val_acc``: a ``final_val_eval`` (a selection run, with
    ``task.disjoint_validation``); ``start_val_acc``: an ``initial_val_eval`` beside it; ``provenance``: the summary's; ``started`` / ``wall``: the
    summary's ``started`` and ``ended = started + wall``; ``config``: sections merged into the run's config
    (``{"train": {"staleness": 8}}``)."""
    ks = tuple(range(1, len(final["pass"]) + 1))
    initial, fin = _study_evals(start, ks), _study_evals(final, ks)
    arm_key = arm_key or f"{algo}{iterative}{reward_model}"
    d = Path(root) / f"{algo}-s{seed}-{zlib.crc32(arm_key.encode()):08x}"
    (d / "eval").mkdir(parents=True)
    g = [0.0] + [1 / (1 + (300 / c) ** 1.5) for c in samples[1:]]
    rows = []
    for c, gi in zip(samples, g):
        sec = c / 128 * (10.0 + seed)
        ev = initial if c == 0 else (fin if c == samples[-1] else
                                     {"eval/arith/acc": start["acc"] + (final["acc"] - start["acc"]) * gi / g[-1],
                                      "eval/arith_ood/acc": start["ood"] + (final["ood"] - start["ood"]) * gi / g[-1]})
        row = {"samples": c, "tokens": 20 * c, "step": c // 128, "seconds": sec}
        if flops_per_sample:
            row["flops"] = flops_per_sample * c
        rows.append({**row, **ev})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if records:
        last = rows[-1]["step"]
        for step, v in ((0, start), (last, final)):
            who = ("start",) if step == 0 else (arm_key,)
            for task, acc in (("arith", v["acc"]), ("arith_ood", v["ood"])):
                curves = None
                if task == "arith":
                    curves = {"pass": v["pass"], "maj": v["maj"]}
                else:
                    curves = {"pass": [min(1.0, p - 0.2) for p in v["pass"]], "maj": [m - 0.2 for m in v["maj"]]}
                correct = greedy_pattern(acc, STUDY_PROBLEMS, (*who, seed, task))
                vkey = "valid_acc" if task == "arith" else "ood_valid"
                valid = None
                if vkey in v:
                    right = [i for i, ok in enumerate(correct) if ok][:int(round(v[vkey] * STUDY_PROBLEMS))]
                    valid = [i in set(right) for i in range(STUDY_PROBLEMS)]
                recs = eval_records(task, correct, curves, spread, valid=valid)
                (d / "eval" / f"{task}_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    extra = config or {}
    config = {"name": "study", "seed": seed, "algorithm": {"name": algo, "ref_reset_every": 4 if iterative else 0},
              "task": {"name": "arith"}, "budget": {"unit": "samples", "amount": samples[-1]}}
    if reward_model:
        config["reward_model"] = dict(reward_model)
    if lr is not None:
        config["train"] = {"lr": lr}
    if kl_coef is not None:
        config["algorithm"]["kl_coef"] = kl_coef
    if val_acc is not None:
        config["task"]["disjoint_validation"] = True
    for section, values in extra.items():
        config[section] = {**config.get(section, {}), **values}
    summary = {"run_id": d.name, "name": "study", "algorithm": algo, "seed": seed, "status": "finished",
               "config": config, "initial_eval": initial, "final_eval": fin,
               "budget": {"unit": "samples", "amount": samples[-1],
                          "consumed": {"samples": samples[-1], "seconds": rows[-1]["seconds"]}},
               "peak": {"rss_mb": rss, "rss_above_base_mb": rss - 200, "cuda_mb": None},
               "params": {"policy": 812416}, "start": {"cached": seed != 0, "seconds": 100.0},
               "wall_seconds": rows[-1]["seconds"] + 50.0, "perf": {"perf/peak_rss_mb": rss}}
    if uncontended:
        summary["timing"] = {"uncontended": True}
    if val_acc is not None:
        summary["final_val_eval"] = {"eval/arith/acc": val_acc, "eval/arith/num_problems": 500}
    if start_val_acc is not None:
        summary["initial_val_eval"] = {"eval/arith/acc": start_val_acc, "eval/arith/num_problems": 500}
    if provenance is not None:
        summary["provenance"] = provenance
    if started is not None:
        summary.update(started=started, ended=started + (wall if wall is not None else 100.0))
    (d / "summary.json").write_text(json.dumps(summary))
    return d
