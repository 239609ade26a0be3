"""`harness rm train`: sample from a policy checkpoint, label the samples exactly, train an outcome or process reward model, and report its held-out accuracy and AUC.

Steps (one process; portable numerics as a run):

1. the policy: ``--policy DIR`` (a run's ``final_model``, any local model folder), else the
   config's starting checkpoint (the tiny model's cached warm-up, built if absent), loaded by the
   ``load_start`` the caller passes (`harness rm train`: :func:`harness.train.warmup.starting_checkpoint`;
   this package sits below the trainer's and does not import it);
2. ``reward_model.samples_per_round`` samples (``--samples``), ``sampling.samples_per_prompt``
   per problem, on training problems drawn from a stream of their own;
3. labels: the outcome from the task's exact checker (arith's checker, the data set's grader);
   step labels from the step checker (arith), or with ``--step-labels mc`` by Monte-Carlo
   completion as Math-Shepherd does (:func:`mc_step_labels`: ``--mc-rollouts`` continuations of
   the policy from after each step but the last; a step is good when any continuation reaches
   the right answer; the last step's label is the outcome);
4. problems are split by a hash of their id (``--heldout-frac``, default 0.2: every sample of a
   problem on one side); the reward model (a copy of the policy, or ``--init``)
   trains ``reward_model.epochs`` passes on the training side;
5. written, whole, to the output folder (staged beside it and moved into place complete:
   :func:`harness.rundir.outputs.staged`): the model (``save_pretrained``), ``reward_model.json`` (kind,
   tags, where it came from, its ``cost``: samples, tokens, seconds, which a run charges to its
   budget when it starts from this folder), ``metrics.json`` (held-out and training accuracy and
   AUC against the exact labels, outcome and per step) and ``data.jsonl`` (every labelled example
   with its split).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable, Optional

from evals.catalog import get_task
from evals.prm import split_steps
from harness.admission import gate
from harness.engine.models import load_policy
from harness.engine.sampling import sample
from harness.foundation.base import stable_hash
from harness.rewards.data import DATA_FILE, Example, heldout, label_exact, training_problems
from harness.rewards.learned import TaggedRM
from harness.rundir.outputs import staged

METRICS_FILE = "metrics.json"


def default_out(cfg, kind: str, settings: dict) -> Path:
    """``<output_dir>/reward_models/<kind>-s<seed>-<hash8>`` (the hash over the config that makes
    the data and the model, and the command's settings)."""
    d = cfg.effective_dict()
    for k in ("name", "output_dir", "tracking"):
        d.pop(k, None)
    return Path(cfg.output_dir) / "reward_models" / f"{kind}-s{cfg.seed}-{stable_hash([d, settings], 8)}"


def mc_step_labels(policy, tok, task, examples: list[Example], problems: list, rollouts: int, cfg,
                   seed: int = 0) -> tuple[list[Example], int, int]:
    """Math-Shepherd's hard estimate of step labels by Monte-Carlo completion: for every step of
    every example but its last, ``rollouts`` continuations of the policy from the prompt plus the
    completion up to the end of that step; the step is labelled 1 when any continuation makes
    the whole text right (the task's reward), else 0. The last step is labelled with the
    outcome. Steps are the ``;`` / newline pieces (:func:`evals.prm.split_steps`). Returns the
    examples with their ``steps`` set, and the samples and tokens the continuations cost."""
    prefixes, where = [], []
    for i, (ex, p) in enumerate(zip(examples, problems)):
        pieces = _pieces(ex.completion)
        for j, (_, end) in enumerate(pieces[:-1]):
            prefixes.append(task.format_prompt(p) + ex.completion[:end])
            where.append((i, j))
    outcomes: dict[tuple[int, int], float] = {}
    n_samples = n_tokens = 0
    if prefixes:
        sc = cfg.sampling
        ro = sample(policy, tok, prefixes, n=rollouts, max_new_tokens=sc.max_new_tokens, temperature=sc.temperature,
                    top_p=sc.top_p, seed=seed, offsets=False, backend=sc.backend)
        n_samples, n_tokens = ro.num_sequences, ro.num_tokens
        for k, (i, j) in enumerate(where):
            ex, p = examples[i], problems[i]
            end = _pieces(ex.completion)[j][1]
            ok = [task.reward(ex.completion[:end] + c, p, f) for c, f in
                  zip(ro.completions[k * rollouts:(k + 1) * rollouts], ro.finished[k * rollouts:(k + 1) * rollouts])]
            outcomes[(i, j)] = 1.0 if max(ok) >= 0.5 else 0.0
    out = []
    for i, ex in enumerate(examples):
        pieces = _pieces(ex.completion)
        steps = [[outcomes[(i, j)], end] for j, (_, end) in enumerate(pieces[:-1])]
        steps.append([float(ex.outcome), pieces[-1][1] if pieces else len(ex.completion)])
        out.append(Example(**{**ex.to_dict(), "steps": steps}))
    return out, n_samples, n_tokens


def _pieces(completion: str) -> list[tuple[str, int]]:
    return split_steps(completion)


StartLoader = Callable[..., tuple]
"""``load_start(cfg, task, device, progress) -> (model, tokenizer, info)``: the config's starting
checkpoint on ``device``, ``info["source"]`` saying where it came from
(:func:`harness.train.warmup.starting_checkpoint`)."""


def _policy(cfg, task, device, policy_dir: Optional[str], load_start: Optional[StartLoader], progress: bool):
    """(model, tokenizer, where it came from): ``policy_dir`` or the config's starting checkpoint (``load_start``)."""
    if policy_dir:
        model, tok = load_policy(policy_dir)
        return model.to(device), tok, str(policy_dir)
    model, tok, info = load_start(cfg, task, device, progress)
    return model, tok, str(info.get("source"))


def train_reward_model(run, kind: str, *, policy_dir: Optional[str] = None,
                       load_start: Optional[StartLoader] = None, init: Optional[str] = None,
                       out: Optional[str] = None,
                       samples: Optional[int] = None, heldout_frac: float = 0.2, step_labels: str = "exact",
                       mc_rollouts: int = 4, progress: bool = True) -> dict:
    """Sample, label, split, train and write a reward model (the module docstring); returns the
    metrics written to ``metrics.json`` (with ``out``: the folder). ``run``: a run the admission gate let in
    (`harness.admission.gate.admit`: ``harness rm train``'s), or a config, taken through the gate here. The policy is
    ``policy_dir``, else
    what ``load_start`` (:data:`StartLoader`) loads; one of them must be given (a TypeError otherwise,
    before any work)."""
    if not policy_dir and load_start is None:
        raise TypeError("train_reward_model needs the policy to sample from: policy_dir (a model folder) or "
                        "load_start (a loader of the config's starting checkpoint, as "
                        "harness.train.warmup.starting_checkpoint)")
    admitted = gate.admitted(run)
    cfg, rm = admitted.cfg, admitted.cfg.reward_model
    admitted.enter()
    device = admitted.torch_device()
    task = get_task(cfg.task)
    policy, tok, source = _policy(cfg, task, device, policy_dir, load_start, progress)
    task.bind_tokenizer(tok)
    n = samples or rm.samples_per_round
    settings = {"kind": kind, "policy": source, "init": init, "samples": n, "heldout_frac": heldout_frac,
                "step_labels": step_labels, "mc_rollouts": mc_rollouts if step_labels == "mc" else None}
    folder = Path(out) if out else default_out(cfg, kind, settings)
    t0 = time.perf_counter()
    G, sc = cfg.sampling.samples_per_prompt, cfg.sampling
    problems = training_problems(task, cfg.seed, math.ceil(n / G))
    ro = sample(policy, tok, [task.format_prompt(p) for p in problems], n=G, max_new_tokens=sc.max_new_tokens,
                temperature=sc.temperature, top_p=sc.top_p, seed=cfg.seed, offsets=False, backend=sc.backend)
    reps = [p for p in problems for _ in range(G)]
    exact_steps = kind == "prm" and step_labels == "exact"
    examples = label_exact(task, reps, ro.completions, ro.finished, with_steps=exact_steps)
    cost = {"samples": ro.num_sequences, "tokens": ro.num_tokens}
    if kind == "prm" and step_labels == "mc":
        examples, mc_samples, mc_tokens = mc_step_labels(policy, tok, task, examples, reps, mc_rollouts, cfg,
                                                         seed=cfg.seed + 1)
        cost = {"samples": cost["samples"] + mc_samples, "tokens": cost["tokens"] + mc_tokens}
    split = ["heldout" if heldout(e.problem_id, heldout_frac) else "train" for e in examples]
    train = [e for e, s in zip(examples, split) if s == "train"]
    held = [e for e, s in zip(examples, split) if s == "heldout"]
    kw = dict(device=device, lr=rm.lr, micro_batch_size=rm.micro_batch_size)
    model = TaggedRM.load(init, **kw) if init else TaggedRM.from_policy(policy, tok, kind, **kw)
    if model.kind != kind:
        raise ValueError(f"{init} is a {model.kind}, not a {kind}")
    fit = model.fit(train, rm.epochs, seed=cfg.seed)
    cost["seconds"] = time.perf_counter() - t0  # sampling, labelling and training (not loading or measuring)
    metrics = {"kind": kind, "heldout": model.quality(held), "train": model.quality(train), "fit": fit,
               "examples": {"train": len(train), "heldout": len(held)}, "cost": cost, "settings": settings,
               "task": cfg.task.name}
    with staged(folder) as stage:  # moved into place whole: an earlier result stays until this one is complete
        model.save(stage, {"cost": cost, "source": source, "settings": settings, "task": cfg.task.name,
                           "init": init, "epochs": rm.epochs, "lr": rm.lr})
        (stage / METRICS_FILE).write_text(json.dumps(metrics, indent=1, sort_keys=True))
        with open(stage / DATA_FILE, "w") as f:
            for e, s in zip(examples, split):
                f.write(json.dumps({**e.to_dict(), "split": s}) + "\n")
    return {**metrics, "out": str(folder)}

