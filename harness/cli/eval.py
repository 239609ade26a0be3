"""`harness eval`: evaluate a local model on gsm8k / math / math500 / arith.

Writes ``<out>/<task>_metrics.json`` (metrics + the settings used) and ``<out>/<task>.jsonl``
(per-problem records, see :mod:`evals.records`) and prints a small table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from evals.catalog import get_task
from harness.cli.checks import check_device, check_output_dir
from harness.report.format import number, table
from harness.config.schema import TaskConfig
from harness.engine.evaluate import evaluate
from harness.engine.models import load_policy, resolve_device

TASKS = ("gsm8k", "math", "math500", "arith")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="evaluate a model: greedy accuracy, pass@k, maj@k",
        description="Evaluate a local causal LM (Hugging Face directory or GGUF) on a task. Greedy accuracy, "
                    "and with --n > 0 the pass@k / maj@k curves for k = 1..n. Nothing is downloaded.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, help="local model directory (or a .gguf file)")
    p.add_argument("--gguf-file", default=None, help="GGUF file name inside --model")
    p.add_argument("--task", default="gsm8k", choices=TASKS, help="task to evaluate on")
    p.add_argument("--data", default=None,
                   help="data file or folder (default: shared/data found up from here, or $GRPO_HARNESS_DATA); "
                        "hf:<name>[:<config>] loads a hub dataset (online)")
    p.add_argument("--limit", type=int, default=0, help="first N test problems (0 = all)")
    p.add_argument("--few-shot", type=int, default=0, help="worked examples from the train split in each prompt")
    p.add_argument("--n", type=int, default=0, help="samples per problem for pass@k / maj@k (0 = greedy only)")
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy completion")
    p.add_argument("--temperature", type=float, default=1.0, help="temperature of the n samples")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass of the n samples")
    p.add_argument("--max-new-tokens", type=int, default=512, help="completion length limit")
    p.add_argument("--batch-size", type=int, default=64, help="sequences decoded at once")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--out", default=None, help="output folder (default: results/eval/<task>-<model name>)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = library default)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def format_table(metrics: dict, task: str) -> str:
    """A short table: greedy numbers, then pass@k / maj@k at k = 1, 2, 4, ..., n."""
    ns = f"eval/{task}/"
    rows = []
    for key in ("num_problems", "acc", "answered", "truncated", "gen_tokens", "mean_acc"):
        if ns + key in metrics:
            rows.append((key, number(metrics[ns + key], ".4f")))
    n = max([int(k.split("@")[1]) for k in metrics if k.startswith(ns + "pass@")] or [0])
    ks = sorted({k for k in (2 ** i for i in range(12)) if k <= n} | ({n} if n else set()))
    if ks:
        rows.append(("k", "pass@k / maj@k"))
        for k in ks:
            rows.append((f"  {k}", number(metrics[f"{ns}pass@{k}"], ".4f", int_spec=".4f") + " / "
                         + number(metrics[f"{ns}maj@{k}"], ".4f", int_spec=".4f")))
    if ns + "seconds" in metrics:
        rows.append(("seconds", number(metrics[ns + "seconds"], ".1f", int_spec=".1f")))
    return table(None, rows)


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    for name, v, lo in (("--n", args.n, 0), ("--limit", args.limit, 0), ("--few-shot", args.few_shot, 0),
                        ("--max-new-tokens", args.max_new_tokens, 1), ("--batch-size", args.batch_size, 1)):
        if v < lo:
            print(f"harness eval: {name} must be >= {lo}, got {v}", file=sys.stderr)
            return 2
    if args.no_greedy and args.n == 0:
        print("harness eval: --no-greedy with --n 0 evaluates nothing: give --n >= 1 or drop --no-greedy",
              file=sys.stderr)
        return 2
    if args.temperature <= 0:
        print(f"harness eval: --temperature must be > 0, got {args.temperature}", file=sys.stderr)
        return 2
    check_device(args.device, "--device")
    if args.out:
        check_output_dir(args.out, "--out")
    # --limit 0: the whole test split (arith generates its default held-out set)
    size = args.limit if args.limit > 0 else (TaskConfig().eval_size if args.task == "arith" else 10**9)
    task = get_task(TaskConfig(name=args.task, data_path=args.data, few_shot=args.few_shot,
                               eval_size=size, seed=args.seed))
    problems = task.eval_problems()
    model_name = Path(args.gguf_file or args.model.rstrip("/")).stem
    out = Path(args.out) if args.out else Path("results") / "eval" / f"{args.task}-{model_name}"
    model, tok = load_policy(args.model, gguf_file=args.gguf_file, dtype=args.dtype)
    model.to(resolve_device(args.device))
    t0 = time.time()
    metrics = evaluate(model, tok, task, problems, greedy=not args.no_greedy, n=args.n,
                       temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                       seed=args.seed, batch_size=args.batch_size, out_path=out / f"{args.task}.jsonl",
                       progress=not args.no_progress)
    meta = {"model": args.model, "gguf_file": args.gguf_file, "task": args.task, "data": args.data,
            "limit": args.limit, "few_shot": args.few_shot, "n": args.n, "greedy": not args.no_greedy,
            "temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens,
            "seed": args.seed, "batch_size": args.batch_size, "time": t0}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.task}_metrics.json").write_text(json.dumps({"metrics": metrics, "settings": meta}, indent=1))
    print(f"{args.task}: {model_name}")
    print(format_table(metrics, args.task))
    print(f"wrote {out / (args.task + '_metrics.json')} and {out / (args.task + '.jsonl')}")
    return 0
