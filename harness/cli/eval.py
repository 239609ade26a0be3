"""`harness eval`: evaluate a local model on gsm8k / math / math500 / arith.

Writes ``<out>/<task>_metrics.json`` (metrics + the settings used) and ``<out>/<task>.jsonl``
(per-problem records, see :mod:`evals.records`) and prints a small table.

Given a run directory (or its ``final_model``) as ``--model``, or a run's config as ``--config``,
the task is built from that run's ``task`` section, so ``harness eval`` scores the very problems
the run's own evaluation scored (arith: the same generator seed and eval_size), with the run's
completion limit and evaluation batch; ``--seed`` only seeds the sampling of ``--n`` completions.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Optional


from evals.catalog import get_task
from harness.admission.gate import admit
from harness.config.rules import MAX_THREADS
from harness.foundation.files import check_output_dir, check_output_files, new_folders, remove_new_folders
from harness.foundation.base import ConfigError, to_dict
from harness.foundation.errors import ModelLoadError
from harness.foundation.files import write_text_atomic
from harness.foundation.modelfiles import looks_like_hub_id
from harness.report.format import number, percent, table
from evals.arith import held_out_shortfall
from evals.protocols import DEFAULT_PROTOCOL, PROTOCOLS, check_protocol
from harness.config.fields import option_problem
from harness.config.rules import DTYPES
from harness.config.schema import Config, TaskConfig, config_from_dict, load_config
from harness.rundir.layout import CONFIG, SUMMARY, read_json
from harness.rundir.outputs import check_output
from harness.rundir import provenance
from harness.cli.polish import DefaultsOnceFormatter, lazy

# loaded when the command runs (torch, transformers): `--help` and argument errors answer at once
evaluation = lazy("harness.engine.evaluate")
models = lazy("harness.engine.models")

TASKS = ("gsm8k", "math", "math500", "arith", "wordarith")
GENERATED = ("arith", "wordarith")
"""Tasks that generate their problems from arith's knobs and seed (no test file)."""
DEFAULT_MAX_NEW = 512
"""Completion limit without a protocol's, a run's or ``--max-new-tokens`` (lowered to what the
model's context holds after the longest prompt, with a note)."""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="evaluate a model: greedy accuracy, pass@k, maj@k",
        description="Evaluate a local causal LM (Hugging Face directory or GGUF) on a task. Greedy accuracy, "
                    "and with --n > 0 the pass@k / maj@k curves for k = 1..n. Nothing is downloaded.",
        formatter_class=DefaultsOnceFormatter)
    p.add_argument("--model", required=True,
                   help="local model directory (or a .gguf file); a run directory or its final_model: the "
                        "run's final policy, evaluated on the run's own task and problem set")
    p.add_argument("--config", default=None,
                   help="a run's config (e.g. <run>/config.yaml): its task section defines the problems "
                        "(default: the run's config when --model is a run directory or its final_model)")
    p.add_argument("--gguf-file", default=None, help="GGUF file name inside --model")
    p.add_argument("--task", default=None, choices=TASKS, help="task to evaluate on (default: the run's, else gsm8k)")
    p.add_argument("--data", default=None,
                   help="data file or folder (default: shared/data found up from here, or $GRPO_HARNESS_DATA); "
                        "hf:<name>[:<config>] loads a hub dataset (online)")
    p.add_argument("--limit", type=int, default=0, help="first N test problems (0 = all)")
    p.add_argument("--few-shot", type=int, default=None,
                   help="worked examples from the train split in each prompt (default: the run's, else 0)")
    p.add_argument("--n", type=int, default=0, help="samples per problem for pass@k / maj@k (0 = greedy only)")
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy completion")
    p.add_argument("--temperature", type=float, default=1.0, help="temperature of the n samples")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass of the n samples")
    p.add_argument("--protocol", default=DEFAULT_PROTOCOL, choices=list(PROTOCOLS),
                   help="how prompts are built and completions cut and graded: chat (the task's own prompt and "
                        "grader), lighteval-5shot (GSM8K as SmolLM2's model card: 5 worked examples, first "
                        "'#### N' exact match), lighteval-5shot-plain (the same, never the chat template); "
                        "docs/eval_protocols.md")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="completion length limit (default: the protocol's, 256 for lighteval-5shot; else the "
                        f"run's evaluation limit, else {DEFAULT_MAX_NEW}; a default is lowered to what the model's "
                        "context holds after the longest prompt)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="sequences decoded at once (default: the run's eval.batch_size, as its evaluation, else 64)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the --n sampled completions (not of the problems: see --task-seed)")
    p.add_argument("--task-seed", type=int, default=None,
                   help="arith: seed of the problem generator (default: the run's task.seed, else the "
                        f"task's default {TaskConfig().seed})")
    p.add_argument("--output-dir", dest="out", default=None, metavar="DIR",
                   help="output folder (default: results/eval/<task>-<model name>)")
    p.add_argument("--out", dest="out", default=None, help=argparse.SUPPRESS)  # the old spelling
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="parameter dtype (default: the run's model.dtype, else float32)")
    p.add_argument("--threads", type=int, default=0,
                   help=f"torch CPU threads, at most {MAX_THREADS} (0: 2 in portable numerics, or OMP_NUM_THREADS; "
                        f"torch's default in native)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def format_table(metrics: dict, task: str) -> str:
    """A short table for people: greedy numbers, then pass@k / maj@k at k = 1, 2, 4, ..., n.
    Accuracies and shares in percent (the metrics JSON keeps fractions)."""
    ns = f"eval/{task}/"
    rows = []
    shares = {"acc": "accuracy", "answered": "answered", "truncated": "truncated", "mean_acc": "mean accuracy"}
    for key in ("num_problems", "acc", "answered", "truncated", "gen_tokens", "mean_acc"):
        if ns + key in metrics:
            v = metrics[ns + key]
            rows.append((shares.get(key, key), percent(v) if key in shares else number(v, ".1f", int_spec=",")))
    n = max([int(k.split("@")[1]) for k in metrics if k.startswith(ns + "pass@")] or [0])
    ks = sorted({k for k in (2 ** i for i in range(12)) if k <= n} | ({n} if n else set()))
    if ks:
        rows.append(("k", "pass@k / maj@k"))
        for k in ks:
            rows.append((f"  {k}", percent(metrics[f"{ns}pass@{k}"]) + " / " + percent(metrics[f"{ns}maj@{k}"])))
    if ns + "seconds" in metrics:
        rows.append(("seconds", number(metrics[ns + "seconds"], ".1f", int_spec=".1f")))
    return table(None, rows)


def _config_in(d: Path) -> Optional[Config]:
    """The config of run directory ``d`` (its config.yaml, else its summary.json's), or None."""
    if (d / CONFIG).is_file():
        return load_config(d / CONFIG)
    summary = read_json(d / SUMMARY, None)
    if isinstance(summary, dict) and isinstance(summary.get("config"), dict):
        return config_from_dict(summary["config"])
    return None


def resolve_run(model: str, config: Optional[str]) -> tuple[Optional[Config], Optional[str], str]:
    """(the run's config or None, where it was read, the model path to load) for ``--model`` /
    ``--config``: a run directory stands for its ``final_model``; a ``final_model`` folder's run
    is its parent."""
    p = Path(model)
    run_dir = None
    if p.is_dir() and (p / "final_model").is_dir() and ((p / CONFIG).is_file() or (p / SUMMARY).is_file()):
        run_dir, model = p, str(p / "final_model")
    elif p.is_dir() and ((p / CONFIG).is_file() or (p / SUMMARY).is_file()) and not (p / "config.json").is_file():
        raise ModelLoadError(f"--model {p}: a run directory without final_model ({_why_no_model(p)}): evaluate a "
                             f"run that finished with train.save_final_model: true, or give a model folder")
    elif p.name == "final_model" and ((p.parent / CONFIG).is_file() or (p.parent / SUMMARY).is_file()):
        run_dir = p.parent
    if config:
        return load_config(config), config, model
    cfg = _config_in(run_dir) if run_dir is not None else None
    return cfg, (str(run_dir) if cfg is not None else None), model


def _why_no_model(run_dir: Path) -> str:
    """Why a run directory has no final_model, as far as its summary.json says."""
    summary = read_json(run_dir / SUMMARY, None)
    status = summary.get("status") if isinstance(summary, dict) else None
    if status == "finished":
        return "the run finished with train.save_final_model: false"
    return f"its summary.json says {status!r}" if isinstance(status, str) else "it has no summary.json status"


# task fields the eval options set, for messages about them
_TASK_FLAGS = {"task.data_path": "--data", "task.few_shot": "--few-shot", "task.eval_size": "--limit",
               "task.seed": "--task-seed"}


def task_spec(args, cfg: Optional[Config]) -> TaskConfig:
    """The task to score: the run's ``task`` section when there is a run (and ``--task`` names its
    task or nothing), else ``--task`` with the task's default generator seed; ``--task-seed``,
    ``--data`` and ``--few-shot`` override either. Validated as a config's task section is (arith
    refuses ``--data`` and ``--few-shot``; its knobs must leave problems to evaluate); a message
    about a field an option set names the option."""
    if cfg is not None and args.task in (None, cfg.task.name):
        over = {k: v for k, v in (("seed", args.task_seed), ("data_path", args.data), ("few_shot", args.few_shot))
                if v is not None}
        spec = dataclasses.replace(cfg.task, **over)
    else:
        name = args.task or "gsm8k"
        # --limit 0: the whole test split (arith generates its default held-out set)
        size = args.limit if args.limit > 0 else (TaskConfig().eval_size if name in GENERATED else 10**9)
        spec = TaskConfig(name=name, data_path=args.data, few_shot=args.few_shot or 0, eval_size=size,
                          seed=TaskConfig().seed if args.task_seed is None else args.task_seed)
    if args.task_seed is not None and spec.name not in GENERATED:
        raise ConfigError(f"--task-seed {args.task_seed} is invalid: it seeds arith's problem generator; task "
                          f"'{spec.name}' scores its fixed test set, which no seed changes: remove --task-seed")
    try:
        spec.validate()
    except ConfigError as e:
        msg = str(e)
        flag = next((f for field, f in _TASK_FLAGS.items() if msg.startswith(field) and _given(args, f)), None)
        raise ConfigError(f"{msg} (from {flag})" if flag else msg) from None
    return spec


def _given(args, flag: str) -> bool:
    value = {"--data": args.data, "--few-shot": args.few_shot, "--limit": args.limit or None,
             "--task-seed": args.task_seed}[flag]
    return value is not None


# the config field each option stands for: the option keeps that field's rules (harness.config.rules)
_OPTION_FIELDS = (("--n", "eval.n"), ("--few-shot", "task.few_shot"), ("--max-new-tokens", "sampling.max_new_tokens"),
                  ("--seed", "seed"), ("--temperature", "sampling.temperature"), ("--top-p", "sampling.top_p"),
                  ("--device", "device"))


def _check_args(args) -> Optional[str]:
    """The first invalid option as a message, or None: the rules of the config fields they stand
    for (:data:`_OPTION_FIELDS`; ``--threads`` keeps train.threads', in the admission gate), and
    the two options of their own."""
    for option, dotted in _OPTION_FIELDS:
        value = getattr(args, option[2:].replace("-", "_"))
        bad = option_problem(dotted, value, option) if value is not None else None
        if bad:
            return bad
    for option, value, low in (("--limit", args.limit, 0), ("--batch-size", args.batch_size, 1),
                               ("--task-seed", args.task_seed, 0)):
        if value is not None and value < low:
            return f"{option} must be >= {low}, got {value}"
    if args.no_greedy and args.n == 0:
        return "--no-greedy with --n 0 evaluates nothing: give --n >= 1 or drop --no-greedy"
    return None


def check_model_arg(model_path: str, gguf_file: Optional[str]) -> None:
    """``--model`` (and ``--gguf-file``) name something a model can be loaded from, before any work:
    a folder, a .gguf file, a GGUF file inside the folder, or a hub name (``org/name``: only what
    the local Hugging Face cache holds). A file that is not a model (a YAML config, a
    config.json) is refused with what ``--model`` expects instead of the loader's complaint."""
    path = models.resolve_model_path(model_path)  # pkg:<package>/<file>
    p = Path(path)
    if gguf_file is not None:
        if not p.is_dir():
            raise FileNotFoundError(f"--gguf-file {gguf_file} is inside --model, which must then be a folder: "
                                    f"{path} is not one")
        if not (p / gguf_file).is_file():
            raise FileNotFoundError(f"GGUF file not found: {p / gguf_file} (--gguf-file names a file inside --model)")
        return
    if p.is_dir():
        return
    if p.suffix == ".gguf":
        if not p.is_file():
            raise FileNotFoundError(f"model path not found: {path} (a .gguf file is expected there)")
        return
    if p.exists():
        if p.suffix.lower() in (".yaml", ".yml"):
            hint = (f"; {p.name} looks like a harness config: `harness train {path}` trains from one (`harness eval "
                    f"--config` takes a run's config beside --model)")
        elif (p.parent / "config.json").is_file():
            hint = f"; give the folder that holds it: {p.parent}"
        else:
            hint = ""
        raise ModelLoadError(f"--model {path} is a file, not a model: --model expects a model folder (config.json, "
                             f"a tokenizer and weights, e.g. a run's final_model or the run directory) or a .gguf "
                             f"file{hint}")
    if not looks_like_hub_id(path):  # a hub name: the loader looks in the local cache
        raise FileNotFoundError(f"model path not found: {path} (a local directory or .gguf file is expected; "
                                f"nothing is downloaded at run time)")


def _default_max_new(protocol, cfg: Optional[Config]) -> tuple[int, str]:
    """The completion limit without ``--max-new-tokens``, and what it is, for messages."""
    if protocol.max_new_tokens:
        return protocol.max_new_tokens, f"protocol {protocol.name}'s default"
    if cfg is not None:
        return cfg.eval.max_new_tokens or cfg.sampling.max_new_tokens, "the run's evaluation limit"
    return DEFAULT_MAX_NEW, "the default"


def _context(value) -> Optional[int]:
    """A ``max_position_embeddings`` value as a context length: a positive int, else None (not said)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def model_context(folder: str) -> tuple[Optional[int], str]:
    """(the context of the model in ``folder``: ``max_position_embeddings`` of its config.json, or
    None when it does not say; where that was read)."""
    f = Path(folder) / "config.json"
    conf = read_json(f, None)
    return _context(conf.get("max_position_embeddings") if isinstance(conf, dict) else None), \
        f"max_position_embeddings in {f}"


def _check_context(args, ctx: Optional[int], where: str) -> None:
    """``--max-new-tokens`` within the model's context (``max_position_embeddings`` of its
    config.json): decoding preallocates the cache for prompt + completion, so a larger limit asks
    for memory the model could never use (the built-in tiny model holds model.max_length tokens).
    Before the problems are read; :func:`fit_context` then counts the prompts in."""
    if args.max_new_tokens is not None and ctx is not None and ctx < args.max_new_tokens:
        raise ConfigError(f"--max-new-tokens {args.max_new_tokens} is invalid: the model's context holds "
                          f"{ctx:,} tokens ({where}), prompt included: give at most {ctx:,} minus the prompt's "
                          f"length")


def longest_prompt(tokenizer, task, problems, protocol) -> int:
    """Tokens of the longest prompt the evaluation will decode from (as the sampler encodes them:
    the protocol's prompts, special tokens added)."""
    prompts = protocol.bind(task, tokenizer).prompts(problems)
    if not prompts:
        return 0
    return max(len(ids) for ids in tokenizer(list(prompts), add_special_tokens=True)["input_ids"])


def fit_context(max_new: int, explicit: bool, source: str, ctx: Optional[int], where: str,
                prompt: int) -> tuple[int, Optional[str]]:
    """(the completion limit to decode with, a one-line note for stderr or None), given the model's
    context ``ctx`` and the longest prompt's ``prompt`` tokens: an explicit ``--max-new-tokens``
    that does not fit after the prompt is an error (ConfigError) naming the largest that does; a
    default that does not fit is lowered to it, with a note. Prompts that alone fill the context
    leave nothing that fits: a warning (the limit then only has to fit the context, as
    :func:`_check_context` asks of an explicit one)."""
    if ctx is None:
        return max_new, None
    what = f"--max-new-tokens {max_new}" if explicit else f"max_new_tokens {max_new} ({source})"
    if prompt >= ctx:
        fits = min(max_new, ctx)
        return fits, (f"warning: the longest prompt has {prompt:,} tokens and the model's context holds {ctx:,} "
                      f"({where}): the completions run past it"
                      + (f"; {what} lowered to {fits:,}" if fits < max_new else ""))
    fits = ctx - prompt
    if max_new <= fits:
        return max_new, None
    if explicit:
        raise ConfigError(f"{what} is invalid: the model's context holds {ctx:,} tokens ({where}) and the "
                          f"longest prompt takes {prompt:,} of them: give at most {fits:,}")
    return fits, (f"note: {what} does not fit the model's context of {ctx:,} tokens ({where}) after the longest "
                  f"prompt's {prompt:,}: using {fits:,} (give --max-new-tokens to choose)")


def _tokenizer_of(folder: str):
    """The tokenizer of a model folder, for counting prompt tokens before the model loads; None
    when it does not load on its own (the model's loading then says why, or counts after)."""
    try:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception:
        return None


def _check_out(out: Path, given: bool, names: list[str]) -> None:
    """The output folder and the result files in it can be written: checked before the model
    loads, so an evaluation is never lost to a path at its end."""
    try:
        check_output(out, "eval", "--output-dir")  # not a run's folder, a model, a report, a user's folder
        check_output_dir(out, "--output-dir")
        check_output_files(out, names, "--output-dir")
    except ConfigError as e:
        if given:
            raise
        raise ConfigError(f"{e} (the default output folder: give --output-dir elsewhere)") from None


def run(args) -> int:
    bad = _check_args(args)
    if bad:
        print(f"harness eval: {bad}", file=sys.stderr)
        return 2
    cfg, run_source, model_path = resolve_run(args.model, args.config)  # no torch: before the pins take effect
    # the gate: the run's numerics mode (the process's without a run), --threads and the environment's thread
    # counts, --device; the model and the output folder are this command's own (below)
    try:
        admitted = admit(cfg, threads=args.threads, threads_field="--threads", device=args.device,
                         device_field="--device", inputs=False, warmup_cache=False)
    except ConfigError as e:  # this command's own words for its options, as _check_args' refusals
        print(f"harness eval: {e}", file=sys.stderr)
        return 2
    nstate = admitted.enter()
    spec = task_spec(args, cfg)
    protocol = check_protocol(args.protocol, spec.name, spec.few_shot)  # before the model is loaded
    check_model_arg(model_path, args.gguf_file)
    notes = []  # warnings and notes, printed once nothing can be refused
    if spec.name in GENERATED:
        have = held_out_shortfall(spec, spec.eval_size)
        if have is not None:
            notes.append(f"warning: {'--limit ' + str(args.limit) if cfg is None else 'the run config'} asks "
                         f"for {spec.eval_size} arith problems and its knobs allow only {have} held-out ones: "
                         f"evaluating {have}")
    explicit = args.max_new_tokens is not None
    max_new, source = (args.max_new_tokens, "--max-new-tokens") if explicit else _default_max_new(protocol, cfg)
    folder, ctx, where = None, None, ""
    if not args.gguf_file and not model_path.endswith(".gguf"):
        folder = models.resolve_model_path(model_path)
        models.check_model_folder(folder)  # before the problems are read or drawn
        ctx, where = model_context(folder)
        _check_context(args, ctx, where)
    task = get_task(spec)
    problems = task.eval_problems()
    if cfg is not None and args.limit > 0:
        problems = problems[:args.limit]
    counted = False
    tok = _tokenizer_of(folder) if ctx is not None else None
    if tok is not None:  # the prompts counted in, before the model loads
        max_new, note = fit_context(max_new, explicit, source, ctx, where,
                                    longest_prompt(tok, task, problems, protocol))
        notes += [note] if note else []
        counted = True
    batch_size = args.batch_size or (cfg.eval.batch_size if cfg is not None else 64)
    dtype = args.dtype or (cfg.model.dtype if cfg is not None else "float32")
    model_name = Path(args.gguf_file or model_path.rstrip("/")).stem
    if run_source is not None and model_name == "final_model":
        model_name = Path(model_path).parent.name
    # one folder per task, model and protocol: a lighteval-5shot run never overwrites a chat one
    suffix = "" if args.protocol == DEFAULT_PROTOCOL else f"-{args.protocol}"
    out = Path(args.out) if args.out else Path("results") / "eval" / f"{spec.name}-{model_name}{suffix}"
    # after every check that needs no folder, before the model loads; a command refused after it (the
    # model does not load) takes away the folders the check made
    created = new_folders(out)
    _check_out(out, args.out is not None, [f"{spec.name}.jsonl", f"{spec.name}.jsonl.tmp",
                                           f"{spec.name}_metrics.json"])
    try:
        model, tok = models.load_policy(model_path, gguf_file=args.gguf_file, dtype=dtype)
        if not counted:  # a GGUF model, or a folder whose tokenizer did not load alone: counted now
            ctx = _context(getattr(model.config, "max_position_embeddings", None)) if ctx is None else ctx
            where = where or "max_position_embeddings of the model's config"
            if ctx is not None:
                max_new, note = fit_context(max_new, explicit, source, ctx, where,
                                            longest_prompt(tok, task, problems, protocol))
                notes += [note] if note else []
    except BaseException:
        remove_new_folders(created)
        raise
    for note in notes:  # after the last refusal (the model's loading included): a refused command prints one line
        print(f"harness eval: {note}", file=sys.stderr)
    model.to(admitted.torch_device())
    t0 = time.time()
    metrics = evaluation.evaluate(model, tok, task, problems, greedy=not args.no_greedy, n=args.n,
                       temperature=args.temperature, top_p=args.top_p, max_new_tokens=max_new,
                       seed=args.seed, batch_size=batch_size, out_path=out / f"{spec.name}.jsonl",
                       progress=not args.no_progress, protocol=args.protocol)
    meta = {"protocol": args.protocol, "model": model_path, "gguf_file": args.gguf_file, "task": spec.name,
            "data": spec.data_path, "run_config": run_source, "task_spec": to_dict(spec), "limit": args.limit,
            "few_shot": spec.few_shot, "n": args.n, "greedy": not args.no_greedy, "temperature": args.temperature,
            "top_p": args.top_p, "max_new_tokens": max_new, "seed": args.seed, "batch_size": batch_size,
            "dtype": dtype, "time": t0}
    from_run = run_source and cfg is not None and cfg.task.name == spec.name  # not when --task named another
    # the numbers first: a write that fails now (a full disk) leaves them on the screen
    print(f"{spec.name}: {model_name}" + (f" (task from the run config {run_source})" if from_run else "")
          + (f", protocol {args.protocol}" if args.protocol != DEFAULT_PROTOCOL else ""))
    print(format_table(metrics, spec.name))
    out.mkdir(parents=True, exist_ok=True)
    prov = provenance.collect(admitted.numerics, results_root=out.parent, numerics_state=nstate)
    write_text_atomic(out / f"{spec.name}_metrics.json", json.dumps({"metrics": metrics, "settings": meta,
                                                                      "provenance": prov}, indent=1))
    print(f"wrote {out / (spec.name + '_metrics.json')} and {out / (spec.name + '.jsonl')}")
    return 0
