"""The learner: one train step shared by every algorithm.

Rollouts -> (filter) -> reference / critic / old log-probs (only what the algorithm
needs) -> advantages (whitened over the batch where the algorithm says so) -> mu passes, each
of ``train.mini_batches`` optimizer steps on disjoint slices of the batch, of micro-batched
clipped-surrogate (or SFT) updates.
Nothing here branches on an algorithm's name: the resolved components decide. The maths of
the update (policy loss, aggregation, KL in the loss or in the reward, value loss, ratio
statistics) is ``algorithms.objective``'s; this module runs the models and micro-batches.

Memory and time discipline:
- logits are computed only for completion positions (``logits_to_keep``), never for the
  prompt, and never for the full vocabulary of positions that are not scored;
- with one optimizer step per batch (mu = 1, one mini-batch) and no KL in the reward, the old
  log-probs *are* the current ones: the ratio is ``exp(logp - logp.detach())`` (value 1,
  gradient of logp) and no extra forward runs;
- where old log-probs are needed (KL in the reward, mu > 1, several mini-batches), the
  in-process sampler's own float32 log-probs stand in for them (same weights, same temperature:
  equal up to rounding); ratio and value clipping are against them and the critic's values
  from before the first optimizer step of the batch;
- PPO with one optimizer step trains the critic in the one pass that also yields the values for GAE;
- the reference model only exists when a KL term is on; the critic only for PPO.

Normalisation: a filter (online RFT) only decides which rows are run; a dropped row has
gradient coefficient 0, and every loss is normalised by the counts (:class:`AggContext`) of the
*sampled* rows of its mini-batch slice, kept or not. So RFT's loss is DeepSeekMath's
``1/B sum_i I(o_i) 1/|o_i| sum_t -log pi`` and a prompt weighs by its number of correct samples.

Several processes (``dist``: a :class:`harness.engine.distributed.Distributed` that is
distributed): the policy and its optimizer, and PPO's critic and its optimizer, go
through ``dist.prepare``, the reference through ``dist.prepare_reference``; backward and
the optimizer step through ``dist.accumulate`` / ``dist.backward`` / ``dist.step`` (which
clips and returns the gradient norm). Each rank learns from its own shard of the stage's
groups (``valid`` marks the rows that are not padding) and normalises its loss with its
*local* counts; gradients are then averaged over ranks. So the update is the global one
for ``seq-mean-*`` aggregations (equal shards; a filter does not change the normaliser), and an
approximation otherwise (``token-mean`` with ranks of different token counts; advantage
whitening, which uses each rank's own statistics): ranks weigh equally. Under ZeRO-3
a forward pass is collective, so every rank runs the same number of micro-batches: a rank
that kept fewer rows (even none) pads with zero-weight micro-batches (mask of zeros), and
the "nothing kept" early return is taken only when no rank kept anything. One process
(``dist`` None or single): plain torch, exactly the code path above.

Where the parts are: which rows run in which optimizer step, and how a model is stepped in one
process or several, is :mod:`harness.engine.batching`; PPO's critic passes are
:mod:`harness.engine.critic`; the train/* metrics are one
:class:`harness.engine.step_metrics.StepMetrics` per step, filled as the update runs and turned
into values once at its end (combined over ranks: counts summed, losses averaged). Every algorithm
setting comes from ``algo``, the resolved algorithm (``cfg.algo``); the budget's progress (the
cosine schedule) is an argument of :meth:`Learner.step`.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from algorithms.advantages import ADVANTAGES, AdvantageInput, gae, masked_whiten, outcome_token_rewards
from algorithms.filters import FILTERS
from algorithms.objective import kl_reward_token_rewards, policy_objective, reference_kl
from algorithms.advantages import overlong_penalty
from harness.engine import fastlm, logprobs
from harness.engine.batching import MiniBatch, Plan, Rows, Stepper, forward_nograd, micro, plan_update
from harness.engine.critic import Critic
from harness.engine.distributed import load_full_state
from harness.engine.step_metrics import StepMetrics, group_advantage_sums
from harness.rundir.layout import RunFileError


class ValueModel(nn.Module):
    """Critic: a copy of the policy's backbone with a scalar head (same size as the policy)."""

    def __init__(self, policy, copy_backbone: bool = True):
        super().__init__()
        backbone = policy.get_decoder() if hasattr(policy, "get_decoder") else policy.model
        # copy_backbone=False: ``policy`` is a fresh load dedicated to the critic (ZeRO-3,
        # where deep-copying partitioned parameters is not an option)
        self.backbone = copy.deepcopy(backbone) if copy_backbone else backbone
        hidden = policy.config.hidden_size
        dtype = next(self.backbone.parameters()).dtype  # a bf16 policy gets a bf16 critic, head included
        self.head = nn.Linear(hidden, 1, dtype=dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids, num_completion: int) -> torch.Tensor:
        # V(s_t) for completion token t is read where token t is predicted: position P+t-1
        if fastlm.supported(self.backbone):
            h = fastlm.rows_hidden(self.backbone, input_ids, attention_mask, num_completion)
        else:
            h = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids).last_hidden_state[:, -num_completion - 1:-1]
        return _pad_columns(self.head(h).squeeze(-1).float(), num_completion)


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor

    @property
    def T(self) -> int:
        return self.targets.shape[1]

    def rows(self, idx) -> "Batch":
        return Batch(self.input_ids[idx], self.attention_mask[idx], self.position_ids[idx], self.targets[idx],
                     self.mask[idx])


def make_batch(rollouts, device) -> Batch:
    ids = torch.cat([rollouts.prompt_ids, rollouts.completion_ids], 1).to(device)
    mask = torch.cat([rollouts.prompt_mask, rollouts.completion_mask], 1).to(device)
    pos = (mask.long().cumsum(-1) - 1).clamp_min(0)
    return Batch(ids, mask, pos, rollouts.completion_ids.to(device), rollouts.completion_mask.to(device).float())


def token_logprobs(model, b: Batch, temperature: float = 1.0) -> torch.Tensor:
    """log pi(target_t | prefix) for completion tokens only, [B, T].

    Llama-architecture models take ``harness.engine.fastlm``'s forward, which runs each distinct
    prompt of the batch once (a GRPO batch holds every prompt G times), and then
    :func:`harness.engine.logprobs.token_logprobs_from_hidden`: while the micro-batch's float32
    logits (B x T x vocab x 4 bytes) fit in ``logprobs.FULL_LOGITS_MAX_BYTES`` (64 MiB) they are
    formed at once as always (so the quickstart's tiny model, vocabulary 100, keeps exactly its
    numbers); above it (SmolLM2's 49,152-token vocabulary) they exist only a chunk of rows at a
    time, in forward and in backward. Others take the model's own forward with ``logits_to_keep``
    (which forms the full logits itself)."""
    if fastlm.supported(model):  # up to the longest completion only (zeros after it)
        h = fastlm.rows_hidden(model, b.input_ids, b.attention_mask, b.T)
        lp = logprobs.token_logprobs_from_hidden(h, model.lm_head.weight, b.targets[:, :h.shape[1]], temperature)
        return _pad_columns(lp, b.T)
    out = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids,
                logits_to_keep=b.T + 1, use_cache=False)
    logits = out.logits[:, :-1].float()
    return _pad_columns(logprobs.logprobs_from_logits(logits, b.targets[:, :logits.shape[1]], temperature), b.T)


def _pad_columns(x: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad [B, T'] with zeros to [B, width]."""
    return nn.functional.pad(x, (0, width - x.shape[1])) if x.shape[1] < width else x


def lr_scale(tc, step: int, progress: float) -> float:
    """The learning rate's multiplier at stage ``step`` with ``progress`` (the fraction of the
    budget consumed before it): linear warm-up over ``tc.lr_warmup_steps`` stages, then the
    ``tc.lr_schedule`` (cosine: over the budget)."""
    scale = min(1.0, (step + 1) / tc.lr_warmup_steps) if tc.lr_warmup_steps else 1.0
    if tc.lr_schedule == "cosine":
        scale *= 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, progress))))
    return scale


class Learner:
    """The models an algorithm trains and one update per exploration stage (:meth:`step`).
    ``algo``: the resolved algorithm (``cfg.algo``), which every algorithm setting is read from;
    ``cfg``: the run's config, for its ``train`` and ``sampling`` sections; ``dist``: a
    :class:`harness.engine.distributed.Distributed` (None: plain torch in one process)."""

    def __init__(self, policy, algo, cfg, device, perf, reference=None, critic=None, dist=None):
        self.algo, self.cfg, self.device, self.perf = algo, cfg, device, perf
        self.dist = dist
        self.distributed = dist is not None and dist.is_distributed
        tc = cfg.train
        opt = torch.optim.AdamW(policy.parameters(), lr=tc.lr, weight_decay=tc.weight_decay, betas=(0.9, 0.99))
        critic_opt = (torch.optim.AdamW(critic.parameters(), lr=algo.critic_lr, betas=(0.9, 0.99))
                      if critic is not None else None)
        if dist is not None:  # single process: .to(device), the same objects
            policy, opt = dist.prepare(policy, opt)
            if reference is not None:
                reference = dist.prepare_reference(reference)
            if critic is not None:
                critic, critic_opt = dist.prepare(critic, critic_opt)
        self.policy, self.opt, self.reference, self.critic, self.critic_opt = policy, opt, reference, critic, critic_opt
        self.stepper = Stepper(dist, tc.max_grad_norm)
        self.critic_update = (Critic(critic, critic_opt, algo, tc.micro_batch_size, self.stepper, perf)
                              if critic is not None else None)
        self.advantage = ADVANTAGES.get(algo.advantage)
        self.filter = FILTERS.get(algo.filter)
        self.temperature = cfg.sampling.temperature
        self.steps_per_batch = tc.inner_epochs * tc.mini_batches  # policy optimizer steps on one batch
        self.updates = 0

    def step(self, rollouts, rewards: torch.Tensor, step_rewards: list, step: int,
             valid: Optional[torch.Tensor] = None, progress: float = 0.0, staleness: Optional[int] = None) -> dict:
        """One exploration stage's update; returns its train/* metrics (:mod:`harness.engine.step_metrics`).

        ``step``: the stage's index (learning-rate warm-up, the critic's warm-up); ``progress``: the
        fraction of the budget consumed before it (the cosine schedule); ``valid`` (several
        processes): bool [B], False on the padding rows of a shard (they take part in the
        collective forward passes, never in the loss or metrics).

        Filter -> reference / old log-probs -> critic values (or the fused critic pass) ->
        advantages (whitened where the algorithm says so) and returns -> this rank's kept rows and
        mini-batches -> ``inner_epochs`` passes of one policy (and critic) optimizer step per mini-batch.

        ``staleness``: None for rollouts the in-process sampler drew from these very weights right
        before (the on-policy loop); a number (the pipelined sampler, :mod:`harness.train.pipeline`) for
        rollouts drawn that many updates ago (or by another copy: ``sampling.dtype``). Then, and wherever
        ``algorithm.correction`` is set, the sampler's log-probs are the behaviour policy's, kept apart
        from the proximal (old) ones, corrected for and measured (``offpolicy/*``)."""
        algo, tc, metrics = self.algo, self.cfg.train, StepMetrics()
        keep, valid = self._keep(rewards, rollouts, valid, metrics)
        b = make_batch(rollouts, self.device)
        const_len = algo.dr_grpo_norm or self.cfg.sampling.max_new_tokens  # constant normaliser (Dr. GRPO)
        ref_logp = self._reference_logprobs(b)
        old_logp = self._old_logprobs(rollouts, b, on_policy=staleness is None)
        behav_logp = self._behaviour_logprobs(rollouts, b, staleness, metrics)
        fused_critic = self._fuses_critic(keep)
        values = self.critic_update.values(b) if self.critic is not None and not fused_critic else None
        rewards = self._shaped_rewards(rewards, rollouts, valid, metrics)
        inp = AdvantageInput(rewards=rewards.float().to(self.device), mask=b.mask, n=rollouts.n,
                             step_rewards=step_rewards, values=values,
                             token_rewards=self._kl_reward(old_logp, ref_logp, b, valid, metrics),
                             std_eps=algo.std_eps, group_std=algo.group_std, gamma=algo.gae_gamma, lam=algo.gae_lambda)
        fused_value_loss = None
        if fused_critic:
            fused_value_loss, values = self.critic_update.fused_pass(b, inp, const_len, step)
            inp = replace(inp, values=values)
        adv = self.advantage(inp)
        if algo.whiten_advantages:  # over this rank's kept tokens, before any mini-batching
            adv = masked_whiten(adv, b.mask * keep.to(b.mask.device, b.mask.dtype)[:, None])
        returns = None
        if values is not None and not fused_critic:
            _, returns = gae(outcome_token_rewards(inp), values, b.mask, algo.gae_gamma, algo.gae_lambda)
        plan = plan_update(keep, valid, Rows(b, adv, ref_logp, old_logp, values, returns, behav_logp), mini_batches=tc.mini_batches,
                           micro_batch_size=tc.micro_batch_size, const_len=const_len, device=self.device,
                           dist=self.dist if self.distributed else None)
        if plan is None:  # e.g. RFT with no correct completion: nothing to learn from
            metrics.over(1, "train/loss")
            metrics.set("train/skipped", 1.0)
            return metrics.values(self.dist)
        kept_adv, group_sums = plan.adv[plan.b.mask.bool()], group_advantage_sums(adv, b.mask, keep, rollouts.n)
        for name, x in (("adv_mean", kept_adv), ("adv_abs_mean", kept_adv.abs()), ("adv_group_sum_mean", group_sums),
                        ("adv_group_sum_abs_mean", group_sums.abs())):
            metrics.mean(f"train/{name}", x)
        lr = tc.lr * lr_scale(tc, step, progress)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self._update(plan, step, fused_value_loss, metrics)
        metrics.set("train/lr", lr)
        self.updates += 1
        return metrics.values(self.dist)

    # -- what the update reads: kept rows, reference / old log-probs, KL in the reward -------------
    def _keep(self, rewards: torch.Tensor, rollouts, valid: Optional[torch.Tensor],
              metrics: StepMetrics) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The filter's kept rows (bool [B]), less a shard's padding rows; and ``valid`` as bool."""
        keep = self.filter(rewards, rollouts.completions, rollouts.n)
        if self.algo.overlong_mask:  # DAPO's overlong filtering: truncated completions take no part
            keep = keep & torch.as_tensor(list(rollouts.finished), dtype=torch.bool, device=keep.device)
        if valid is not None:
            valid = valid.to(keep.device).bool()
            keep = keep & valid
        metrics.mean("train/kept_fraction", (keep[valid] if valid is not None else keep).float())
        return keep, valid

    def _shaped_rewards(self, rewards: torch.Tensor, rollouts, valid: Optional[torch.Tensor],
                        metrics: StepMetrics) -> torch.Tensor:
        """The outcome rewards plus DAPO's soft overlong penalty where ``algorithm.overlong_buffer`` > 0
        (:func:`algorithms.advantages.overlong_penalty`, L_cache its share of ``sampling.max_new_tokens``);
        the rewards as given otherwise."""
        algo = self.algo
        if not algo.overlong_buffer > 0:
            return rewards
        max_len = self.cfg.sampling.max_new_tokens
        pen = overlong_penalty(rollouts.lengths.cpu(), max_len, int(round(algo.overlong_buffer * max_len)),
                               algo.overlong_penalty)
        metrics.mean("train/overlong_penalty", pen[valid.cpu()] if valid is not None else pen)
        return rewards.float() + pen.to(rewards.device)

    def _logprobs(self, model, b: Batch) -> torch.Tensor:
        return token_logprobs(model, b, self.temperature)

    def _reference_logprobs(self, b: Batch) -> Optional[torch.Tensor]:
        """The reference's log-probs [B, T], where a KL term is on (None otherwise)."""
        with self.perf.phase("reference"):
            if self.reference is None or not self.algo.uses_reference:
                return None
            return forward_nograd(self.reference, b, self._logprobs, self.cfg.train.micro_batch_size)

    def _old_logprobs(self, rollouts, b: Batch, on_policy: bool = True) -> Optional[torch.Tensor]:
        """The sampling policy's log-probs [B, T] where they differ from the current ones'
        detached values at some point of the update (mu > 1 or several mini-batches: more than one
        optimizer step per batch) or feed the KL in the reward; None otherwise (one step: old =
        current, see ``algorithms.objective.policy_objective``).
        The sampler's own where they stand in exactly (:meth:`_sampler_logprobs`; ``on_policy``:
        the rollouts are the in-process sampler's at these weights), else a no-grad forward of the
        policy. Off-policy rollouts: these are the proximal policy's, the weights the update starts from."""
        needs_old = self.needs_old_logprobs
        with self.perf.phase("old_logprobs"):
            old_logp = self._sampler_logprobs(rollouts, b) if needs_old and on_policy else None
            if needs_old and old_logp is None:
                old_logp = forward_nograd(self.policy, b, self._logprobs, self.cfg.train.micro_batch_size)
            return old_logp

    def _sampler_logprobs(self, rollouts, b: Batch) -> Optional[torch.Tensor]:
        """The old log-probs (those of the policy that sampled) as the sampler recorded them, or
        None where they cannot stand in for a fresh forward. They can when the in-process sampler
        (backend 'hf') ran these very weights in float32 at the learner's temperature: the trainer
        samples right before each step, so nothing has updated them since, and the values agree
        with a recomputation up to float rounding (~1e-6). Saves the no-grad policy forward of
        PPO (KL in the reward) and of every mu > 1 run. Lower precisions recompute, as
        inference/training mismatches there are not rounding-sized.

        Test seam (no production switch): a test that needs the recomputing path replaces this
        method on its learner instance with one that returns None
        (``learner._sampler_logprobs = lambda rollouts, b: None``)."""
        lp = getattr(rollouts, "logprobs", None)
        if lp is None or not self.sampler_logprobs_usable() or tuple(lp.shape) != tuple(b.targets.shape):
            return None
        return lp.to(self.device, torch.float32) * b.mask

    def _behaviour_logprobs(self, rollouts, b: Batch, staleness: Optional[int],
                            metrics: StepMetrics) -> Optional[torch.Tensor]:
        """The behaviour policy's log-probs [B, T] (the sampler's, 0 on padding) where the update keeps
        them apart from the proximal ones: off-policy rollouts (``staleness`` given: logged as
        ``offpolicy/staleness``) or an ``algorithm.correction``; None otherwise."""
        if staleness is None and self.algo.correction == "none":
            return None
        if staleness is not None:
            metrics.set("offpolicy/staleness", float(staleness))
        return rollouts.logprobs.to(self.device, torch.float32) * b.mask

    @property
    def needs_old_logprobs(self) -> bool:
        """Does the update need the sampling policy's log-probs (more than one optimizer step per
        batch, or the KL in the reward)? See :meth:`_old_logprobs`."""
        return self.steps_per_batch > 1 or self.algo.kl_placement == "reward"

    def sampler_logprobs_usable(self) -> bool:
        """Can the sampler's recorded log-probs stand in for the old ones (the in-process 'hf'
        sampler and float32 weights: :meth:`_sampler_logprobs`)?"""
        return self.cfg.sampling.backend == "hf" and all(p.dtype == torch.float32 for p in self.policy.parameters())

    def _kl_reward(self, old_logp, ref_logp, b: Batch, valid: Optional[torch.Tensor],
                   metrics: StepMetrics) -> Optional[torch.Tensor]:
        """KL in the reward (PPO): the per-token rewards ``-kl_coef * KL`` [B, T]; None otherwise."""
        if self.algo.kl_placement != "reward" or ref_logp is None:
            return None
        token_rewards, kl_tok = kl_reward_token_rewards(old_logp, ref_logp, b.mask,
                                                        kl_estimator=self.algo.kl_estimator,
                                                        kl_coef=self.algo.kl_coef)
        per_row = kl_tok.sum(1)
        metrics.mean("train/kl_reward_penalty", per_row[valid.to(self.device)] if valid is not None else per_row)
        return token_rewards

    # -- the update: policy steps, then critic steps, epoch after epoch ----------------------------
    def _update(self, plan: Plan, step: int, fused_value_loss: Optional[float], metrics: StepMetrics) -> None:
        """``inner_epochs`` passes over the kept rows: a policy step per mini-batch (not while the
        policy is frozen for the critic's warm-up), then a critic step per mini-batch (the fused
        pass's loss where the critic already trained). Losses are means over epochs and mini-batch
        slices (so with equal slices, the full batch's loss), clip_frac a fraction of the kept
        tokens of every epoch, grad_norm the last optimizer step's."""
        algo, E = self.algo, self.cfg.train.inner_epochs
        frozen = step < algo.critic_warmup_steps
        steps = E * plan.n_slices  # what a loss is the mean over
        metrics.over(steps, "train/loss", "train/pg_loss")
        if algo.kl_placement == "loss" and plan.ref_logp is not None:
            metrics.over(steps, "train/kl_loss")
        if self.critic is not None:
            metrics.over(steps, "train/value_loss")
        metrics.over(plan.kept_tokens * E, "train/clip_frac", "train/clip_frac_low", "train/clip_frac_high")
        metrics.max("train/ratio_max", 0.0)
        for epoch in range(E):
            if not frozen:
                for mini in plan.minis:
                    self._policy_step(plan, mini, step, epoch, metrics)
            if fused_value_loss is not None:
                metrics.add("train/value_loss", fused_value_loss)  # trained before the advantages
            elif self.critic is not None:
                for mini in plan.minis:
                    metrics.add("train/value_loss", self.critic_update.train_pass(plan, mini, step))
        if plan.old_logp is not None and plan.ref_logp is not None:  # train/kl from the sampling policy's
            metrics.add("train/kl", *reference_kl(plan.old_logp, plan.ref_logp, plan.b.mask))
        if self.critic is not None:
            metrics.mean("train/value_mean", plan.values[plan.b.mask.bool()])
        metrics.set("train/policy_frozen", float(frozen))

    def _policy_step(self, plan: Plan, mini: MiniBatch, step: int, epoch: int, metrics: StepMetrics) -> None:
        """One optimizer step of the policy over the micro-batches of ``mini``; the loss of each
        is :func:`algorithms.objective.policy_objective`, normalised by ``mini.ctx``. Where the
        update has no old log-probs, the first epoch's log-probs are the sampling policy's, and
        ``train/kl`` (:func:`algorithms.objective.reference_kl`) is taken from them."""
        algo, run = self.algo, self.stepper
        run.zero_grad(self.opt)
        for i, part in enumerate(mini.slices):
            mb, sl = micro(plan.b, part)
            old = plan.old_logp[sl] if plan.old_logp is not None else None
            ref = plan.ref_logp[sl] if plan.ref_logp is not None else None
            behav = plan.behav_logp[sl] if plan.behav_logp is not None else None
            with run.accumulate(self.policy, last=i == len(mini.slices) - 1):
                with self.perf.phase("policy_forward"):
                    logp = token_logprobs(self.policy, mb, self.temperature)
                    obj = policy_objective(logp, old, ref, plan.adv[sl], mb.mask, mini.ctx,
                                           policy_loss=algo.policy_loss, aggregation=algo.aggregation,
                                           kl_estimator=algo.kl_estimator, kl_coef=algo.kl_coef,
                                           kl_placement=algo.kl_placement, clip_eps=algo.clip_eps,
                                           eps_low=algo.eps_low, eps_high=algo.eps_high,
                                           ratio_level=algo.ratio_level, behav_logp=behav,
                                           correction=algo.correction, correction_cap=algo.correction_cap)
                    if obj.kl is not None:
                        metrics.add("train/kl_loss", obj.kl.item())
                    if epoch == 0 and old is None and ref is not None:
                        metrics.add("train/kl", *reference_kl(logp, ref, mb.mask))
                if not torch.isfinite(obj.loss):
                    raise FloatingPointError(f"policy loss is {obj.loss.item()} at step {step} (epoch {epoch}); "
                                             f"try a lower train.lr or check the rewards")
                with self.perf.phase("backward"):
                    run.backward(self.policy, obj.loss)
            st = obj.stats  # the loss's own, at its ratio's level (token or sequence)
            metrics.add("train/clip_frac", st.clipped_low + st.clipped_high)
            metrics.add("train/clip_frac_low", st.clipped_low)
            metrics.add("train/clip_frac_high", st.clipped_high)
            metrics.max("train/ratio_max", st.ratio_max)
            metrics.collect("train/ratio", st.ratios)
            metrics.add("train/loss", obj.loss.item())
            metrics.add("train/pg_loss", obj.pg_loss.item())
            if obj.offpolicy is not None and epoch == 0:  # the proximal policy is the same every epoch
                _offpolicy_metrics(obj.offpolicy, metrics)
        with self.perf.phase("optimizer"):
            gn = run.step(self.policy, self.opt)
            if gn is not None:
                metrics.set("train/grad_norm", gn)

    def _fuses_critic(self, keep: torch.Tensor) -> bool:
        """Whether the critic trains in the pass that yields the values for GAE: one optimizer step
        per batch (mu = 1, one mini-batch), one process, every row kept. The critic's single
        training pass over the batch then computes, before its update, exactly the values the
        advantages need (GAE is per row), so that pass runs first and no separate value forward
        does (:meth:`_fused_critic_pass`).

        Test seam (no production switch): a test that compares with the unfused path replaces
        this method on its learner instance (``learner._fuses_critic = lambda keep: False``)."""
        return (self.critic is not None and self.steps_per_batch == 1 and not self.distributed
                and bool(keep.all()))

    # -- the reference, the warm-up's optimizer state (a checkpoint: harness/train/checkpoint.py) ---
    def reset_reference(self) -> None:
        """Iterative RL: the reference becomes a copy of the current policy."""
        if self.reference is None:
            return
        if not self.distributed:
            self.reference.load_state_dict(self.policy.state_dict())
            return
        with self.dist.gathered(self.policy) as pol:  # full weights on every rank
            load_full_state(self.dist, self.reference, pol.state_dict())

    def init_optimizer_from(self, path: str) -> None:
        """The policy's optimizer adopts the Adam state saved at ``path`` (:func:`adopt_adam_state`).
        Single process only (a ZeRO optimizer holds its state partitioned)."""
        if self.distributed:
            raise RuntimeError("init_optimizer_from is single-process only")
        adopt_adam_state(self.opt, list(self.policy.parameters()), path)


def _offpolicy_metrics(off, metrics: StepMetrics) -> None:
    """Record a micro-batch's mismatch and correction (``algorithms.objective.OffPolicy``) as offpolicy/*."""
    mm, w = off.mismatch, off.weights
    metrics.add("offpolicy/mismatch_kl", mm.kl_sum, mm.tokens)
    metrics.add("offpolicy/logp_abs_diff", mm.abs_diff_sum, mm.tokens)
    metrics.add("offpolicy/truncated_frac", w.truncated, mm.tokens)
    metrics.add("offpolicy/masked_frac", w.masked, mm.tokens)
    metrics.max("offpolicy/ratio_max", mm.ratio_max)
    metrics.collect("offpolicy/ratio", mm.ratios)


def adopt_adam_state(opt, params: list, path: str) -> None:
    """Give ``opt`` (Adam) the second moments and step counts of the optimizer state saved at
    ``path`` (a warm-up's), with zero first moments; the state must match ``params`` one for one."""
    try:
        saved = _adam_state(path, params)
    except Exception as e:  # a pickle torch refuses (weights_only), garbage, another model's state
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            raise  # the machine (a full disk, permissions): the CLI's own line
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise RunFileError(path, f"the warm-up's optimizer state cannot be used ({type(e).__name__}: {first})",
                           f"delete the warm-up cache entry {Path(path).parent} (the next run rebuilds it), or set "
                           f"train.reuse_warmup_optimizer: false") from None
    for i, p in enumerate(params):
        st = saved[i]
        opt.state[p] = {"step": st["step"].clone() if torch.is_tensor(st["step"]) else torch.tensor(float(st["step"])),
                        "exp_avg": torch.zeros_like(p), "exp_avg_sq": st["exp_avg_sq"].to(p.device).clone()}


def _adam_state(path: str, params: list) -> dict:
    """The per-parameter Adam state saved at ``path``, checked against ``params`` one for one."""
    state = torch.load(path, weights_only=True, map_location="cpu")  # tensors and plain values only
    saved = state.get("state", {}) if isinstance(state, dict) else None
    if not isinstance(saved, dict) or len(saved) != len(params):
        n = len(saved) if isinstance(saved, dict) else 0
        raise ValueError(f"optimizer state in {path} has {n} entries for {len(params)} parameters")
    for i, p in enumerate(params):
        st = saved.get(i)
        if not isinstance(st, dict) or not torch.is_tensor(st.get("exp_avg_sq")) or st["exp_avg_sq"].shape != p.shape \
                or "step" not in st:
            raise ValueError(f"optimizer state in {path} does not match parameter {i} ({tuple(p.shape)})")
    return saved
