"""`harness rm train CONFIG`: train an outcome or process reward model on a policy's labelled samples and report its held-out accuracy and AUC."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from evals.catalog import get_task, has_step_checker
from harness.cli.polish import lazy
from harness.config.algorithm import TRAINED_REWARD_MODELS
from harness.config.fields import option_problem
from harness.admission.gate import Admitted, admit
from harness.config.paths import reward_model_spec
from harness.config.schema import MAX_PER_STEP, load_config
from harness.config.validation import whole_groups_problem
from harness.foundation.base import ConfigError, invalid
from harness.rewards.data import heldout, training_problems

# loaded when the command runs (torch, transformers): `--help` and argument errors answer at once
fit = lazy("harness.rewards.fit")
models = lazy("harness.engine.models")
prm = lazy("evals.prm")
report_format = lazy("harness.report.format")
warmup = lazy("harness.train.warmup")

DESCRIPTION = ("Train a learned reward model from a policy's own samples labelled by the task's exact checker "
               "(arith's step checker; the grader for outcomes; --step-labels mc: Math-Shepherd's Monte-Carlo "
               "completion), then write the model folder, reward_model.json (kind, tags, cost in samples, tokens "
               "and seconds), metrics.json (held-out and training accuracy and AUC against the exact labels) and "
               "data.jsonl. A run uses it with --set reward_model.type=<kind> --set reward_model.init=<folder> "
               "(or, a frozen PRM, algorithm.prm=<folder>). Settings from the config's reward_model section "
               "(samples_per_round, epochs, lr, micro_batch_size) and sampling section. "
               "docs/reward_models.md")
SPLIT_RESOLUTION = 10_000
"""`harness.rewards.data.heldout` splits on a hash modulo this: a --heldout-frac under half of
1/10,000 holds out no problem, one within half of it of 1 every problem."""


def _kind(cfg, args) -> str:
    kind = args.type or cfg.reward_model.type
    if kind not in TRAINED_REWARD_MODELS:
        raise ConfigError(f"--type {kind!r} is invalid: harness rm train trains an orm or a prm (give --type or "
                          f"reward_model.type; the implicit PRM trains online inside a run)")
    return kind


def check_args(cfg, args, kind: str) -> Admitted:
    """Everything that can be checked before any work (one-line ConfigError, exit 2): this command's options, then
    the run through the admission gate (threads, numerics, device, the paths the config reads, the output folder)."""
    if kind == "prm" and args.step_labels == "exact" and not has_step_checker(cfg.task.name):
        raise ConfigError(f"--step-labels exact is invalid for task '{cfg.task.name}': it has no exact step checker; "
                          f"use --step-labels mc (Monte-Carlo completion) or --type orm")
    bad = None if args.samples is None else option_problem("reward_model.samples_per_round", args.samples, "--samples")
    if bad:
        raise ConfigError(bad)
    n = args.samples or cfg.reward_model.samples_per_round
    why = whole_groups_problem(n, cfg.sampling.samples_per_prompt)
    if why:
        raise ConfigError(invalid(_samples_name(args), n, why))
    if not 0.0 < args.heldout_frac < 1.0:
        raise ConfigError(f"--heldout-frac {args.heldout_frac} is invalid: must be in (0, 1)")
    if round(args.heldout_frac * SPLIT_RESOLUTION) in (0, SPLIT_RESOLUTION):
        side = "no problem" if args.heldout_frac < 0.5 else "every problem"
        raise ConfigError(f"--heldout-frac {args.heldout_frac} is invalid: the split is a hash of each problem's id in "
                          f"steps of 1/{SPLIT_RESOLUTION:,}, so it holds out {side}: give a fraction between "
                          f"{1 / SPLIT_RESOLUTION} and {1 - 1 / SPLIT_RESOLUTION}")
    bad = option_problem("sampling.samples_per_prompt", args.mc_rollouts, "--mc-rollouts")  # continuations of a step
    if bad:
        raise ConfigError(bad)
    if args.policy:
        if not Path(args.policy).is_dir():
            raise ConfigError(f"--policy {args.policy!r} is invalid: not a model folder")
        models.check_model_folder(args.policy)
    init = args.init or cfg.reward_model.init
    if init:
        check_init(init, kind, "--init" if args.init else "reward_model.init")
    check_split(cfg, args, n)
    # the gate: threads, numerics, device, the paths the config reads, the samples held at once against this
    # machine's memory, the results root, and --out (never a run's final_model, a user's folder, ...)
    root = {} if args.out else {"--output-dir" if args.output_dir else "output_dir": cfg.output_dir}
    return admit(cfg, outputs=root, result=("rm train", "--out", args.out) if args.out else None,
                 samples=(n, _samples_name(args)), warmup_cache=not args.policy)


def check_init(init: str, kind: str, field: str) -> None:
    """``init`` is a reward-model folder `harness rm train` wrote, of ``kind``, whose model loads:
    a missing, empty or garbage ``reward_model.json`` (:func:`harness.config.paths.reward_model_spec`,
    the rule a run's ``reward_model.init`` follows), or one of the other kind, is one line before the
    warm-up (the training failed after it)."""
    spec = reward_model_spec(field, init)
    if spec is None:
        raise ConfigError(f"{field} {init!r} is invalid: no {prm.RM_SPEC_FILE} there (a folder written by "
                          f"`harness rm train`)")
    if spec["kind"] != kind:
        raise ConfigError(f"{field} {init!r} is invalid: it is a{'n' if spec['kind'] == 'orm' else ''} "
                          f"{spec['kind']} reward model and this trains a{'n' if kind == 'orm' else ''} {kind}: "
                          f"give --type {spec['kind']}, or a{'n' if kind == 'orm' else ''} {kind} folder")
    models.check_model_folder(init)


def _samples_name(args) -> str:
    return "--samples" if args.samples else "reward_model.samples_per_round"


def split_sizes(cfg, problems: int, frac: float) -> tuple[int, int]:
    """(training problems, held-out problems) among the first ``problems`` training problems drawn
    from the config's sample stream, as `harness.rewards.fit.train_reward_model` draws and splits
    them (distinct problems: a stream can draw one twice)."""
    drawn = training_problems(get_task(cfg.task), cfg.seed, problems)
    ids = {str(p.id) for p in drawn}
    held = sum(heldout(i, frac) for i in ids)
    return len(ids) - held, held


def check_split(cfg, args, n: int) -> None:
    """``n`` samples (``sampling.samples_per_prompt`` per problem) leave problems on both sides of
    the held-out split, before any sampling: no held-out problem leaves nothing to report the
    reward model's quality on, no training problem nothing to train on. The problems are drawn
    here exactly as the training draws them (a cheap draw, no model), so the check is exact; the
    message names the numbers and a sample count that leaves both sides."""
    G, frac = cfg.sampling.samples_per_prompt, args.heldout_frac
    problems = n // G
    train, held = split_sizes(cfg, problems, frac)
    if train and held:
        return
    side = "holds out none of them: no held-out accuracy or AUC to report" if not held else \
        "holds out all of them: nothing to train on"
    fix = "raise --heldout-frac" if not held else "lower --heldout-frac"
    more = problems * 2
    while more * G <= MAX_PER_STEP and not all(split_sizes(cfg, more, frac)):
        more *= 2
    if more * G <= MAX_PER_STEP:
        fix = f"draw more samples (e.g. --samples {more * G}: {more} problems) or {fix}"
    distinct = f" ({train + held} distinct)" if train + held != problems else ""
    raise ConfigError(f"{_samples_name(args)} {n} with sampling.samples_per_prompt {G} draws {problems} problem"
                      f"{'' if problems == 1 else 's'}{distinct} and --heldout-frac {frac} {side}: {fix}")


def cmd_rm_train(args) -> int:
    out_dir = {"output_dir": os.path.expanduser(args.output_dir)} if args.output_dir else {}
    cfg = load_config(args.config, args.set, values=out_dir)  # a path, never read as YAML
    kind = _kind(cfg, args)
    run = check_args(cfg, args, kind)
    try:
        res = fit.train_reward_model(run, kind, policy_dir=args.policy, load_start=warmup.starting_checkpoint,
                                     init=args.init or cfg.reward_model.init,
                                     out=args.out, samples=args.samples,
                                     heldout_frac=args.heldout_frac, step_labels=args.step_labels,
                                     mc_rollouts=args.mc_rollouts, progress=not args.no_progress)
    except (MemoryError, RuntimeError) as e:  # the allocator: one line naming the setting, not a traceback
        if not models.is_out_of_memory(e):
            raise
        n = args.samples or cfg.reward_model.samples_per_round
        why = (str(e).strip().splitlines() or [""])[0][:160]
        raise ConfigError(f"{_samples_name(args)} {n} needs more memory than this machine has ({type(e).__name__}: "
                          f"{why}): lower it (a held-out report needs a few hundred samples)") from None
    pct = report_format.percent
    print(f"reward model ({kind}) written to {res['out']}")
    print(f"  examples: {res['examples']['train']} train, {res['examples']['heldout']} held out; "
          f"cost {res['cost']['samples']} samples, {res['cost']['tokens']} tokens, {res['cost']['seconds']:.1f} s")
    for part, q in sorted(res["heldout"].items()):
        auc = "-" if q["auc"] is None else f"{q['auc']:.3f}"
        acc = "-" if q["acc"] is None else pct(q["acc"])
        print(f"  held-out {part:8s} n={q['n']:<6d} positives={q['positives']:<6d} accuracy {acc:>7}  AUC {auc}")
    if args.json:
        print(json.dumps(res, indent=1, sort_keys=True), file=sys.stdout)
    return 0


def register(sub) -> None:
    p = sub.add_parser("rm", help="reward models: train one on a policy's labelled samples",
                       description="Reward models (docs/reward_models.md).")
    rsub = p.add_subparsers(dest="rm_command", metavar="COMMAND", help="what to do (train)")
    t = rsub.add_parser("train", help="train an outcome / process reward model and report its held-out accuracy",
                        description=DESCRIPTION)
    t.add_argument("config", help="run config YAML (model, task, sampling, reward_model settings)")
    t.add_argument("--type", choices=TRAINED_REWARD_MODELS, help="orm or prm (default: the config's reward_model.type)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set reward_model.samples_per_round=2048 (repeatable)")
    t.add_argument("--policy", metavar="DIR",
                   help="the policy to sample from (a model folder, e.g. a run's final_model); default: the "
                        "config's starting checkpoint (the tiny model's cached warm-up)")
    t.add_argument("--init", metavar="DIR", help="continue training this reward-model folder (default: a copy of "
                                                 "the policy)")
    t.add_argument("--samples", type=int, help="completions to draw (default: reward_model.samples_per_round)")
    t.add_argument("--heldout-frac", type=float, default=0.2,
                   help="share of problems held out for the accuracy / AUC report (default 0.2)")
    t.add_argument("--step-labels", choices=("exact", "mc"), default="exact",
                   help="prm step labels: exact (the task's step checker) or mc (Monte-Carlo completion)")
    t.add_argument("--mc-rollouts", type=int, default=4, help="continuations per step with --step-labels mc")
    t.add_argument("--out", metavar="DIR",
                   help="output folder (default: <output_dir>/reward_models/<kind>-s<seed>-<hash>)")
    t.add_argument("--output-dir", help="results root (default: the config's output_dir, results)")
    t.add_argument("--json", action="store_true", help="also print metrics.json's content")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    t.set_defaults(func=cmd_rm_train)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
