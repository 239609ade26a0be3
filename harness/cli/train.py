"""`harness train`, `harness quickstart`, `harness warmup`, `harness config`."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import yaml

from evals.catalog import get_task
from harness.cli.polish import lazy, split_list
from harness.admission.gate import admit
from harness.config.paths import uses_warmup_cache
from harness.config.schema import config_warnings, describe, load_config
from harness.foundation import yamlsafe
from harness.foundation.base import ConfigError, did_you_mean
from harness.report.format import count, percent, percent_or_text
from harness.rundir.layout import SUMMARY, read_json
from harness.sweep.plan import format_plan, load_sweep

# loaded when a command runs (torch, transformers): `--help` and argument errors answer at once
models = lazy("harness.engine.models")
sweep_run = lazy("harness.sweep.run")
loop = lazy("harness.train.loop")
warmup = lazy("harness.train.warmup")
report_build = lazy("harness.report.build")  # numpy, pandas
report_tables = lazy("harness.report.tables")

PACKAGE = Path(__file__).resolve().parents[1]  # harness/
QUICKSTART = PACKAGE / "configs" / "quickstart.yaml"  # the quickstart's base config

_SET_HELP = "override a config field, e.g. --set train.lr=1e-4 --set algorithm=ppo (repeatable)"


def print_run(summary: dict, file=sys.stdout) -> None:
    ini, fin = summary.get("initial_eval") or {}, summary.get("final_eval") or {}
    print(f"\nrun {summary['run_id']} ({summary['status']})", file=file)
    for k in sorted(set(ini) | set(fin)):
        if k.endswith("/acc") or "@" in k:
            print(f"  {k:32s} start {percent_or_text(ini.get(k, '-')):>7}  ->  end {percent_or_text(fin.get(k, '-')):>7}",
                  file=file)
    c = summary.get("budget", {}).get("consumed", {})
    if c:
        print("  budget consumed: " + ", ".join(count(v, k) for k, v in c.items()), file=file)
    peak = summary.get("peak") or {}
    if peak:
        print(f"  peak RSS {peak.get('rss_mb', 0):.0f} MiB ({peak.get('rss_above_base_mb', 0):.0f} above baseline)",
              file=file)


def _sigterm_as_interrupt(signum, frame):
    """SIGTERM during `harness train` unwinds like Ctrl-C: the run is recorded ``interrupted``
    (summary written, checkpoint kept) and resumes on the next `harness train`."""
    raise KeyboardInterrupt(f"signal {signum}")


def _overrides(args) -> list[str]:
    """``--set`` overrides (``--output-dir`` is :func:`path_options`)."""
    return list(args.set)


def path_options(args) -> dict:
    """``--output-dir`` as the field ``output_dir``, a path as given (``~`` expanded as every path
    option is), never read as YAML: ``"x #c"``, ``2024-11-28``, ``123`` are folder names. The flag wins
    over ``--set output_dir=``; an empty one is refused by `harness.cli.main` before this."""
    out_dir = getattr(args, "output_dir", None)
    return {} if out_dir is None else {"output_dir": os.path.expanduser(out_dir)}


def warn_config(cfg, command: str) -> None:
    """Print :func:`harness.config.schema.config_warnings` of ``cfg``, one line each."""
    for line in config_warnings(cfg):
        print(f"harness {command}: warning: {line}", file=sys.stderr)


def output_field(args) -> str:
    """How an error names the results root: the option when it came from ``--output-dir``."""
    return "--output-dir" if getattr(args, "output_dir", None) is not None else "output_dir"


def cmd_train(args) -> int:
    cfg = load_config(args.config, _overrides(args), values=path_options(args))
    run = admit(cfg, outputs={output_field(args): cfg.output_dir})  # every check, before the run folder is made
    warn_config(cfg, "train")  # after the gate: a refused config gets its one line, nothing else
    print(f"results: {loop.run_dir(cfg)}")
    prev = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # SIGTERM: "interrupted", like Ctrl-C
    if args.no_progress:
        os.environ["TQDM_DISABLE"] = "1"  # every bar, the start evaluation's included
    try:
        summary = loop.train(run, resume=not args.restart, progress=not args.no_progress)
    except (MemoryError, RuntimeError) as e:  # the allocator: one line naming what to lower, not a traceback
        if not models.is_out_of_memory(e):
            raise
        raise ConfigError(out_of_memory_line(cfg, e)) from None
    finally:
        signal.signal(signal.SIGTERM, prev)
    print_run(summary)
    print(f"  report (tables and plots of every run in the folder): harness report {Path(loop.run_dir(cfg)).parent}")
    return 0


def out_of_memory_line(cfg, e: BaseException) -> str:
    """The one line for a run that ran out of memory (recorded failed by the trainer): the stage size
    and the settings whose memory grows with a number, to lower."""
    stage = cfg.train.prompts_per_step * cfg.sampling.samples_per_prompt
    why = (str(e).strip().splitlines() or [""])[0][:160]
    return (f"the run needs more memory than this machine has ({type(e).__name__}: {why}); a stage is "
            f"train.prompts_per_step x sampling.samples_per_prompt = {stage:,} samples of up to "
            f"sampling.max_new_tokens={cfg.sampling.max_new_tokens} tokens: lower train.prompts_per_step (or "
            f"sampling.samples_per_prompt, train.micro_batch_size={cfg.train.micro_batch_size}) and re-run")


def _quickstart_sweep() -> Path:
    for base in (PACKAGE.parent, Path.cwd()):
        f = base / "sweeps" / "quickstart.yaml"
        if f.exists():
            return f
    raise FileNotFoundError("sweeps/quickstart.yaml not found next to the package or in the current directory "
                            "(install with `pip install -e .` from a checkout, or run from the repository root)")


def cmd_quickstart(args) -> int:
    """Warm-up once (all cores), then the quickstart sweep (GRPO vs PPO vs online RFT at a
    matched budget), then the report."""
    t0 = time.time()
    sw = load_sweep(args.sweep or _quickstart_sweep(), overrides=args.set, output_dir=args.output_dir)
    args.only = only_algorithms(args.only, sw)
    runs = [r for r in sw.runs if not args.only or r.config.algo.name in args.only]
    # every check before the plan is printed and anything is written: each run through the gate (its
    # device, threads and input paths, then the results root and the warm-up cache, created if missing)
    admitted = [admit(r.config, outputs={output_field(args): sw.output_dir}, warmup_threads=True) for r in runs]
    print("quickstart: a 0.87M-parameter Llama with a character tokenizer learns multi-step arithmetic "
          "(supervised warm-up, cached), then GRPO, PPO and online RFT train from it at the same budget.\n")
    print(format_plan(sw))
    cfg = runs[0].config
    task = get_task(cfg.task)
    admitted[0].enter()  # the warm-up sets its own thread count (warmup.threads)
    _, _, info = warmup.starting_checkpoint(cfg, task, admitted[0].torch_device(), progress=not args.no_progress)
    print(f"warm-up checkpoint: {info['source']} ({'cached' if info.get('cached') else 'trained now'})")
    only = [r.run_id for r in runs] if args.only else None
    rc = sweep_run.run_sweep(sw, only=only, progress=not args.no_progress)
    res = report_build.build_report(sw.sweep_dir)
    print("\n" + report_tables.format_table(res["table"]))
    print(f"\nreport: {res['html']}\n        {res['markdown']}\n        {res['csv']}")
    for r in runs:
        summ = read_json(r.run_dir / SUMMARY, {})
        key = f"eval/{cfg.task.name}/acc"
        a0, a1 = (summ.get("initial_eval") or {}).get(key), (summ.get("final_eval") or {}).get(key)
        if a0 is not None and a1 is not None:
            print(f"{r.config.algo.name:>5}: held-out greedy accuracy {percent(a0)} -> {percent(a1)} "
                  f"({100 * (a1 - a0):+.1f} points)")
    print(f"\ntotal wall-clock: {time.time() - t0:.0f} s")
    print(f"tables and plots again, or for a subset of the runs: harness report {sw.sweep_dir}")
    return rc


def only_algorithms(given, sw) -> list[str] | None:
    """``--only`` as a list of algorithms of the quickstart's sweep ``sw`` (None: not given, every
    run): an --only that names nothing (``--only ''``, ``--only ,``) or an algorithm no run of the
    sweep uses is a ConfigError (exit 2) naming the valid choices, in `harness sweep --only`'s words."""
    if given is None:
        return None
    names = split_list(given)
    have = list(dict.fromkeys(r.config.algo.name for r in sw.runs))
    choices = f"this sweep's algorithms: {', '.join(have)}"
    if not names:
        raise ConfigError(f"--only selects no run: it names no algorithm (e.g. --only {have[0] if have else 'grpo'}; "
                          f"{choices})")
    for name in names:
        if name not in have:
            raise ConfigError(f"--only {name!r} matches no run of sweep {sw.name}{did_you_mean(name, have, n=1)} "
                              f"({choices})")
    return names


def cmd_warmup(args) -> int:
    cfg = load_config(args.config, _overrides(args), values=path_options(args))
    root = (uses_warmup_cache(cfg) and not cfg.warmup.cache_dir) or args.output_dir is not None
    run = admit(cfg, outputs={output_field(args): cfg.output_dir} if root else {},  # the cache's root, or a folder
                warmup_threads=True, memory=False)  # asked for; the warm-up sets its own thread count
    warn_config(cfg, "warmup")
    run.enter()
    task = get_task(cfg.task)
    _, _, info = warmup.starting_checkpoint(cfg, task, run.torch_device(), progress=True)
    print(json.dumps({k: v for k, v in info.items() if k != "config"}, indent=2))
    return 0


def _is_sweep_file(path: str) -> bool:
    """A sweep file names a grid or a base config; a run config has neither."""
    try:
        data = yamlsafe.load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # load_config reports it
    return isinstance(data, dict) and ("grid" in data or "base" in data)


def cmd_config(args) -> int:
    if args.show and _is_sweep_file(args.show):  # a sweep: its plan (every run's effective config is in it)
        sw = load_sweep(args.show, overrides=args.set)
        print(f"{args.show} is a sweep file: its plan (`harness sweep {args.show} --dry-run` prints the same; "
              f"one run's effective config: `harness config --show` on <results>/<sweep>/<run_id>/config.yaml "
              f"after it runs)\n")
        print(format_plan(sw))
        return 0
    if args.show:
        print(yaml.safe_dump(load_config(args.show, args.set).effective_dict(), sort_keys=False))
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
    p.add_argument("--output-dir", help="results root (default: the config's output_dir, results)")
    p.add_argument("--restart", action="store_true", help="ignore a checkpoint / finished summary and start over")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train)

    q = sub.add_parser("quickstart", help="warm-up, then GRPO vs PPO vs online RFT on tiny arithmetic (CPU, minutes)",
                       description="Supervised warm-up of the built-in tiny model (cached), then the runs of "
                                   "sweeps/quickstart.yaml at a matched budget, then the report; prints held-out "
                                   "greedy accuracy before and after each algorithm. Re-running skips finished runs.")
    q.add_argument("--only", action="append", nargs="+", metavar="ALGORITHM",
                   help="run only these algorithms: --only grpo ppo, --only grpo,ppo or repeated")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of every run, e.g. --set budget.amount=2048")
    q.add_argument("--sweep", help="another sweep file instead of sweeps/quickstart.yaml")
    q.add_argument("--output-dir", help="results root (default: results)")
    q.add_argument("--no-progress", action="store_true", help="no progress bars or live table")
    q.set_defaults(func=cmd_quickstart)

    w = sub.add_parser("warmup", help="build (or reuse) the cached supervised warm-up checkpoint",
                       description="Train the built-in tiny model's supervised warm-up checkpoint that RL "
                                   "runs start from (or reuse the cached one) and print where it is.")
    w.add_argument("config", nargs="?", default=str(QUICKSTART),
                   help="YAML config whose model, task and warm-up settings name the checkpoint "
                        "(default: the quickstart's)")
    w.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)
    w.add_argument("--output-dir", help="results root; the cache is <output_dir>/_cache/warmup unless "
                                        "warmup.cache_dir is set (default: results)")
    w.set_defaults(func=cmd_warmup)

    c = sub.add_parser("config", help="list every config field with its default and meaning",
                       description="Without arguments: every field, its default and its documentation. "
                                   "With --show FILE: the fully resolved config.")
    c.add_argument("--show", metavar="FILE", help="print the resolved config of FILE (+ --set overrides)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)
    c.set_defaults(func=cmd_config)
