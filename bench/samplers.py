"""Sampler throughput: generated tokens/s of each sampler backend (``hf``, ``paged``, and ``vllm``
where it imports) at several row counts and completion lengths, forced length, fresh processes.

    python bench/samplers.py                                  # quickstart model, rows 1,8,16,64, 24 and 128 new tokens
    python bench/samplers.py --shape 27m --rows 8,64 --lengths 128 --rounds 2
    python bench/samplers.py --device cuda --rows 8,64,256    # on a CUDA machine (vllm joins where it imports)

What is timed is one ``harness.engine.sampling.sample(..., backend=B)`` call, as the training loop
makes it: rows = prompts x G (G = ``--group``, or rows itself below G), every row exactly
``--length`` new tokens (the tokenizer's EOS id is hidden: ``bench._common.NoStopTokenizer``), so
every backend does the same work. Prompts are the quickstart task's training prompts (the same
for every backend); tokens/s = rows x length / seconds of the call (the rollouts' assembly and,
for engines that do not return log-probs, the scoring forward included).

Method: ``--rounds`` rounds; in each, one fresh worker process per backend (the order flips every
round), pinned to ``--threads`` intra-op threads in the harness's numerics mode (``bench._common``:
portable unless GRPO_HARNESS_NUMERICS=native). A worker runs every (rows, length) cell:
``--warmup`` untimed calls, then ``--reps`` timed ones. Printed per cell and backend: tokens/s,
median of all timed calls [min-max of the per-round medians]; the ratio to ``hf`` from the
per-round medians (median [min-max]); and the winner. The load average is printed before, after
every worker and at the end: on a shared machine the figures move with it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from _common import (NUMERICS, ROOT, NoStopTokenizer, finish, fmt, fmt_spread, loadavg, median,  # first: numerics
                     numerics_line, print_table, run_rounds, spread)
import torch
import transformers

from evals.catalog import get_task
from harness.config.schema import ModelConfig, load_config
from harness.engine import vllm_sampler
from harness.engine.models import build_char_tokenizer, build_tiny_model, load_policy, num_params, save_policy
from harness.engine.sampling import BACKENDS, sample
from harness.foundation.base import ConfigError

QUICKSTART = ROOT / "harness" / "configs" / "quickstart.yaml"
SHAPES = {
    "quickstart": None,  # the quickstart config's model (0.87M parameters)
    "27m": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "intermediate_size": 1536, "max_length": 256},
}
"""``--shape``: the model measured (random init, character tokenizer). ``27m`` is the 27.3M shape of
bench/README.md's 128-token GRPO-step comparison."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's default prints the whole usage first)
        print(f"bench/samplers.py: {message}", file=sys.stderr)
        sys.exit(2)


def _bad(message: str):
    print(f"bench/samplers.py: {message}", file=sys.stderr)
    sys.exit(2)


def _ints(flag: str, text: str) -> list[int]:
    try:
        out = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        _bad(f"{flag}: expected positive integers separated by commas, got {text!r}")
    return out


def parse_args(argv=None):
    ap = _Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="all",
                    help=f"comma list of {', '.join(BACKENDS)}; 'all' (default): hf, paged, and vllm where it imports "
                         "and the device is cuda")
    ap.add_argument("--rows", default="1,8,16,64", help="sequences per sample() call, comma list (default 1,8,16,64)")
    ap.add_argument("--lengths", default="24,128", help="new tokens per row, comma list (default 24,128)")
    ap.add_argument("--group", type=int, default=8, help="G: samples per prompt (rows >= G must be multiples of G)")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="quickstart", help="model shape (default quickstart)")
    ap.add_argument("--model", action="append", default=[], metavar="KEY=VALUE",
                    help="ModelConfig override on top of --shape, e.g. --model num_layers=2")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds, one fresh process per backend each")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls per cell and process")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per cell and process")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker (default 1)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per worker process")
    ap.add_argument("--json", metavar="OUT", help="also write the figures to this JSON file")
    # internal
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.rows_list, a.lengths_list = _ints("--rows", a.rows), _ints("--lengths", a.lengths)
    for flag, v in (("--group", a.group), ("--rounds", a.rounds), ("--reps", a.reps), ("--threads", a.threads)):
        if v < 1:
            _bad(f"{flag}: must be >= 1, got {v}")
    if a.warmup < 0:
        _bad(f"--warmup: must be >= 0, got {a.warmup}")
    if a.temperature <= 0:
        _bad(f"--temperature: must be > 0, got {a.temperature}")
    odd = [r for r in a.rows_list if r > a.group and r % a.group]
    if odd:
        _bad(f"--rows: {odd[0]} is above the group size {a.group} and not a multiple of it (rows = prompts x G)")
    a.backend_list = resolve_backends(a.backends, a.device)
    if a.device == "cuda" and not a.worker and not torch.cuda.is_available():
        _bad("--device cuda: no CUDA device here")
    return a


def resolve_backends(text: str, device: str) -> list[str]:
    """The backends ``--backends`` names ('all': hf, paged, and vllm where it imports on cuda)."""
    if text.strip() == "all":
        return ["hf", "paged"] + (["vllm"] if vllm_sampler.available() and device == "cuda" else [])
    names = [t.strip() for t in text.split(",") if t.strip()]
    for n in names:
        if n not in BACKENDS:
            _bad(f"--backends: unknown backend {n!r}; choose from {', '.join(BACKENDS)} or 'all'")
        if n == "vllm" and not vllm_sampler.available():
            _bad(f"--backends: vllm is not available here ({vllm_sampler.unavailable_reason()})")
    if not names:
        _bad("--backends: empty")
    return names


def rows_split(rows: int, group: int) -> tuple[int, int]:
    """(prompts, samples per prompt) of ``rows`` sequences: G per prompt, or one prompt below G."""
    n = min(rows, group)
    return rows // n, n


def model_config(a) -> ModelConfig:
    """The measured model's shape: the quickstart config's model, ``--shape``, then ``--model`` overrides."""
    shape = [f"model.{k}={v}" for k, v in (SHAPES[a.shape] or {}).items()]
    try:
        return load_config(QUICKSTART, shape + [f"model.{kv}" for kv in a.model]).model
    except ConfigError as e:
        _bad(f"--model: {e}")


# ----------------------------------------------------------------------------------------------
# worker
# ----------------------------------------------------------------------------------------------
def cell_prompts(task, rows: int, group: int, k: int, seed: int) -> tuple[list[str], int]:
    """The prompts of call ``k`` of a cell (the same for every backend) and G."""
    n_prompts, n = rows_split(rows, group)
    problems = task.sample_train(random.Random(seed * 1_000_003 + rows * 1009 + k), n_prompts)
    return [task.format_prompt(p) for p in problems], n


def measure(backend: str, model, tokenizer, task, cells: list[tuple[int, int]], group: int, warmup: int,
            reps: int, temperature: float, seed: int) -> list[dict]:
    """Every (rows, length) cell: ``warmup`` untimed then ``reps`` timed ``sample`` calls at forced
    length. Returns one dict per cell: rows, length, seconds (timed calls), tokens (per call)."""
    stok = NoStopTokenizer(tokenizer)
    cuda = next(model.parameters()).device.type == "cuda"
    out = []
    for rows, length in cells:
        secs, toks = [], []
        for k in range(warmup + reps):
            prompts, n = cell_prompts(task, rows, group, k, seed)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            ro = sample(model, stok, prompts, n=n, max_new_tokens=length, temperature=temperature,
                        seed=seed + k, offsets=False, backend=backend)
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if k >= warmup:
                secs.append(dt)
                toks.append(ro.num_tokens)
        out.append({"rows": rows, "length": length, "seconds": secs, "tokens": toks})
    return out


def worker(a) -> dict:
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    model, tok = load_policy(a.model_dir)
    model.to(device).eval()
    task = get_task(load_config(QUICKSTART).task)
    cells = [(r, L) for L in a.lengths_list for r in a.rows_list]
    res = measure(a.worker, model, tok, task, cells, a.group, a.warmup, a.reps, a.temperature, a.seed)
    return {"backend": a.worker, "cells": res, "threads": torch.get_num_threads(), "device": str(device)}


# ----------------------------------------------------------------------------------------------
# summary
# ----------------------------------------------------------------------------------------------
def summarize(results: dict) -> list[dict]:
    """Per (rows, length) cell and backend: tokens/s over all timed calls (median) and per round
    (the round's median call); the ratio to ``hf`` per round (paired by round) and the winner.
    ``results``: {backend: [worker result with its "round"]}."""
    table: dict = {}
    for backend, workers in results.items():
        for w in workers:
            for c in w["cells"]:
                e = table.setdefault((c["rows"], c["length"]), {}).setdefault(
                    backend, {"calls": [], "rounds": {}, "tokens": set()})
                tps = [t / s for t, s in zip(c["tokens"], c["seconds"])]
                e["calls"] += tps
                e["rounds"][w["round"]] = median(tps)
                e["tokens"].update(c["tokens"])
    out = []
    for (rows, length), per in sorted(table.items()):
        row = {"rows": rows, "length": length, "backends": {}}
        for b, e in per.items():
            _, lo, hi = spread(list(e["rounds"].values()))
            row["backends"][b] = {"tokens_per_s": median(e["calls"]), "round_median_min": lo, "round_median_max": hi,
                                  "per_round": [e["rounds"][r] for r in sorted(e["rounds"])],
                                  "tokens_per_call": sorted(e["tokens"])}
            if b != "hf" and "hf" in per:
                paired = [e["rounds"][r] / per["hf"]["rounds"][r] for r in sorted(e["rounds"])
                          if r in per["hf"]["rounds"]]
                row["backends"][b]["ratio_to_hf"] = paired
        row["winner"] = max(row["backends"], key=lambda b: row["backends"][b]["tokens_per_s"])
        out.append(row)
    return out


def print_summary(summary: list[dict], backends: list[str]) -> None:
    headers = ["rows", "new tokens"] + [f"{b} tok/s" for b in backends] + \
              [f"{b}/hf" for b in backends if b != "hf"] + ["winner"]
    rows = []
    for s in summary:
        r = [str(s["rows"]), str(s["length"])]
        for b in backends:
            e = s["backends"].get(b)
            r.append("-" if e is None else
                     f"{fmt(e['tokens_per_s'], '.0f')} [{fmt(e['round_median_min'], '.0f')}-"
                     f"{fmt(e['round_median_max'], '.0f')}]")
        for b in backends:
            if b != "hf":
                e = s["backends"].get(b)
                r.append(fmt_spread(e.get("ratio_to_hf", []), ".2f") if e else "-")
        r.append(s["winner"])
        rows.append(r)
    print_table(headers, rows)
    print("(tok/s: median of all timed calls [min-max of the per-round medians]; ratio: per-round medians paired "
          "by round, median [min-max])")


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        res = worker(a)
        res["loadavg_end"] = loadavg()
        Path(a.worker_out).write_text(json.dumps(res))
        return 0
    la0 = loadavg()
    mcfg = model_config(a)
    tok = build_char_tokenizer()
    model = build_tiny_model(mcfg, tok, seed=a.seed)
    n_params = num_params(model)
    print(f"# sampler throughput | model {n_params / 1e6:.2f}M params ({a.shape}: hidden {mcfg.hidden_size}, layers "
          f"{mcfg.num_layers}, heads {mcfg.num_heads}, inter {mcfg.intermediate_size}), random init, char tokenizer")
    print(f"# backends {a.backend_list}, rows {a.rows_list} (G={a.group}), new tokens {a.lengths_list} (forced), "
          f"T={a.temperature}, device {a.device}, {a.threads} thread(s) per worker, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print(f"# {a.rounds} rounds x ({a.warmup} warm-up + {a.reps} timed calls per cell), one fresh process per "
          f"backend each, order flipping | loadavg at start {la0} on {os.cpu_count()} CPUs")
    print(f"# {numerics_line()}", flush=True)
    if "vllm" not in a.backend_list:
        why = vllm_sampler.unavailable_reason() or "the device is not cuda"
        print(f"# vllm: not measured ({why.splitlines()[0][:160]})", flush=True)
    errors: list[str] = []
    loads = [la0]
    common = ["--rows", a.rows, "--lengths", a.lengths, "--group", str(a.group), "--warmup", str(a.warmup),
              "--reps", str(a.reps), "--threads", str(a.threads), "--device", a.device,
              "--temperature", str(a.temperature), "--seed", str(a.seed), "--backends", ",".join(a.backend_list)]

    def describe(b, res):
        total = sum(sum(c["seconds"]) for c in res["cells"])
        return f"{b}: {len(res['cells'])} cells, {total:.1f} s timed"

    with tempfile.TemporaryDirectory(prefix="samplers-bench-model-") as mdir:
        save_policy(model, tok, mdir)
        del model
        order = a.backend_list
        results = run_rounds(__file__, lambda r: order if r % 2 == 0 else order[::-1],
                             ["--model-dir", mdir, *common], a, describe, errors, loads)
    summary = summarize({b: v for b, v in results.items() if v})
    print()
    if summary:
        print_summary(summary, [b for b in a.backend_list if results.get(b)])
    out = {"settings": {k: v for k, v in vars(a).items() if k not in ("worker", "model_dir", "worker_out")},
           "numerics": NUMERICS, "model_params": n_params, "model_config": dataclasses.asdict(mcfg),
           "loadavg_start": la0, "summary": summary, "raw": results, "errors": errors,
           "torch": torch.__version__, "transformers": transformers.__version__,
           "date": time.strftime("%Y-%m-%d")}
    return finish(out, errors, loads, a.json)


if __name__ == "__main__":
    sys.exit(main())
