"""`harness train`, `harness quickstart`, `harness warmup`, `harness config`."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.config import describe, load_config

QUICKSTART = Path(__file__).resolve().parent / "configs" / "quickstart.yaml"

_SET_HELP = "override a config field, e.g. --set train.lr=1e-4 --set algorithm=ppo (repeatable)"


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def print_run(summary: dict, file=sys.stdout) -> None:
    ini, fin = summary.get("initial_eval") or {}, summary.get("final_eval") or {}
    print(f"\nrun {summary['run_id']} ({summary['status']})", file=file)
    for k in sorted(set(ini) | set(fin)):
        if k.endswith("/acc") or "@" in k:
            print(f"  {k:32s} start {_fmt(ini.get(k, '-')):>7}  ->  end {_fmt(fin.get(k, '-')):>7}", file=file)
    c = summary.get("budget", {}).get("consumed", {})
    if c:
        print("  budget consumed: " + ", ".join(f"{k}={_fmt(v)}" for k, v in c.items()), file=file)
    peak = summary.get("peak") or {}
    if peak:
        print(f"  peak RSS {peak.get('rss_mb', 0):.0f} MiB ({peak.get('rss_above_base_mb', 0):.0f} above baseline)",
              file=file)


def cmd_train(args) -> int:
    from harness.trainer import run_dir, train

    cfg = load_config(args.config, args.set)
    print(f"results: {run_dir(cfg)}")
    summary = train(cfg, resume=not args.restart, progress=not args.no_progress)
    print_run(summary)
    return 0


def cmd_quickstart(args) -> int:
    from harness.trainer import run_dir, train

    cfg = load_config(QUICKSTART, args.set)
    print("quickstart: supervised warm-up of a tiny Llama on multi-step arithmetic, then GRPO.\n"
          f"results: {run_dir(cfg)}")
    summary = train(cfg, resume=not args.restart, progress=not args.no_progress)
    print_run(summary)
    key = f"eval/{cfg.task.name}/acc"
    a0, a1 = summary["initial_eval"].get(key), summary["final_eval"].get(key)
    if a0 is not None and a1 is not None:
        print(f"\nheld-out greedy accuracy: {100 * a0:.1f}% -> {100 * a1:.1f}% ({100 * (a1 - a0):+.1f} points)")
    return 0


def cmd_warmup(args) -> int:
    import torch

    from evals.tasks import get_task
    from harness.models import resolve_device
    from harness.warmup import starting_checkpoint

    cfg = load_config(args.config, args.set)
    task = get_task(cfg.task)
    _, _, info = starting_checkpoint(cfg, task, resolve_device(cfg.device), progress=True)
    print(json.dumps({k: v for k, v in info.items() if k != "config"}, indent=2))
    return 0


def cmd_config(args) -> int:
    if args.show:
        from harness.configbase import to_dict
        import yaml

        print(yaml.safe_dump(to_dict(load_config(args.show, args.set)), sort_keys=False))
        return 0
    for name, default, doc in describe():
        print(f"{name:30s} {default:>14}  {doc}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("train", help="train one run from a YAML config",
                       description="Train one run. Results go to <output_dir>/<name>/<run_id>/ "
                                   "(config.yaml, metrics.jsonl, summary.json). Re-running resumes "
                                   "an interrupted run and skips a finished one.")
    p.add_argument("config", help="YAML config (see `harness config` for every field)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)
    p.add_argument("--restart", action="store_true", help="ignore a checkpoint / finished summary and start over")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train)

    q = sub.add_parser("quickstart", help="warm-up + GRPO on the tiny arithmetic task (CPU, minutes)",
                       description="Supervised warm-up of the built-in tiny model (cached), then GRPO; "
                                   "prints held-out greedy accuracy before and after.")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)
    q.add_argument("--restart", action="store_true", help="retrain instead of reusing a finished run")
    q.add_argument("--no-progress", action="store_true", help="no progress bars")
    q.set_defaults(func=cmd_quickstart)

    w = sub.add_parser("warmup", help="build (or reuse) the cached supervised warm-up checkpoint")
    w.add_argument("config", nargs="?", default=str(QUICKSTART))
    w.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)
    w.set_defaults(func=cmd_warmup)

    c = sub.add_parser("config", help="list every config field with its default and meaning",
                       description="Without arguments: every field, its default and its documentation. "
                                   "With --show FILE: the fully resolved config.")
    c.add_argument("--show", metavar="FILE", help="print the resolved config of FILE (+ --set overrides)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)
    c.set_defaults(func=cmd_config)
