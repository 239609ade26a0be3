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
the "nothing kept" early return is taken only when no rank kept anything. Metrics are
combined over ranks (counts summed, losses averaged). One process (``dist`` None or
single): plain torch, exactly the code path above.
"""
from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, fields, replace
from typing import Optional

import torch
from torch import nn

from algorithms.advantages import (ADVANTAGES, AdvantageInput, gae, group_token_sums, masked_whiten,
                                   outcome_token_rewards)
from algorithms.filters import FILTERS
from algorithms.losses import AggContext
from algorithms.objective import clip_stats, kl_reward_token_rewards, policy_objective, reference_kl, value_objective
from harness.engine import fastlm, logprobs


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


@dataclass
class _Rows:
    """A batch with what the update reads per row: advantages [B, T], and the reference / old
    log-probs, critic values and returns [B, T] where the algorithm has them (else None)."""
    b: Batch
    adv: torch.Tensor
    ref_logp: Optional[torch.Tensor]
    old_logp: Optional[torch.Tensor]
    values: Optional[torch.Tensor]
    returns: Optional[torch.Tensor]

    def rows(self, idx) -> "_Rows":
        pick = lambda x: x[idx] if x is not None else None  # noqa: E731
        return _Rows(self.b.rows(idx), self.adv[idx], pick(self.ref_logp), pick(self.old_logp), pick(self.values),
                     pick(self.returns))


@dataclass
class _Mini:
    """One optimizer step's share of the batch: the counts its losses normalise by (the sampled
    rows of its slice, kept or not) and its micro-batch slices of the kept rows (``None``: a
    zero-weight padding one)."""
    ctx: AggContext
    slices: list


@dataclass
class _Kept(_Rows):
    """This rank's kept rows (a zero-mask stand-in row where it kept none), the number of kept
    rows and tokens, the mini-batches that run (one optimizer step each) and the number of
    slices the batch was cut into (``n_slices``, skipped ones included)."""
    n_kept: int
    kept_tokens: int
    minis: list
    n_slices: int


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


def _chunks(n: int, size: int):
    for s in range(0, n, size):
        yield slice(s, min(s + size, n))


class Learner:
    def __init__(self, policy, algo, cfg, device, perf, reference=None, critic=None, dist=None):
        """``algo``: the resolved algorithm (``cfg.algo``), which every algorithm setting is read from."""
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
        self.advantage = ADVANTAGES.get(algo.advantage)
        self.filter = FILTERS.get(algo.filter)
        self.temperature = cfg.sampling.temperature
        self.updates = 0
        self.progress = 0.0  # fraction of the budget consumed before this step (set by the trainer)

    def init_optimizer_from(self, path: str) -> None:
        """Adopt a checkpoint's Adam second moments (and step counts); zero the first moments.
        Single process only (a ZeRO optimizer holds its state partitioned)."""
        if self.distributed:
            raise RuntimeError("init_optimizer_from is single-process only")
        state = torch.load(path, weights_only=True, map_location="cpu")  # tensors and plain values only
        params = list(self.policy.parameters())
        saved = state.get("state", {})
        if len(saved) != len(params):
            raise ValueError(f"optimizer state in {path} has {len(saved)} entries for {len(params)} parameters")
        for i, p in enumerate(params):
            st = saved[i]
            if st["exp_avg_sq"].shape != p.shape:
                raise ValueError(f"optimizer state in {path} does not match parameter {i} ({tuple(p.shape)})")
            self.opt.state[p] = {"step": st["step"].clone() if torch.is_tensor(st["step"]) else torch.tensor(float(st["step"])),
                                 "exp_avg": torch.zeros_like(p), "exp_avg_sq": st["exp_avg_sq"].to(p.device).clone()}

    # ------------------------------------------------------------------
    def _lr_scale(self, step: int) -> float:
        tc = self.cfg.train
        scale = min(1.0, (step + 1) / tc.lr_warmup_steps) if tc.lr_warmup_steps else 1.0
        if tc.lr_schedule == "cosine":
            scale *= 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, self.progress))))
        return scale

    @torch.no_grad()
    def _forward_nograd(self, model, b: Batch, fn) -> torch.Tensor:
        # every rank holds the same number of rows (the trainer pads shards), so the number
        # of forward passes agrees across ranks (ZeRO-3)
        mb = self.cfg.train.micro_batch_size
        return torch.cat([fn(model, b.rows(s)) for s in _chunks(b.input_ids.shape[0], mb)], 0)

    def _accumulate(self, model, last: bool):
        return self.dist.accumulate(model, last=last) if self.dist is not None else contextlib.nullcontext()

    def _backward(self, model, loss) -> None:
        if self.dist is not None:
            self.dist.backward(model, loss)
        else:
            loss.backward()

    def _optimizer_step(self, model, opt) -> Optional[float]:
        """Clip + step; the gradient norm before clipping (None when clipping is off)."""
        if self.distributed:
            return self.dist.step(model, opt)  # clips, steps and zeroes the gradients
        gn = None
        if self.cfg.train.max_grad_norm > 0:
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.train.max_grad_norm))
        opt.step()
        # free the gradients now: they are not needed until the next backward, and holding
        # them through sampling, scoring and the reference forward is a model's worth of memory
        opt.zero_grad(set_to_none=True)
        return gn

    @staticmethod
    def _micro(b: Batch, sl):
        """Micro-batch ``sl`` of ``b``; ``None``: a zero-weight padding micro-batch (row 0 with
        an all-zero mask: a finite forward whose loss and gradient are 0)."""
        if sl is not None:
            return b.rows(sl), sl
        sl = slice(0, 1)
        mb = b.rows(sl)
        return replace(mb, mask=torch.zeros_like(mb.mask)), sl

    def step(self, rollouts, rewards: torch.Tensor, step_rewards: list, step: int,
             valid: Optional[torch.Tensor] = None) -> dict:
        """One exploration stage's update. Returns train/* metrics.

        ``valid`` (several processes): bool [B], False on the padding rows of a shard
        (they take part in the collective forward passes, never in the loss or metrics).

        Filter -> reference / old log-probs -> critic values (or the fused critic pass) ->
        advantages (whitened where the algorithm says so) and returns -> this rank's kept rows and
        mini-batches -> ``inner_epochs`` passes of one policy (and critic) optimizer step per
        mini-batch -> metrics."""
        acfg = self.algo
        m: dict[str, float] = {}
        raw: dict[str, float] = {}  # local sums, combined over ranks at the end (several processes)
        keep, valid = self._keep(rewards, rollouts, valid, m, raw)
        b = make_batch(rollouts, self.device)
        const_len = acfg.dr_grpo_norm or self.cfg.sampling.max_new_tokens  # constant normaliser (Dr. GRPO)
        ref_logp = self._reference_logprobs(b)
        old_logp = self._old_logprobs(rollouts, b)
        fused_critic = self._fuses_critic(keep)
        values = self._critic_values(b) if self.critic is not None and not fused_critic else None
        inp = AdvantageInput(rewards=rewards.float().to(self.device), mask=b.mask, n=rollouts.n,
                             step_rewards=step_rewards, values=values,
                             token_rewards=self._kl_reward(old_logp, ref_logp, b, valid, m, raw),
                             std_eps=acfg.std_eps, group_std=acfg.group_std, gamma=acfg.gae_gamma,
                             lam=acfg.gae_lambda)
        fused_value_loss = None
        if fused_critic:
            fused_value_loss, values = self._fused_critic_pass(b, inp, const_len, step)
            inp = replace(inp, values=values)
        adv = self.advantage(inp)
        if self.algo.whiten_advantages:  # over this rank's kept tokens, before any mini-batching
            adv = masked_whiten(adv, b.mask * keep.to(b.mask.device, b.mask.dtype)[:, None])
        returns = None
        if values is not None and not fused_critic:
            _, returns = gae(outcome_token_rewards(inp), values, b.mask, acfg.gae_gamma, acfg.gae_lambda)
        k = self._select_kept(keep, valid, _Rows(b, adv, ref_logp, old_logp, values, returns), const_len, raw)
        if k is None:  # e.g. RFT with no correct completion: nothing to learn from
            m.update({"train/loss": 0.0, "train/skipped": 1.0})
            return self._combine(m, raw) if self.distributed else m
        self._advantage_metrics(k, m, raw)
        self._group_advantage_metrics(adv, b.mask, keep, rollouts.n, m, raw)
        policy_frozen = step < acfg.critic_warmup_steps
        for g in self.opt.param_groups:
            g["lr"] = self.cfg.train.lr * self._lr_scale(step)
        sums = self._epochs(k, step, policy_frozen, fused_value_loss, m)
        self._update_metrics(k, sums, step, policy_frozen, m, raw)
        self.updates += 1
        return self._combine(m, raw) if self.distributed else m

    def _keep(self, rewards: torch.Tensor, rollouts, valid: Optional[torch.Tensor], m: dict,
              raw: dict) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The filter's kept rows (bool [B]), less a shard's padding rows; and ``valid`` as bool."""
        keep = self.filter(rewards, rollouts.completions, rollouts.n)
        if valid is not None:
            valid = valid.to(keep.device).bool()
            keep = keep & valid
            raw["rows"] = float(valid.sum().item())
        m["train/kept_fraction"] = keep.float().mean().item()
        return keep, valid

    def _logprobs(self, model, b: Batch) -> torch.Tensor:
        return token_logprobs(model, b, self.temperature)

    def _reference_logprobs(self, b: Batch) -> Optional[torch.Tensor]:
        """The reference's log-probs [B, T], where a KL term is on (None otherwise)."""
        with self.perf.phase("reference"):
            if self.reference is None or not self.algo.uses_reference:
                return None
            return self._forward_nograd(self.reference, b, self._logprobs)

    def _old_logprobs(self, rollouts, b: Batch) -> Optional[torch.Tensor]:
        """The sampling policy's log-probs [B, T] where they differ from the current ones'
        detached values at some point of the update (mu > 1 or several mini-batches: more than one
        optimizer step per batch) or feed the KL in the reward; None otherwise (one step: old =
        current, see ``algorithms.objective.policy_objective``).
        The sampler's own where they stand in exactly (:meth:`_sampler_logprobs`), else a
        no-grad forward of the policy."""
        needs_old = self._optimizer_steps_per_batch() > 1 or self.algo.kl_placement == "reward"
        with self.perf.phase("old_logprobs"):
            old_logp = self._sampler_logprobs(rollouts, b) if needs_old else None
            if needs_old and old_logp is None:
                old_logp = self._forward_nograd(self.policy, b, self._logprobs)
            return old_logp

    def _optimizer_steps_per_batch(self) -> int:
        """Policy optimizer steps on one batch of rollouts: ``inner_epochs * mini_batches``."""
        return self.cfg.train.inner_epochs * self.cfg.train.mini_batches

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
        if (lp is None or self.cfg.sampling.backend != "hf"
                or tuple(lp.shape) != tuple(b.targets.shape)
                or any(p.dtype != torch.float32 for p in self.policy.parameters())):
            return None
        return lp.to(self.device, torch.float32) * b.mask

    def _fuses_critic(self, keep: torch.Tensor) -> bool:
        """Whether the critic trains in the pass that yields the values for GAE: one optimizer step
        per batch (mu = 1, one mini-batch), one process, every row kept. The critic's single training pass over the batch then computes,
        before its update, exactly the values the advantages need (GAE is per row), so that pass
        runs first and no separate value forward does (:meth:`_fused_critic_pass`).

        Test seam (no production switch): a test that compares with the unfused path replaces
        this method on its learner instance (``learner._fuses_critic = lambda keep: False``)."""
        return (self.critic is not None and self._optimizer_steps_per_batch() == 1 and not self.distributed
                and bool(keep.all()))

    def _critic_values(self, b: Batch) -> torch.Tensor:
        """The critic's values V(s_t) [B, T] (zero on padding), no gradient."""
        with self.perf.phase("critic_forward"):
            return self._forward_nograd(
                self.critic, b, lambda mdl, x: mdl(x.input_ids, x.attention_mask, x.position_ids, x.T)) * b.mask

    def _kl_reward(self, old_logp, ref_logp, b: Batch, valid: Optional[torch.Tensor], m: dict,
                   raw: dict) -> Optional[torch.Tensor]:
        """KL in the reward (PPO): the per-token rewards ``-kl_coef * KL`` [B, T]; None otherwise."""
        if self.algo.kl_placement != "reward" or ref_logp is None:
            return None
        token_rewards, kl_tok = kl_reward_token_rewards(old_logp, ref_logp, b.mask,
                                                        kl_estimator=self.algo.kl_estimator,
                                                        kl_coef=self.algo.kl_coef)
        m["train/kl_reward_penalty"] = (kl_tok.sum(1).mean()).item()
        if valid is not None:
            raw["kl_pen_sum"] = kl_tok.sum(1)[valid.to(self.device)].sum().item()
        return token_rewards

    def _fused_critic_pass(self, b: Batch, inp: AdvantageInput, const_len: int, step: int) -> tuple[float, torch.Tensor]:
        """The critic's one training pass over the whole batch, each micro-batch's GAE targets
        computed from its own values before the update. Returns (value loss, values [B, T])."""
        acfg, B = self.algo, b.input_ids.shape[0]
        vctx = AggContext(num_seqs=B, num_tokens=int(b.mask.sum().item()), const_len=const_len)

        def fused_targets(sl, mb, v):  # (old values, returns) of a micro-batch from its own values
            old = v.detach() * mb.mask
            tr = inp.token_rewards[sl] if inp.token_rewards is not None else None
            rows = replace(inp, rewards=inp.rewards[sl], mask=mb.mask, token_rewards=tr, step_rewards=[])
            return old, gae(outcome_token_rewards(rows), old, mb.mask, acfg.gae_gamma, acfg.gae_lambda)[1]
        loss, seen = self._critic_pass(b, list(_chunks(B, self.cfg.train.micro_batch_size)), vctx, fused_targets,
                                       step)
        return loss, torch.cat(seen, 0)

    def _select_kept(self, keep: torch.Tensor, valid: Optional[torch.Tensor], rows: "_Rows", const_len: int,
                     raw: dict) -> Optional["_Kept"]:
        """This rank's kept rows and its mini-batches; None when no rank kept anything.

        The batch's B rows are cut, in order, into ``min(train.mini_batches, B)`` slices of sizes
        differing by at most one; each slice's losses are normalised by its sampled (valid) rows
        and their tokens, kept or not; its kept rows run in micro-batches of ``micro_batch_size``.
        A slice where no rank kept a row takes no optimizer step. Several processes: every rank
        runs as many micro-batches per slice as the rank with the most (``None`` slices:
        zero-weight padding, see :meth:`_micro`), and a rank that kept nothing learns from a
        zero-mask stand-in row."""
        mbs, B = self.cfg.train.micro_batch_size, keep.shape[0]
        n_slices = max(1, min(self.cfg.train.mini_batches, B))
        bounds = [j * B // n_slices for j in range(n_slices + 1)]
        keep = keep.cpu()
        counted = (valid.cpu() if valid is not None else torch.ones(B, dtype=torch.bool)).float()
        tokens_per_row = rows.b.mask.sum(1).cpu() * counted
        idx = keep.nonzero().squeeze(-1).to(self.device)
        n_kept = int(idx.numel())
        counts = [int(keep[lo:hi].sum()) for lo, hi in zip(bounds, bounds[1:])]
        all_counts = self.dist.gather_objects(counts) if self.distributed else [counts]
        raw["kept"] = float(n_kept)
        if sum(map(sum, all_counts)) == 0:
            return None
        if n_kept == 0:  # this rank kept nothing, others did: zero-weight stand-in row
            idx = torch.zeros(1, dtype=torch.long, device=self.device)
        kept = rows.rows(idx)
        if n_kept == 0:
            kept = replace(kept, b=replace(kept.b, mask=torch.zeros_like(kept.b.mask)))
        minis, first = [], 0
        for j, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            n_mb = max(-(-c[j] // mbs) for c in all_counts)  # the same on every rank
            if n_mb:
                ctx = AggContext(num_seqs=int(counted[lo:hi].sum().item()),
                                 num_tokens=int(tokens_per_row[lo:hi].sum().item()), const_len=const_len)
                slices: list = [slice(first + s.start, first + s.stop) for s in _chunks(counts[j], mbs)]
                slices += [None] * (n_mb - len(slices))  # padding micro-batches (several processes)
                minis.append(_Mini(ctx, slices))
            first += counts[j]
        return _Kept(**{f.name: getattr(kept, f.name) for f in fields(_Rows)}, n_kept=n_kept,
                     kept_tokens=int(kept.b.mask.sum().item()), minis=minis, n_slices=n_slices)

    @staticmethod
    def _advantage_metrics(k: "_Kept", m: dict, raw: dict) -> None:
        """Mean and mean absolute advantage over the kept tokens (and their local sums)."""
        nz = k.b.mask.bool()
        if k.n_kept:
            m["train/adv_mean"] = k.adv[nz].mean().item()
            m["train/adv_abs_mean"] = k.adv[nz].abs().mean().item()
            raw["adv_sum"], raw["adv_abs_sum"] = k.adv[nz].sum().item(), k.adv[nz].abs().sum().item()
        raw["tokens"] = float(k.kept_tokens)

    @staticmethod
    def _group_advantage_metrics(adv: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor, n: int, m: dict,
                                 raw: dict) -> None:
        """The sum of the token advantages of each group (the ``n`` samples of a prompt; kept rows,
        as the update uses them), over the groups with a kept row: its mean
        (``train/adv_group_sum_mean``; 0 for a zero-sum estimator) and mean absolute value
        (``train/adv_group_sum_abs_mean``), and their local sums."""
        keep = keep.to(adv.device)
        sums = group_token_sums(adv, mask * keep[:, None].to(mask.dtype), n)[keep.view(-1, n).any(1)]
        if sums.numel():
            m["train/adv_group_sum_mean"] = sums.mean().item()
            m["train/adv_group_sum_abs_mean"] = sums.abs().mean().item()
        raw["adv_group_sum"], raw["adv_group_abs_sum"] = sums.sum().item(), sums.abs().sum().item()
        raw["adv_groups"] = float(sums.numel())

    def _epochs(self, k: "_Kept", step: int, policy_frozen: bool, fused_value_loss: Optional[float],
                m: dict) -> dict:
        """``inner_epochs`` passes over the kept rows: a policy step per mini-batch (not while the
        policy is frozen for the critic's warm-up), then a critic step per mini-batch (the fused
        pass's loss where the critic already trained). Returns the summed losses and ratio
        statistics."""
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "value_loss": 0.0, "ratio_max": 0.0,
                "ref_kl": 0.0, "ref_kl_tokens": 0.0}
        for epoch in range(self.cfg.train.inner_epochs):
            if not policy_frozen:
                for mini in k.minis:
                    self._policy_step(k, mini, step, epoch, sums, m)
            if fused_value_loss is not None:
                sums["value_loss"] += fused_value_loss  # trained before the advantages
            elif self.critic is not None:
                for mini in k.minis:
                    sums["value_loss"] += self._critic_pass(
                        k.b, mini.slices, mini.ctx, lambda sl, mb, v: (k.values[sl], k.returns[sl]), step)[0]
        return sums

    def _policy_step(self, k: "_Kept", mini: "_Mini", step: int, epoch: int, sums: dict, m: dict) -> None:
        """One optimizer step of the policy over the micro-batches of ``mini``; the loss of each
        is :func:`algorithms.objective.policy_objective`, normalised by ``mini.ctx``."""
        acfg, algo = self.algo, self.algo
        if not self.distributed:
            self.opt.zero_grad(set_to_none=True)
        for i, part in enumerate(mini.slices):
            mb, sl = self._micro(k.b, part)
            old = k.old_logp[sl] if k.old_logp is not None else None
            with self._accumulate(self.policy, last=i == len(mini.slices) - 1):
                with self.perf.phase("policy_forward"):
                    logp = token_logprobs(self.policy, mb, self.temperature)
                    obj = policy_objective(logp, old, k.ref_logp[sl] if k.ref_logp is not None else None, k.adv[sl],
                                           mb.mask, mini.ctx, policy_loss=algo.policy_loss,
                                           aggregation=algo.aggregation, kl_estimator=algo.kl_estimator,
                                           kl_coef=algo.kl_coef, kl_placement=algo.kl_placement,
                                           clip_eps=acfg.clip_eps)
                    if obj.kl is not None:
                        sums["kl"] += obj.kl.item()
                    if epoch == 0 and old is None and k.ref_logp is not None:  # logp = the sampling policy's
                        kl_sum, kl_tokens = reference_kl(logp, k.ref_logp[sl], mb.mask)
                        sums["ref_kl"] += kl_sum
                        sums["ref_kl_tokens"] += kl_tokens
                if not torch.isfinite(obj.loss):
                    raise FloatingPointError(f"policy loss is {obj.loss.item()} at step {step} (epoch {epoch}); "
                                             f"try a lower train.lr or check the rewards")
                with self.perf.phase("backward"):
                    self._backward(self.policy, obj.loss)
            clipped, ratio_max = clip_stats(logp, old, mb.mask, acfg.clip_eps)
            sums["clip_frac"] += clipped
            sums["ratio_max"] = max(sums["ratio_max"], ratio_max)
            sums["loss"] += obj.loss.item()
            sums["pg_loss"] += obj.pg_loss.item()
        with self.perf.phase("optimizer"):
            gn = self._optimizer_step(self.policy, self.opt)
            if gn is not None:
                m["train/grad_norm"] = gn

    def _update_metrics(self, k: "_Kept", sums: dict, step: int, policy_frozen: bool, m: dict, raw: dict) -> None:
        """train/* metrics of an update from the epochs' sums: losses are means over epochs and
        mini-batch slices (so with equal slices, the full batch's loss), clip_frac a fraction of
        the kept tokens of every epoch, grad_norm the last optimizer step's."""
        tc, E = self.cfg.train, self.cfg.train.inner_epochs
        steps = E * k.n_slices
        m["train/loss"] = sums["loss"] / steps
        m["train/pg_loss"] = sums["pg_loss"] / steps
        if self.algo.kl_placement == "loss" and k.ref_logp is not None:
            m["train/kl_loss"] = sums["kl"] / steps  # the KL term of the loss (the algorithm's estimator)
        self._reference_kl_metric(k, sums, m, raw)
        m["train/clip_frac"] = sums["clip_frac"] / max(k.kept_tokens * E, 1)
        raw["clipped"] = sums["clip_frac"]
        m["train/ratio_max"] = sums["ratio_max"]
        if self.critic is not None:
            m["train/value_loss"] = sums["value_loss"] / steps
            if k.n_kept:
                m["train/value_mean"] = (k.values[k.b.mask.bool()].mean().item())
                raw["value_sum"] = k.values[k.b.mask.bool()].sum().item()
        m["train/lr"] = tc.lr * self._lr_scale(step)
        m["train/policy_frozen"] = float(policy_frozen)

    @staticmethod
    def _reference_kl_metric(k: "_Kept", sums: dict, m: dict, raw: dict) -> None:
        """``train/kl``: the mean per-token KL of the sampling policy to the reference over the kept
        tokens (:func:`algorithms.objective.reference_kl`), the same for every algorithm that holds
        a reference: from the old log-probs where the update has them (PPO, mu > 1), else from the
        first pass's log-probs (one optimizer step: they are the sampling policy's)."""
        if k.ref_logp is None:
            return
        if k.old_logp is not None:
            kl_sum, tokens = reference_kl(k.old_logp, k.ref_logp, k.b.mask)
        else:
            kl_sum, tokens = sums["ref_kl"], sums["ref_kl_tokens"]
        raw["ref_kl_sum"], raw["ref_kl_tokens"] = kl_sum, tokens
        if tokens > 0:
            m["train/kl"] = kl_sum / tokens

    def _critic_pass(self, b: Batch, slices: list, vctx: AggContext, targets, step: int) -> tuple[float, list]:
        """One optimizer step of the critic over the micro-batches ``slices`` of ``b``.
        ``targets(sl, mb, v)`` gives (old values, returns) of micro-batch ``sl`` from its current
        values ``v``. Returns the summed value loss and each micro-batch's old values."""
        acfg = self.algo
        if not self.distributed:
            self.critic_opt.zero_grad(set_to_none=True)
        total, seen = 0.0, []
        for i, part in enumerate(slices):
            mb, sl = self._micro(b, part)
            with self._accumulate(self.critic, last=i == len(slices) - 1):
                with self.perf.phase("critic_forward"):
                    v = self.critic(mb.input_ids, mb.attention_mask, mb.position_ids, mb.T)
                    old, ret = targets(sl, mb, v)
                    vl = value_objective(v, old, ret, mb.mask, vctx, aggregation=self.algo.aggregation,
                                         value_coef=acfg.value_coef, value_clip=acfg.value_clip)
                if not torch.isfinite(vl):
                    raise FloatingPointError(f"value loss is {vl.item()} at step {step}; "
                                             f"try a lower algorithm.critic_lr")
                with self.perf.phase("critic_backward"):
                    self._backward(self.critic, vl)
            total += vl.item()
            seen.append(old)
        with self.perf.phase("critic_optimizer"):
            self._optimizer_step(self.critic, self.critic_opt)
        return total, seen

    def _combine(self, m: dict, raw: dict) -> dict:
        """Metrics over all ranks: fractions and means from summed counts, losses averaged
        over ranks (the update follows the rank-averaged loss), ratio_max the maximum."""
        parts = self.dist.gather_objects((m, raw))
        ms, rs = [p[0] for p in parts], [p[1] for p in parts]

        def tot(k: str) -> float:
            return sum(r.get(k, 0.0) for r in rs)

        out = dict(ms[0])  # lr, policy_frozen, skipped, grad_norm: the same on every rank
        for k in ("train/loss", "train/pg_loss", "train/kl_loss", "train/value_loss"):
            vals = [x[k] for x in ms if k in x]
            if vals:
                out[k] = sum(vals) / len(vals)
        out.pop("train/kl", None)
        if tot("ref_kl_tokens") > 0:  # per-token mean over every rank's kept tokens
            out["train/kl"] = tot("ref_kl_sum") / tot("ref_kl_tokens")
        out["train/kept_fraction"] = tot("kept") / max(tot("rows"), 1.0)
        if any("train/kl_reward_penalty" in x for x in ms):
            out["train/kl_reward_penalty"] = tot("kl_pen_sum") / max(tot("rows"), 1.0)
        for k in ("train/adv_mean", "train/adv_abs_mean", "train/value_mean", "train/clip_frac", "train/ratio_max",
                  "train/adv_group_sum_mean", "train/adv_group_sum_abs_mean"):
            out.pop(k, None)
        if tot("adv_groups") > 0:
            out["train/adv_group_sum_mean"] = tot("adv_group_sum") / tot("adv_groups")
            out["train/adv_group_sum_abs_mean"] = tot("adv_group_abs_sum") / tot("adv_groups")
        tokens = tot("tokens")
        if tokens > 0:
            out["train/adv_mean"] = tot("adv_sum") / tokens
            out["train/adv_abs_mean"] = tot("adv_abs_sum") / tokens
            if any("train/value_mean" in x for x in ms):
                out["train/value_mean"] = tot("value_sum") / tokens
        if any("train/clip_frac" in x for x in ms):
            out["train/clip_frac"] = tot("clipped") / max(tokens * self.cfg.train.inner_epochs, 1.0)
            out["train/ratio_max"] = max(x.get("train/ratio_max", 0.0) for x in ms)
        return out

    # ------------------------------------------------------------------
    def reset_reference(self) -> None:
        """Iterative RL: the reference becomes a copy of the current policy."""
        if self.reference is None:
            return
        if not self.distributed:
            self.reference.load_state_dict(self.policy.state_dict())
            return
        with self.dist.gathered(self.policy) as pol:  # full weights on every rank
            self._load_full(self.reference, pol.state_dict())

    def _full_state(self, model) -> Optional[dict]:
        """Full state dict of a prepared model (None on non-main ranks under ZeRO-3);
        every rank calls."""
        mod = self.dist.unwrap(model)
        if self.dist.zero3:
            import deepspeed
            with deepspeed.zero.GatheredParameters(list(mod.parameters())):
                return ({k: v.detach().cpu().clone() for k, v in mod.state_dict().items()}
                        if self.dist.is_main else None)
        return {k: v.detach().cpu().clone() for k, v in mod.state_dict().items()}

    def _load_full(self, model, sd: Optional[dict]) -> None:
        """Load a full state dict (needed on the main rank only under ZeRO-3); every rank calls."""
        mod = self.dist.unwrap(model)
        if self.dist.zero3:
            import deepspeed
            with deepspeed.zero.GatheredParameters(list(mod.parameters()), modifier_rank=0):
                if self.dist.is_main:
                    mod.load_state_dict(sd)
        else:
            mod.load_state_dict(sd)

    def reference_state(self) -> Optional[dict]:
        """Several processes: the reference's full weights (main rank), for checkpoints of
        runs that reset their reference; every rank calls."""
        return self._full_state(self.reference) if self.reference is not None else None

    def load_reference_state(self, sd: Optional[dict]) -> None:
        if self.reference is not None:
            self._load_full(self.reference, sd)

    # ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """One process. (Several processes: ``dist.save_state`` plus :meth:`reference_state`.)"""
        d = {"policy": self.policy.state_dict(), "opt": self.opt.state_dict(), "updates": self.updates}
        if self.reference is not None:
            d["reference"] = self.reference.state_dict()
        if self.critic is not None:
            d["critic"] = self.critic.state_dict()
            d["critic_opt"] = self.critic_opt.state_dict()
        return d

    def load_state_dict(self, d: dict) -> None:
        self.policy.load_state_dict(d["policy"])
        self.opt.load_state_dict(d["opt"])
        self.updates = d.get("updates", 0)
        if self.reference is not None and "reference" in d:
            self.reference.load_state_dict(d["reference"])
        if self.critic is not None:
            self.critic.load_state_dict(d["critic"])
            self.critic_opt.load_state_dict(d["critic_opt"])
