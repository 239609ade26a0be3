"""A reward model inside a training run: scoring each stage, the rounds of iterative RL (DeepSeekMath §4.2) and charging its work to the run's budget.

The trainer (:mod:`harness.train.loop`) holds one :class:`RunRewardModel` when
``reward_model.type`` is set (:func:`for_run`) and calls it at four points:

- :meth:`~RunRewardModel.start`, once before the first stage of a fresh run: ``orm``/``prm``
  without ``init`` train a reward model on ``samples_per_round`` samples of the starting policy
  (round 0), labelled by the exact checker; with ``init`` the folder's recorded cost is charged;
- :meth:`~RunRewardModel.score`, every stage: the rewards the learner gets. ``orm``: P(good) of
  each completion replaces the outcome reward; ``prm``: its step scores are the process rewards;
  ``implicit``: PRIME's token rewards, then the implicit PRM's update on the batch's exact outcome
  labels. The exact rewards still make the ``rollout/`` statistics (``rollout/reward_mean`` is
  always the checker's), and the row gets the model's agreement with them
  (``rollout/rm_outcome_acc`` / ``_auc``, ``rollout/rm_step_acc`` / ``_auc``);
- :meth:`~RunRewardModel.after_stage`: with ``rounds`` R > 1, when the budget consumed passes the
  end of a round (R equal parts of ``budget.amount`` in its unit, on stage boundaries as the
  evaluation points are: :func:`round_thresholds`) and it is not the last round: sample
  ``samples_per_round`` completions of the current policy on fresh training problems -> relabel
  them with the exact checker -> measure the current reward model on them (``train/rm_fresh_*``:
  held-out accuracy and AUC on the policy's new distribution) -> train it further on them plus a
  replay of ``replay_fraction`` of the earlier examples -> reset the reference to the policy;
- :meth:`~RunRewardModel.state_dict` / :meth:`~RunRewardModel.load_state_dict` with every resume
  point, and :meth:`~RunRewardModel.report` for summary.json's ``reward_model``.

Budget fairness: the samples a round draws count against the budget's ``samples`` and ``tokens``
counters, and the wall-clock of a round (sampling, labelling, training) against ``seconds``;
the implicit PRM's work lies inside each stage's time. ``steps`` are RL stages only, so a
budget in steps does not charge reward-model work (compare such runs in samples or seconds).
All of it is also reported apart: summary.json ``reward_model.cost`` and ``perf/reward_model_seconds``.
One process only (several processes are refused before training).
"""
from __future__ import annotations

import math
import random
import time
from types import SimpleNamespace
from typing import Optional

import torch

from evals.prm import step_labels
from evals.rm_metrics import quality
from harness.engine.sampling import char_to_token_index, sample, token_end_offsets
from harness.foundation.budget import consumed, counter_key, eval_thresholds, stage_samples, thresholds_passed
from harness.rewards.data import Example, label_exact, load_examples, replay_draw
from harness.rewards.implicit import ImplicitPRM
from harness.rewards.learned import TaggedRM

ROUND_SEED = "rm-round"
COST_KEYS = ("samples", "tokens", "seconds")


def round_thresholds(budget, rounds: int, per_stage: int) -> list[float]:
    """The budget amounts (in ``budget.unit``) at which rounds 1..R-1 end: the evaluation-point
    rule of :func:`harness.foundation.budget.eval_thresholds` with R points, less the last (the run's end)."""
    if rounds <= 1:
        return []
    return eval_thresholds(SimpleNamespace(unit=budget.unit, amount=budget.amount, eval_points=rounds),
                           per_stage)[:-1]


def for_run(cfg, task, policy, tok, device, perf, distributed: bool = False) -> Optional["RunRewardModel"]:
    """The run's reward model (None when ``reward_model.type`` is null)."""
    if cfg.reward_model.type is None:
        return None
    if distributed:
        raise RuntimeError("reward_model.type needs a single process (the reward model is trained on the main "
                           "process only); run without torchrun or leave reward_model.type null")
    return RunRewardModel(cfg, task, policy, tok, device, perf)


class RunRewardModel:
    def __init__(self, cfg, task, policy, tok, device, perf):
        rm = cfg.reward_model
        self.cfg, self.task, self.tok, self.device, self.perf = cfg, task, tok, device, perf
        self.kind = rm.type
        self.started = self.kind == "implicit"  # it trains online from the first stage: nothing before RL
        self.rounds_done = 0  # trainings of the reward model so far (round 0: before RL)
        self.history: list[Example] = []
        self.cost = {"samples": 0, "tokens": 0, "seconds": 0.0, "seconds_in_stages": 0.0}
        self.init_cost: dict = {}
        self.rounds_log: list[dict] = []
        self._last = None
        per_stage = stage_samples(cfg.train.prompts_per_step, cfg.sampling.samples_per_prompt)
        self.thresholds = round_thresholds(cfg.budget, rm.rounds, per_stage)
        kw = dict(device=device, lr=rm.lr, micro_batch_size=rm.micro_batch_size)
        if self.kind == "implicit":
            self.model = ImplicitPRM(policy, beta=rm.beta, **kw)
        elif rm.init is not None:
            self.model = TaggedRM.load(rm.init, **kw)
            self.history = load_examples(rm.init)  # what it was trained on: replayed in later rounds
            if self.model.kind != self.kind:
                raise ValueError(f"reward_model.init={rm.init} is a {self.model.kind} and reward_model.type is "
                                 f"{self.kind}")
        else:
            self.model = TaggedRM.from_policy(policy, tok, self.kind, **kw)

    # ------------------------------------------------------------------ the budget
    def _charge(self, counters: dict, samples: int, tokens: int, seconds: float) -> None:
        """Add reward-model work to the run's counters and to its own account."""
        for unit, v in (("samples", samples), ("tokens", tokens), ("seconds", seconds)):
            counters[counter_key(unit)] += v
            self.cost[unit] += v

    # ------------------------------------------------------------------ the trainer's hooks
    def start(self, policy, counters: dict) -> dict:
        """Before the first stage of a fresh run: train the round-0 reward model, or charge the
        init folder's recorded cost. Returns a metrics row. (The implicit PRM starts ``started``.)"""
        self.started = True
        if self.cfg.reward_model.init is not None:
            self.init_cost = {k: self.model.spec.get("cost", {}).get(k, 0) for k in COST_KEYS}
            self._charge(counters, int(self.init_cost["samples"]), int(self.init_cost["tokens"]),
                         float(self.init_cost["seconds"]))
            self.rounds_done = 1
            return {"train/rm_round": 0.0, "train/rm_init_samples": float(self.init_cost["samples"])}
        return self._round(policy, counters, fresh_quality=False)

    def after_stage(self, learner, counters: dict) -> dict:
        """After a stage: at the end of a round (not the last), retrain and reset the reference."""
        if not self.thresholds or self.kind == "implicit":
            return {}
        due = thresholds_passed(self.thresholds, self.rounds_done - 1, consumed(counters, self.cfg.budget.unit))
        if due <= self.rounds_done - 1:
            return {}
        row = self._round(learner.policy, counters, fresh_quality=True)
        learner.reset_reference()
        self.rounds_done = due + 1  # rounds whose ends fall in one stage merge into one retraining
        return row

    def scorer(self, base):
        """A stage's scorer (``score(task, problems_rep, rollouts, prm) -> (rewards, step_rewards)``,
        what :func:`harness.train.stage.run_stage` calls) that scores with ``base`` (the exact checker),
        keeps that for :meth:`take_exact`, and returns the rewards the learner gets (:meth:`score`)."""
        def scored(task, problems_rep, rollouts, prm=None):
            rewards, steps = base(task, problems_rep, rollouts, prm)
            learn_rewards, learn_steps, row = self.score(problems_rep, rollouts, rewards, steps)
            self._last = (rewards, steps, row)
            return learn_rewards, learn_steps
        return scored

    def take_exact(self) -> tuple[torch.Tensor, list, dict]:
        """The last stage's exact (outcome rewards, step rewards) and the reward model's metrics:
        the run's ``rollout/`` statistics stay the checker's whatever the learner was given."""
        out, self._last = self._last, None
        return out

    def score(self, reps, ro, rewards: torch.Tensor, step_rewards: list) -> tuple[torch.Tensor, list, dict]:
        """(the learner's outcome rewards, its process rewards, metrics) for a stage's rollouts."""
        t0 = time.perf_counter()
        try:
            with self.perf.phase("reward_model"):
                return self._score(reps, ro, rewards, step_rewards)
        finally:  # inside the stage's time (so in the budget's seconds already); reported apart
            self.cost["seconds_in_stages"] += time.perf_counter() - t0

    def _score(self, reps, ro, rewards: torch.Tensor, step_rewards: list) -> tuple[torch.Tensor, list, dict]:
        if self.kind == "implicit":
            tok_rewards, row = self.model.score_and_update(ro, rewards)
            return rewards, ImplicitPRM.as_steps(tok_rewards, ro.completion_mask), row
        scored = self.model.score_batch(ro.completions, reps, ro.finished)
        row = self._agreement(reps, ro, rewards, scored)
        if self.kind == "orm":
            rm_rewards = torch.tensor([s[0].reward for s in scored], dtype=torch.float32)
            row["rollout/rm_reward_mean"] = float(rm_rewards.mean().item())
            return rm_rewards, step_rewards, row
        offsets = ro.token_offsets or [token_end_offsets(self.tok, ids[m.bool()].tolist()) for ids, m in
                                       zip(ro.completion_ids.cpu(), ro.completion_mask.cpu())]
        steps = [[(s.reward, char_to_token_index(offs, s.end)) for s in seq] for seq, offs in zip(scored, offsets)]
        row["rollout/rm_step_reward_mean"] = float(sum(r for s in steps for r, _ in s) /
                                                   max(sum(len(s) for s in steps), 1))
        return rewards, steps, row

    def _agreement(self, reps, ro, rewards, scored) -> dict:
        """How the model's scores of this stage agree with the exact labels (acc at 0.5, AUC)."""
        row = {}
        outcome = quality([min(s.reward for s in seq) for seq in scored], rewards.tolist())
        row["rollout/rm_outcome_acc"] = outcome["acc"]
        if outcome["auc"] is not None:
            row["rollout/rm_outcome_auc"] = outcome["auc"]
        if self.kind == "prm" and self.task.has_process_rewards:
            exact = [step_labels([("", s.end) for s in seq], self.task.step_rewards(c, p, f))
                     for seq, c, p, f in zip(scored, ro.completions, reps, ro.finished)]
            steps = quality([s.reward for seq in scored for s in seq], [y for e in exact for y in e])
            row["rollout/rm_step_acc"] = steps["acc"]
            if steps["auc"] is not None:
                row["rollout/rm_step_auc"] = steps["auc"]
        return row

    # ------------------------------------------------------------------ one round
    def _round(self, policy, counters: dict, fresh_quality: bool) -> dict:
        """Sample -> relabel exactly -> (measure) -> train on new + replay. Charges its samples,
        tokens and seconds; returns the round's metrics row."""
        cfg, rm, k = self.cfg, self.cfg.reward_model, self.rounds_done
        t0 = time.perf_counter()
        with self.perf.phase("reward_model"):
            new, tokens = self._draw(policy, k)
            row = {"train/rm_round": float(k), "train/rm_samples": float(len(new))}
            if fresh_quality:
                row.update(_flat("train/rm_fresh", self.model.quality(new)))
            replay = replay_draw(self.history, rm.replay_fraction, random.Random(f"rm-replay-{cfg.seed}-{k}"))
            fit = self.model.fit(new + replay, rm.epochs, seed=cfg.seed * 1000 + k)
            self.history.extend(new)
        self.perf.seconds.pop("reward_model", None)  # the round's time is its own (train/rm_seconds)
        seconds = time.perf_counter() - t0
        self._charge(counters, len(new), tokens, seconds)
        row.update({"train/rm_replayed": float(len(replay)), "train/rm_examples": float(fit["examples"]),
                    "train/rm_fit_loss": fit["loss"], "train/rm_seconds": seconds})
        self.rounds_log.append({k2.split("/", 1)[1]: v for k2, v in row.items()})
        self.rounds_done = k + 1
        return row

    def _draw(self, policy, k: int) -> tuple[list[Example], int]:
        """``samples_per_round`` completions of ``policy`` on fresh training problems, labelled by
        the exact checker (steps too for a PRM); and their tokens."""
        cfg = self.cfg
        G = cfg.sampling.samples_per_prompt
        n_prompts = math.ceil(cfg.reward_model.samples_per_round / G)
        problems = self.task.sample_train(random.Random(f"{ROUND_SEED}-{cfg.seed}-{k}"), n_prompts)
        sc = cfg.sampling
        ro = sample(policy, self.tok, [self.task.format_prompt(p) for p in problems], n=G,
                    max_new_tokens=sc.max_new_tokens, temperature=sc.temperature, top_p=sc.top_p,
                    seed=round_seed(cfg.seed, k), offsets=False, backend=sc.backend)
        reps = [p for p in problems for _ in range(G)]
        ex = label_exact(self.task, reps, ro.completions, ro.finished, with_steps=self.kind == "prm", round_=k)
        return ex, ro.num_tokens

    # ------------------------------------------------------------------ state and report
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "started": self.started, "rounds_done": self.rounds_done,
                "history": [e.to_dict() for e in self.history], "cost": dict(self.cost),
                "init_cost": dict(self.init_cost), "rounds_log": list(self.rounds_log)}

    def load_state_dict(self, d: dict) -> None:
        self.model.load_state_dict(d["model"])
        self.started, self.rounds_done = bool(d["started"]), int(d["rounds_done"])
        self.history = [Example.from_dict(e) for e in d["history"]]
        self.cost, self.init_cost = dict(d["cost"]), dict(d.get("init_cost", {}))
        self.rounds_log = list(d.get("rounds_log", []))

    def report(self) -> dict:
        """summary.json's ``reward_model``: its kind, the rounds run, and its work apart from RL."""
        rm = self.cfg.reward_model
        out = {"type": self.kind, "rounds": rm.rounds, "trainings": self.rounds_done, "cost": dict(self.cost),
               "examples": len(self.history), "rounds_log": self.rounds_log}
        if self.init_cost:
            out["init"], out["init_cost"] = rm.init, self.init_cost
        if self.kind == "implicit":
            out["updates"] = self.model.updates
        models = (self.model.model, self.model.ref) if self.kind == "implicit" else (self.model.model,)
        out["params"] = sum(p.numel() for m in models for p in m.parameters())  # held beside the policy
        return out


def round_seed(seed: int, k: int) -> int:
    """The sampling seed of round ``k`` of a run seeded ``seed`` (apart from every stage's)."""
    return (seed * 2_000_003 + k * 104_729 + 99_991) % (2**31 - 1)


def _flat(prefix: str, q: dict) -> dict:
    """``{"outcome": {"acc": .., "auc": ..}, ...}`` -> ``{prefix_outcome_acc: .., ...}`` (defined values only)."""
    return {f"{prefix}_{part}_{m}": float(v) for part, d in q.items() for m, v in d.items()
            if m in ("acc", "auc") and v is not None}
