"""PRIME's implicit process reward model (Cui et al. 2025, arXiv 2502.01456): an LM trained online on outcome labels whose per-token log-ratio to a frozen reference is the process reward.

Both models start as copies of the policy's starting checkpoint (the SFT model, as in PRIME):
``model`` (pi_phi) trains, ``ref`` (pi_ref) stays frozen. On each batch of the policy's rollouts
(:meth:`ImplicitPRM.score_and_update`):

1. every micro-batch runs pi_phi (with gradients) and pi_ref (without) over the completions at
   temperature 1; the process reward of token t is beta * log(pi_phi(y_t) / pi_ref(y_t))
   (:func:`algorithms.reward_losses.implicit_token_rewards`), read from pi_phi *before* this
   batch's update, so the rewards the policy learns from are not fitted to its own labels;
2. the loss is PRIME's cross-entropy of sigmoid(beta * sum_t log ratio) against the batch's
   exact outcome labels (:func:`algorithms.reward_losses.implicit_prm_loss`, normalised by the
   batch's sequences), accumulated over the micro-batches into one AdamW step (gradient norm
   clipped at 1).

The rewards go to the learner as process rewards, one "step" per completion token
(``(reward, token index)`` pairs): the ``prime`` advantage (RLOO on the outcome plus
leave-one-out-baselined process returns) or ``grpo_ps`` (§4.1.3 over tokens) use them.
Not implemented from PRIME: its accuracy filter of prompts (keeping groups with accuracy in
[0.2, 0.8]) and its option to update the PRM before scoring.
"""
from __future__ import annotations

import copy

import torch

from algorithms.reward_losses import implicit_outcome_logit, implicit_prm_loss, implicit_token_rewards
from harness.engine.learner import make_batch, token_logprobs


class ImplicitPRM:
    kind = "implicit"

    def __init__(self, policy, *, beta: float, lr: float, micro_batch_size: int, device="cpu"):
        self.beta, self.micro_batch_size, self.device = beta, micro_batch_size, device
        self.model = copy.deepcopy(policy).train().requires_grad_(True)
        self.ref = copy.deepcopy(policy).eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.99))
        self.updates = 0

    def score_and_update(self, rollouts, labels: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Token rewards [B, T] of ``rollouts`` (pi_phi before the update), then one update on
        ``labels`` [B] (exact outcome rewards). Returns (rewards, metrics)."""
        b = make_batch(rollouts, self.device)
        B = b.input_ids.shape[0]
        labels = labels.float().to(self.device)
        rewards = torch.zeros_like(b.mask)
        logits, loss_sum = torch.zeros(B), 0.0
        self.opt.zero_grad(set_to_none=True)
        for s in range(0, B, self.micro_batch_size):
            sl = slice(s, min(s + self.micro_batch_size, B))
            mb = b.rows(sl)
            with torch.no_grad():
                ref_lp = token_logprobs(self.ref, mb, 1.0)
            lp = token_logprobs(self.model, mb, 1.0)
            rewards[sl] = implicit_token_rewards(lp.detach(), ref_lp, mb.mask, self.beta)
            logits[sl] = implicit_outcome_logit(lp.detach(), ref_lp, mb.mask, self.beta).cpu()
            loss = implicit_prm_loss(lp, ref_lp, mb.mask, labels[sl], self.beta, num_seqs=B)
            loss.backward()
            loss_sum += float(loss.item())
        gn = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.updates += 1
        pos = labels.cpu() >= 0.5
        metrics = {"train/prm_loss": loss_sum, "train/prm_grad_norm": gn,
                   "train/prm_acc": float(((logits > 0) == pos).float().mean().item()),
                   "rollout/prm_token_reward_mean": float(rewards.sum().item() / max(b.mask.sum().item(), 1.0))}
        return rewards, metrics

    @staticmethod
    def as_steps(rewards: torch.Tensor, mask: torch.Tensor) -> list:
        """Per sequence, ``(token reward, token index)`` for every completion token."""
        out = []
        for r, m in zip(rewards.cpu().tolist(), mask.cpu().sum(1).long().tolist()):
            out.append([(float(r[t]), t) for t in range(int(m))])
        return out

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "updates": self.updates}

    def load_state_dict(self, d: dict) -> None:
        self.model.load_state_dict(d["model"])
        self.opt.load_state_dict(d["opt"])
        self.updates = int(d.get("updates", 0))
