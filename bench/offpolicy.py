"""Off-policy training on CPU (issue 46): the sampler/learner mismatch a correction has to correct, and the
wall-clock of a pipelined run (train.staleness = 1) against the on-policy loop (k = 0).

    python bench/offpolicy.py mismatch                 # quickstart start checkpoint: samplers vs the float32 learner
    python bench/offpolicy.py timing --pairs 2         # k = 0 vs k = 1 quickstart runs, alternating, fresh processes
    python bench/offpolicy.py overlap                  # how much a sampler thread and the learner overlap in-process
    python bench/offpolicy.py diagnostics results/reference/offpolicy   # the sweep's mismatch and time per arm

mismatch: the quickstart's starting checkpoint (its warm-up, cached under --output-dir; built there if absent)
samples the quickstart's first stage (32 prompts x 8, 40 new tokens, T = 1) with each sampler: ``hf`` on a
float32 copy (the control: the same kernels as the learner up to the decode path), ``hf`` on a bfloat16 copy
(``sampling.dtype=bfloat16``) and ``paged`` (transformers' continuous batching) on float32. The learner's
float32 log-probs of the same tokens (``harness.engine.learner.token_logprobs``) are the proximal policy; per
sampler: mean |log pi_learner - log pi_sampler|, the k3 KL(sampler || learner) per token
(``algorithms.corrections.mismatch_stats``), the token ratio's p10 / p50 / p90 / max, the share of tokens a
token mask at C = 2 (and 1.25) would drop and the share of sequences a sequence mask at C = 2 would drop.

overlap: the quickstart model's shape (random weights: speed only), one stage's work each: the sampler (32 prompts
x 8, exactly 40 new tokens) and a learner step on its rollouts, alone and then at once (the sampler in a thread
with its own --sampler-threads, the learner on --threads, as harness.train.pipeline runs them), --reps times;
overlap = (sampler alone + learner alone) / both at once (2 = perfect overlap, 1 = none). --process: the sampler
in a spawned process instead (what a sampler process of the pipeline would get: no shared interpreter).

diagnostics: per arm (train.staleness x algorithm.correction) of a finished sweep (sweeps/offpolicy.yaml, or its
export), over its seeds: final greedy accuracy, the run's mean and largest mismatch KL per token (the mean over its
steps of ``offpolicy/mismatch_kl``; the largest step), the largest raw ratio of any step, the mean share of tokens
truncated or masked, training seconds (the budget's ``seconds`` counter: evaluation excluded) and wall-clock; each
as the mean over seeds with the seeds' range. Reads run folders only (nothing is trained).

timing: ``harness train`` of the quickstart config at a short budget (--samples, default 2,048 = 8 stages),
evaluation only at the end, no model saved, in fresh processes, k = 0 and k = 1 alternating (the order flips
every pair). Per run: training seconds (the budget's ``seconds`` counter: the stages' wall-clock, evaluation
excluded) and samples per training second; the ratio k = 1 / k = 0 per pair. The load average is printed: on
a shared machine the figures move with it.
"""
from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from concurrent.futures import ThreadPoolExecutor

from _common import NUMERICS, ROOT, NoStopTokenizer, loadavg, numerics_line  # first: numerics
import torch

from algorithms.corrections import log_sequence_ratio, mismatch_stats
from algorithms.presets import resolve
from evals.catalog import get_task
from harness.config.schema import load_config, settings
from harness.engine.learner import Learner, make_batch, token_logprobs
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.perf import PerfTracker
from harness.engine.sampling import sample
from harness.rundir.read import find_run_dirs, load_run
from harness.train.pipeline import own_threads
from harness.train.stage import stage_problems, stage_seed
from harness.train.warmup import starting_checkpoint

QUICKSTART = str(ROOT / "harness/configs/quickstart.yaml")


def _cfg(output_dir: str, sets=()):
    return load_config(QUICKSTART, [f"output_dir={output_dir}", *sets])


def _mismatch_row(name: str, policy, ro) -> dict:
    with torch.no_grad():
        learner = token_logprobs(policy, make_batch(ro, "cpu"), 1.0)
    mask = ro.completion_mask.float()
    mm = mismatch_stats(learner, ro.logprobs.float(), mask)
    r = mm.ratios.double()
    seq = torch.exp(log_sequence_ratio(learner, ro.logprobs.float(), mask)[:, 0])
    q = torch.quantile(r, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist() if r.numel() else [0, 0, 0]
    return {"sampler": name, "tokens": int(mm.tokens), "logp_abs_diff": mm.abs_diff_sum / mm.tokens,
            "mismatch_kl": mm.kl_sum / mm.tokens, "ratio_p10": q[0], "ratio_p50": q[1], "ratio_p90": q[2],
            "ratio_max": mm.ratio_max, "token_mask_c2": float(((r < 0.5) | (r > 2)).double().mean()),
            "token_mask_c1.25": float(((r < 0.8) | (r > 1.25)).double().mean()),
            "seq_mask_c2": float(((seq < 0.5) | (seq > 2)).double().mean())}


def mismatch(a) -> dict:
    torch.set_num_threads(a.threads)
    cfg = _cfg(a.output_dir)
    task = get_task(cfg.task)
    policy, tok, info = starting_checkpoint(cfg, task, torch.device("cpu"), False)
    task.bind_tokenizer(tok)
    sc = cfg.sampling
    problems = stage_problems(task, cfg.seed, 0, cfg.train.prompts_per_step)
    prompts = [task.format_prompt(p) for p in problems]
    rows = []
    for name, dtype, backend in (("hf float32 (control)", torch.float32, "hf"),
                                 ("hf bfloat16", torch.bfloat16, "hf"), ("paged float32", torch.float32, "paged")):
        model = copy.deepcopy(policy).to(dtype)
        t0 = time.perf_counter()
        ro = sample(model, tok, prompts, n=sc.samples_per_prompt, max_new_tokens=sc.max_new_tokens,
                    temperature=sc.temperature, seed=stage_seed(cfg.seed, 0), offsets=False, backend=backend)
        row = _mismatch_row(name, policy, ro)
        row["sample_seconds"] = time.perf_counter() - t0
        rows.append(row)
        print(" | ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    return {"start": info.get("source"), "rows": rows}


def _train_once(a, k: int, out: str) -> dict:
    sets = [f"output_dir={out}", f"warmup.cache_dir={a.output_dir}/_cache/warmup", "budget.unit=samples",
            f"budget.amount={a.samples}", "budget.eval_points=1", "eval.n=0", "train.save_final_model=false",
            f"train.threads={a.threads}", f"train.staleness={k}"]
    argv = [sys.executable, "-m", "harness.cli.main", "train", QUICKSTART, "--no-progress"]
    argv += [x for s in sets for x in ("--set", s)]
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=a.timeout)
    wall = time.monotonic() - t0
    if proc.returncode:
        raise RuntimeError(f"k={k} failed:\n{proc.stderr[-2000:]}")
    run = next(Path(out).glob("quickstart/*/metrics.jsonl"))
    rows = [json.loads(x) for x in run.read_text().splitlines()]
    seconds = max(r.get("seconds", 0.0) for r in rows)
    samples = max(r.get("samples", 0) for r in rows)
    waits = [r["perf/sample_wait_seconds"] for r in rows if "perf/sample_wait_seconds" in r]
    return {"k": k, "train_seconds": seconds, "samples": samples, "samples_per_s": samples / seconds,
            "process_wall": wall, "wait_seconds": sum(waits), "load": loadavg()[0]}


def timing(a) -> dict:
    pairs = []
    for i in range(a.pairs):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        got = {}
        for k in order:
            with tempfile.TemporaryDirectory(prefix="offpolicy-") as td:
                got[k] = _train_once(a, k, td)
            print(f"pair {i} k={k}: {got[k]['train_seconds']:.1f} s training, {got[k]['samples_per_s']:.1f} "
                  f"samples/s, waited {got[k]['wait_seconds']:.1f} s, load {got[k]['load']:.2f}", flush=True)
        ratio = got[1]["samples_per_s"] / got[0]["samples_per_s"]
        print(f"pair {i}: k=1 / k=0 samples per second = {ratio:.3f}", flush=True)
        pairs.append({"order": list(order), "runs": [got[0], got[1]], "speedup": ratio})
    return {"pairs": pairs}


def _sampler_process(conn, threads: int, output_dir: str) -> None:
    """--process: a sampler in a process of its own (spawned: it imports this script, so its numerics are pinned
    as the parent's), the same model and stage as the thread's; each message from ``conn`` runs one draw and
    answers its seconds."""
    torch.set_num_threads(threads)
    cfg = _cfg(output_dir)
    tok = build_char_tokenizer()
    task = get_task(cfg.task)
    task.bind_tokenizer(tok)
    model = build_tiny_model(cfg.model, tok, seed=0)
    prompts = [task.format_prompt(p) for p in stage_problems(task, cfg.seed, 0, cfg.train.prompts_per_step)]
    while conn.recv():
        t0 = time.perf_counter()
        sample(model, NoStopTokenizer(tok), prompts, n=cfg.sampling.samples_per_prompt,
               max_new_tokens=cfg.sampling.max_new_tokens, seed=1, offsets=False)
        conn.send(time.perf_counter() - t0)


def _process_draw(conn) -> float:
    conn.send(True)
    return conn.recv()


def overlap(a) -> dict:
    torch.set_num_threads(a.threads)
    cfg = _cfg(a.output_dir)
    tok = build_char_tokenizer()
    task = get_task(cfg.task)
    task.bind_tokenizer(tok)
    policy = build_tiny_model(cfg.model, tok, seed=0)
    sampler_model = copy.deepcopy(policy)
    prompts = [task.format_prompt(p) for p in stage_problems(task, cfg.seed, 0, cfg.train.prompts_per_step)]
    draw = lambda: sample(sampler_model, NoStopTokenizer(tok), prompts, n=cfg.sampling.samples_per_prompt,  # noqa: E731
                          max_new_tokens=cfg.sampling.max_new_tokens, seed=1, offsets=False)
    ro = sample(policy, tok, prompts, n=cfg.sampling.samples_per_prompt, max_new_tokens=40, seed=1, offsets=False)
    rewards = torch.tensor([float(i % 3 == 0) for i in range(ro.num_sequences)])
    learner = Learner(policy, resolve(cfg.algorithm), cfg, "cpu", PerfTracker())
    pool = ThreadPoolExecutor(1)
    pool.submit(own_threads, a.sampler_threads).result()
    child = None
    if a.process:  # the draw in a spawned process, driven from the pool's thread (which only waits on a pipe)
        ctx = multiprocessing.get_context("spawn")
        conn, there = ctx.Pipe()
        child = ctx.Process(target=_sampler_process, args=(there, a.sampler_threads, a.output_dir), daemon=True)
        child.start()
        _process_draw(conn)  # its start-up and first draw, untimed
        draw = lambda: _process_draw(conn)  # noqa: E731
    timed = lambda fn: (lambda t0: (fn(), time.perf_counter() - t0)[1])(time.perf_counter())  # noqa: E731
    reps = []
    for r in range(a.reps):
        s_alone = pool.submit(timed, draw).result()
        l_alone = timed(lambda: learner.step(ro, rewards, [], r))
        t0 = time.perf_counter()
        f = pool.submit(draw)
        learner.step(ro, rewards, [], r)
        f.result()
        both = time.perf_counter() - t0
        reps.append({"sampler": s_alone, "learner": l_alone, "both": both, "overlap": (s_alone + l_alone) / both,
                     "load": loadavg()[0]})
        print(" | ".join(f"{k} {v:.3f}" for k, v in reps[-1].items()), flush=True)
    pool.shutdown()
    if child is not None:
        conn.send(False)
        child.join(timeout=60)
    return {"sampler_threads": a.sampler_threads, "process": a.process, "reps": reps}


def _run_diagnostics(run) -> dict:
    rows = run.rows
    def col(k):
        return [float(r[k]) for r in rows if isinstance(r.get(k), (int, float))]
    kl, rmax = col("offpolicy/mismatch_kl"), col("offpolicy/ratio_max")
    trunc, masked = col("offpolicy/truncated_frac"), col("offpolicy/masked_frac")
    consumed = (run.summary.get("budget") or {}).get("consumed") or {}
    return {"acc": 100 * float(run.final_eval.get(f"{run.task}/acc", float("nan"))),
            "kl_mean": sum(kl) / len(kl) if kl else float("nan"), "kl_max": max(kl, default=float("nan")),
            "ratio_max": max(rmax, default=float("nan")),
            "truncated": 100 * sum(trunc) / len(trunc) if trunc else float("nan"),
            "masked": 100 * sum(masked) / len(masked) if masked else float("nan"),
            "train_s": float(consumed.get("seconds", float("nan"))), "wall_s": float(run.summary.get("wall_seconds"))}


def diagnostics(a) -> dict:
    arms: dict = {}
    for d in find_run_dirs(a.runs):
        run = load_run(d)
        if run.status != "finished":
            print(f"left out: {run.run_id}: {run.status}", file=sys.stderr)
            continue
        flat = settings(run.config)
        key = (flat["train.staleness"], flat["algorithm.correction"])
        arms.setdefault(key, {})[run.seed] = _run_diagnostics(run)
    cols = ("acc", "kl_mean", "kl_max", "ratio_max", "truncated", "masked", "train_s", "wall_s")
    fmt = {"acc": "{:.1f}", "kl_mean": "{:.1e}", "kl_max": "{:.1e}", "ratio_max": "{:.3g}", "truncated": "{:.3f}",
           "masked": "{:.3f}", "train_s": "{:.0f}", "wall_s": "{:.0f}"}
    print("k  correction  seeds  " + "  ".join(f"{c} mean [min, max]" for c in cols))
    out = []
    for (k, corr), by_seed in sorted(arms.items()):
        row = {"staleness": k, "correction": corr, "seeds": sorted(by_seed)}
        cells = []
        for c in cols:
            v = [by_seed[s][c] for s in sorted(by_seed)]
            row[c] = v
            f = fmt[c]
            cells.append(f"{f.format(sum(v) / len(v))} [{f.format(min(v))}, {f.format(max(v))}]")
        print(f"{k:<2} {corr:<11} {len(by_seed):>5}  " + "  ".join(cells))
        out.append(row)
    return {"arms": out}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("mismatch", "timing", "overlap", "diagnostics"))
    p.add_argument("runs", nargs="?", help="diagnostics: a sweep's results folder or its export")
    p.add_argument("--output-dir", default=str(ROOT / "results" / "bench" / "offpolicy"),
                   help="where the quickstart's warm-up is cached (and built if absent)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sampler-threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--process", action="store_true", help="overlap: the sampler in a process of its own")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--json")
    a = p.parse_args(argv)
    if (a.what == "diagnostics") != bool(a.runs):
        p.error("a runs folder goes with diagnostics, and only with it")
    print(numerics_line(), f"| load {loadavg()}", flush=True)
    out = {"what": a.what, "numerics": NUMERICS, "threads": a.threads, "load_before": loadavg(),
           **{"mismatch": mismatch, "timing": timing, "overlap": overlap, "diagnostics": diagnostics}[a.what](a),
           "load_after": loadavg()}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
