"""PPO's critic in a learner update: its values for GAE and its training passes (the value model is learner.ValueModel).

Two ways to train it, chosen by the learner (``Learner._fuses_critic``):

- fused (one optimizer step per batch, one process, every row kept): the critic's one training
  pass over the whole batch comes first, each micro-batch's GAE targets computed from its own
  values before the update, so that pass also yields the values the advantages need and no
  separate value forward runs (:meth:`Critic.fused_pass`);
- otherwise: a no-grad forward gives the values (:meth:`Critic.values`), and after each epoch's
  policy steps the critic takes one optimizer step per mini-batch against them and their returns
  (:meth:`Critic.train_pass`).

Its loss is :func:`algorithms.objective.value_objective` (clipped around the values from before
the update), normalised like the policy's.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from algorithms.advantages import AdvantageInput, gae, outcome_token_rewards
from algorithms.losses import AggContext
from algorithms.objective import value_objective
from harness.engine.batching import MiniBatch, Plan, Stepper, chunks, forward_nograd, micro


class Critic:
    """The critic ``model`` (prepared) with its optimizer ``opt``; ``algo``: the resolved algorithm
    (GAE's gamma and lambda, the value loss's coefficient and clip, the aggregation)."""

    def __init__(self, model, opt, algo, micro_batch_size: int, stepper: Stepper, perf):
        self.model, self.opt, self.algo = model, opt, algo
        self.micro_batch_size, self.stepper, self.perf = micro_batch_size, stepper, perf

    def values(self, b) -> torch.Tensor:
        """The critic's values V(s_t) [B, T] (zero on padding), no gradient."""
        with self.perf.phase("critic_forward"):
            return forward_nograd(self.model, b, lambda mdl, x: mdl(x.input_ids, x.attention_mask, x.position_ids, x.T),
                                  self.micro_batch_size) * b.mask

    def fused_pass(self, b, inp: AdvantageInput, const_len: int, step: int) -> tuple[float, torch.Tensor]:
        """The critic's one training pass over the whole batch ``b``, each micro-batch's GAE
        targets computed from its own values before the update. Returns (value loss, values [B, T])."""
        algo, B = self.algo, b.input_ids.shape[0]
        vctx = AggContext(num_seqs=B, num_tokens=int(b.mask.sum().item()), const_len=const_len)

        def fused_targets(sl, mb, v):  # (old values, returns) of a micro-batch from its own values
            old = v.detach() * mb.mask
            tr = inp.token_rewards[sl] if inp.token_rewards is not None else None
            rows = replace(inp, rewards=inp.rewards[sl], mask=mb.mask, token_rewards=tr, step_rewards=[])
            return old, gae(outcome_token_rewards(rows), old, mb.mask, algo.gae_gamma, algo.gae_lambda)[1]
        loss, seen = self._pass(b, list(chunks(B, self.micro_batch_size)), vctx, fused_targets, step)
        return loss, torch.cat(seen, 0)

    def train_pass(self, plan: Plan, mini: MiniBatch, step: int) -> float:
        """One optimizer step over ``mini``'s micro-batches of the kept rows, against their values
        from before the update and their returns; its summed value loss."""
        return self._pass(plan.b, mini.slices, mini.ctx, lambda sl, mb, v: (plan.values[sl], plan.returns[sl]),
                          step)[0]

    def _pass(self, b, slices: list, vctx: AggContext, targets, step: int) -> tuple[float, list]:
        """One optimizer step of the critic over the micro-batches ``slices`` of ``b``.
        ``targets(sl, mb, v)`` gives (old values, returns) of micro-batch ``sl`` from its current
        values ``v``. Returns the summed value loss and each micro-batch's old values."""
        algo, run = self.algo, self.stepper
        run.zero_grad(self.opt)
        total, seen = 0.0, []
        for i, part in enumerate(slices):
            mb, sl = micro(b, part)
            with run.accumulate(self.model, last=i == len(slices) - 1):
                with self.perf.phase("critic_forward"):
                    v = self.model(mb.input_ids, mb.attention_mask, mb.position_ids, mb.T)
                    old, ret = targets(sl, mb, v)
                    vl = value_objective(v, old, ret, mb.mask, vctx, aggregation=algo.aggregation,
                                         value_coef=algo.value_coef, value_clip=algo.value_clip)
                if not torch.isfinite(vl):
                    raise FloatingPointError(f"value loss is {vl.item()} at step {step}; "
                                             f"try a lower algorithm.critic_lr")
                with self.perf.phase("critic_backward"):
                    run.backward(self.model, vl)
            total += vl.item()
            seen.append(old)
        with self.perf.phase("critic_optimizer"):
            run.step(self.model, self.opt)
        return total, seen
