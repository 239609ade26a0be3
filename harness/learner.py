"""The learner: one train step shared by every algorithm.

Rollouts -> (filter) -> reference / critic / old log-probs (only what the algorithm
needs) -> advantages -> mu passes of micro-batched clipped-surrogate (or SFT) updates.
Nothing here branches on an algorithm's name: the resolved components decide.

Memory and time discipline:
- logits are computed only for completion positions (``logits_to_keep``), never for the
  prompt, and never for the full vocabulary of positions that are not scored;
- with mu = 1 and no KL in the reward, the old log-probs *are* the current ones: the
  ratio is ``exp(logp - logp.detach())`` (value 1, gradient of logp) and no extra
  forward runs;
- the reference model only exists when a KL term is on; the critic only for PPO.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from algorithms.advantages import ADVANTAGES, AdvantageInput, gae, outcome_token_rewards
from algorithms.filters import FILTERS
from algorithms.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, AggContext, clipped_value_loss
from algorithms.presets import ResolvedAlgorithm


class ValueModel(nn.Module):
    """Critic: a copy of the policy's backbone with a scalar head (same size as the policy)."""

    def __init__(self, policy):
        super().__init__()
        self.backbone = copy.deepcopy(policy.get_decoder() if hasattr(policy, "get_decoder") else policy.model)
        hidden = policy.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids, num_completion: int) -> torch.Tensor:
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
        # V(s_t) for completion token t is read where token t is predicted: position P+t-1
        h = h[:, -num_completion - 1:-1]
        return self.head(h).squeeze(-1).float()


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
    """log pi(target_t | prefix) for completion tokens only, [B, T]."""
    out = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids,
                logits_to_keep=b.T + 1, use_cache=False)
    logits = out.logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, -1)
    return logits.gather(-1, b.targets[..., None]).squeeze(-1) - lse


def _chunks(n: int, size: int):
    for s in range(0, n, size):
        yield slice(s, min(s + size, n))


class Learner:
    def __init__(self, policy, algo: ResolvedAlgorithm, cfg, device, perf, reference=None, critic=None):
        self.policy, self.algo, self.cfg, self.device, self.perf = policy, algo, cfg, device, perf
        self.reference, self.critic = reference, critic
        tc = cfg.train
        self.opt = torch.optim.AdamW(policy.parameters(), lr=tc.lr, weight_decay=tc.weight_decay, betas=(0.9, 0.99))
        self.critic_opt = (torch.optim.AdamW(critic.parameters(), lr=cfg.algorithm.critic_lr, betas=(0.9, 0.99))
                           if critic is not None else None)
        self.policy_loss = POLICY_LOSSES.get(algo.policy_loss)
        self.aggregate = AGGREGATIONS.get(algo.aggregation)
        self.kl = KL_ESTIMATORS.get(algo.kl_estimator)
        self.advantage = ADVANTAGES.get(algo.advantage)
        self.filter = FILTERS.get(algo.filter)
        self.temperature = cfg.sampling.temperature
        self.updates = 0
        self.progress = 0.0  # fraction of the budget consumed before this step (set by the trainer)

    def init_optimizer_from(self, path: str) -> None:
        """Adopt a checkpoint's Adam second moments (and step counts); zero the first moments."""
        state = torch.load(path, weights_only=False)
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
        mb = self.cfg.train.micro_batch_size
        return torch.cat([fn(model, b.rows(s)) for s in _chunks(b.input_ids.shape[0], mb)], 0)

    def step(self, rollouts, rewards: torch.Tensor, step_rewards: list, step: int) -> dict:
        """One exploration stage's update. Returns train/* metrics."""
        algo, acfg, tc = self.algo, self.cfg.algorithm, self.cfg.train
        n = rollouts.n
        m: dict[str, float] = {}
        keep = self.filter(rewards, rollouts.completions, n)
        m["train/kept_fraction"] = keep.float().mean().item()
        b = make_batch(rollouts, self.device)
        B = b.input_ids.shape[0]
        needs_old = tc.inner_epochs > 1 or algo.kl_placement == "reward"
        with self.perf.phase("reference"):
            ref_logp = (self._forward_nograd(self.reference, b, lambda mdl, x: token_logprobs(mdl, x, self.temperature))
                        if self.reference is not None and algo.uses_reference else None)
        with self.perf.phase("old_logprobs"):
            old_logp = (self._forward_nograd(self.policy, b, lambda mdl, x: token_logprobs(mdl, x, self.temperature))
                        if needs_old else None)
        values = None
        if self.critic is not None:
            with self.perf.phase("critic_forward"):
                values = self._forward_nograd(
                    self.critic, b, lambda mdl, x: mdl(x.input_ids, x.attention_mask, x.position_ids, x.T)) * b.mask
        token_rewards = None
        if algo.kl_placement == "reward" and ref_logp is not None:
            kl_tok = self.kl(old_logp, ref_logp) * b.mask
            token_rewards = -algo.kl_coef * kl_tok
            m["train/kl_reward_penalty"] = (kl_tok.sum(1).mean()).item()
        inp = AdvantageInput(rewards=rewards.float().to(self.device), mask=b.mask, n=n, step_rewards=step_rewards,
                             values=values, token_rewards=token_rewards, std_eps=acfg.std_eps,
                             gamma=acfg.gae_gamma, lam=acfg.gae_lambda)
        adv = self.advantage(inp)
        returns = None
        if values is not None:
            _, returns = gae(outcome_token_rewards(inp), values, b.mask, acfg.gae_gamma, acfg.gae_lambda)
        idx = keep.nonzero().squeeze(-1).to(self.device)
        if idx.numel() == 0:  # e.g. RFT with no correct completion: nothing to learn from
            m.update({"train/loss": 0.0, "train/skipped": 1.0})
            return m
        b = b.rows(idx)
        adv, ref_logp = adv[idx], (ref_logp[idx] if ref_logp is not None else None)
        old_logp = old_logp[idx] if old_logp is not None else None
        values, returns = (values[idx], returns[idx]) if values is not None else (None, None)
        nz = b.mask.bool()
        m["train/adv_mean"] = adv[nz].mean().item()
        m["train/adv_abs_mean"] = adv[nz].abs().mean().item()
        ctx = AggContext(num_seqs=b.input_ids.shape[0], num_tokens=int(b.mask.sum().item()),
                         const_len=acfg.dr_grpo_norm or self.cfg.sampling.max_new_tokens)
        policy_frozen = step < acfg.critic_warmup_steps
        for g in self.opt.param_groups:
            g["lr"] = tc.lr * self._lr_scale(step)
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "value_loss": 0.0, "ratio_max": 0.0}
        for epoch in range(tc.inner_epochs):
            if not policy_frozen:
                self.opt.zero_grad(set_to_none=True)
                for sl in _chunks(b.input_ids.shape[0], tc.micro_batch_size):
                    mb = b.rows(sl)
                    with self.perf.phase("policy_forward"):
                        logp = token_logprobs(self.policy, mb, self.temperature)
                        old = old_logp[sl] if old_logp is not None else logp.detach()
                        pg_tok = self.policy_loss(logp, old, adv[sl], acfg.clip_eps)
                        pg = self.aggregate(pg_tok, mb.mask, ctx)
                        loss = pg
                        if algo.kl_placement == "loss" and ref_logp is not None:
                            kl = self.aggregate(self.kl(logp, ref_logp[sl]), mb.mask, ctx)
                            loss = loss + algo.kl_coef * kl
                            sums["kl"] += kl.item()
                    if not torch.isfinite(loss):
                        raise FloatingPointError(
                            f"policy loss is {loss.item()} at step {step} (epoch {epoch}); "
                            f"try a lower train.lr or check the rewards")
                    with self.perf.phase("backward"):
                        loss.backward()
                    with torch.no_grad():
                        ratio = torch.exp(logp.detach() - old)
                        clipped = ((ratio - 1).abs() > acfg.clip_eps).float() * mb.mask
                        sums["clip_frac"] += clipped.sum().item()
                        sums["ratio_max"] = max(sums["ratio_max"], (ratio * mb.mask).max().item())
                    sums["loss"] += loss.item()
                    sums["pg_loss"] += pg.item()
                with self.perf.phase("optimizer"):
                    if tc.max_grad_norm > 0:
                        gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), tc.max_grad_norm)
                        m["train/grad_norm"] = float(gn)
                    self.opt.step()
            if self.critic is not None:
                self.critic_opt.zero_grad(set_to_none=True)
                vctx = AggContext(num_seqs=b.input_ids.shape[0], num_tokens=ctx.num_tokens, const_len=ctx.const_len)
                for sl in _chunks(b.input_ids.shape[0], tc.micro_batch_size):
                    mb = b.rows(sl)
                    with self.perf.phase("critic_forward"):
                        v = self.critic(mb.input_ids, mb.attention_mask, mb.position_ids, mb.T)
                        vl = acfg.value_coef * self.aggregate(
                            clipped_value_loss(v, values[sl], returns[sl], acfg.value_clip), mb.mask, vctx)
                    if not torch.isfinite(vl):
                        raise FloatingPointError(f"value loss is {vl.item()} at step {step}; try a lower algorithm.critic_lr")
                    with self.perf.phase("critic_backward"):
                        vl.backward()
                    sums["value_loss"] += vl.item()
                with self.perf.phase("critic_optimizer"):
                    if tc.max_grad_norm > 0:
                        torch.nn.utils.clip_grad_norm_(self.critic.parameters(), tc.max_grad_norm)
                    self.critic_opt.step()
        E = tc.inner_epochs
        m["train/loss"] = sums["loss"] / E
        m["train/pg_loss"] = sums["pg_loss"] / E
        if algo.kl_placement == "loss" and ref_logp is not None:
            m["train/kl"] = sums["kl"] / E
        m["train/clip_frac"] = sums["clip_frac"] / max(ctx.num_tokens * E, 1)
        m["train/ratio_max"] = sums["ratio_max"]
        if self.critic is not None:
            m["train/value_loss"] = sums["value_loss"] / E
            m["train/value_mean"] = (values[b.mask.bool()].mean().item())
        m["train/lr"] = tc.lr * self._lr_scale(step)
        m["train/policy_frozen"] = float(policy_frozen)
        self.updates += 1
        return m

    def reset_reference(self) -> None:
        """Iterative RL: the reference becomes a copy of the current policy."""
        if self.reference is not None:
            self.reference.load_state_dict(self.policy.state_dict())

    # ------------------------------------------------------------------
    def state_dict(self) -> dict:
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
