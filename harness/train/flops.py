"""Training FLOPs of a stage, counted from the tokens it processed: the study's compute axis.

**Model FLOPs**, the maths a stage asks for, not what the hardware ran: for a row of T real tokens
(its prompt and completion, padding excluded), one forward through a model with M matmul
weights (every ``nn.Linear``, the LM head included) and L layers of attention width A costs

    F(T) = 2 M T + 4 A L T (T + 1) / 2        (the matmuls, then causal QK^T and AV)

and a forward with its backward U(T) (:func:`update_flops`): the backward's gradient with respect to
every matmul's input (2 M T) and to every *trained* weight (2 M_t T, M_t the weights that require a
gradient), and twice the attention's forward, so U = 3 F when every weight trains, and about 2 F under
LoRA, whose frozen base weights get no gradient (M_t: the adapters, and a critic's head). A stage then
adds up, over its rows:

- generation: F (one forward over the prompt and the completion; a KV cache changes how, not how much);
- the reference's forward, where the algorithm has a KL term (``algorithm.uses_reference``): F;
- the old log-probs' forward, where the update needs them and the sampler's cannot stand in
  (several optimizer steps per batch or a KL in the reward, with a sampler other than the
  in-process float32 one): F;
- the policy's update: U per epoch (``train.inner_epochs``) over the rows it trains on (the
  stage's ``train/kept_fraction`` of them: RFT trains on its correct samples only);
- PPO's critic: its values' forward F_c (unless fused into its first training pass) and U_c per
  epoch (F_c and U_c with the critic's matmul weights);
- a rule-based reward costs nothing here.

Not counted, and so not emitted: learned reward models (scoring, training, labelling; their costs
are in ``summary.json``'s ``reward_model.cost``): a run with ``reward_model.type`` set writes no
``perf/flops``, so its arm gets no FLOP axis rather than a flattering one. What the fast forward
saves (each distinct prompt computed once per group, ``harness.engine.fastlm``) and what it adds
(layer recomputation) are hardware matters: the count is the same with or without them.
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["matmul_weights", "forward_flops", "update_flops", "stage_flops", "drawn_stage_flops"]


def matmul_weights(model, trained_only: bool = False) -> int:
    """M: the weights of the model's ``nn.Linear`` layers (the LM head included, tied or not); with
    ``trained_only``, M_t: those whose weight requires a gradient."""
    return sum(m.weight.numel() for m in model.modules()
               if isinstance(m, torch.nn.Linear) and (m.weight.requires_grad or not trained_only))


def _attention_width_layers(model) -> tuple[int, int]:
    """(A, L) from the config of the model, or of the first submodule that has one (a critic's backbone)."""
    cfg = next((getattr(m, "config", None) for m in model.modules()
                if getattr(getattr(m, "config", None), "num_attention_heads", None)), None)
    heads = int(getattr(cfg, "num_attention_heads", 0) or 0)
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    head_dim = int(getattr(cfg, "head_dim", 0) or 0) or (hidden // heads if heads else 0)
    return heads * head_dim, int(getattr(cfg, "num_hidden_layers", 0) or 0)


def forward_flops(model, lengths: torch.Tensor) -> float:
    """F summed over rows of ``lengths`` real tokens each (see the module doc)."""
    lengths = lengths.to(torch.float64)
    width, layers = _attention_width_layers(model)
    return float(2.0 * matmul_weights(model) * lengths.sum() + 2.0 * width * layers * (lengths * (lengths + 1)).sum())


def update_flops(model, lengths: torch.Tensor, f: Optional[float] = None) -> float:
    """U summed over rows of ``lengths`` real tokens each: a forward and its backward (see the module doc):
    F + 2 M T + 2 M_t T + 2 x the attention's forward. ``f``: the rows' F, where the caller has it."""
    f = forward_flops(model, lengths) if f is None else f
    m, trained = matmul_weights(model), matmul_weights(model, trained_only=True)
    if trained == m:
        return 3.0 * f  # every weight trains: as counted before LoRA, to the last bit
    tokens = float(lengths.to(torch.float64).sum())
    return f + 2.0 * (m + trained) * tokens + 2.0 * (f - 2.0 * m * tokens)


def stage_flops(cfg, learner, rollouts, kept_fraction: float, fused_critic: bool) -> Optional[float]:
    """The model FLOPs of one stage on this process (None where they are not counted: a learned
    reward model). ``kept_fraction``: the share of rows the update trained on; ``fused_critic``:
    whether the critic's values came from its first training pass (``Learner._fuses_critic``).
    Which forwards ran is the learner's own rule (``needs_old_logprobs``,
    ``sampler_logprobs_usable``)."""
    if cfg.reward_model.type is not None:
        return None
    algo, E = cfg.algo, cfg.train.inner_epochs
    lengths = rollouts.prompt_mask.sum(1).cpu() + rollouts.completion_mask.sum(1).cpu()
    f = forward_flops(learner.policy, lengths)
    u = update_flops(learner.policy, lengths, f)
    total = f * (1 + 3 * E * kept_fraction) if u == 3.0 * f else f + u * E * kept_fraction  # generation; update
    if algo.uses_reference and learner.reference is not None:
        total += f
    if learner.needs_old_logprobs and not learner.sampler_logprobs_usable():
        total += f
    if learner.critic is not None:
        fc = forward_flops(learner.critic, lengths)
        uc = update_flops(learner.critic, lengths, fc)
        total += (fc * (3 * E * kept_fraction + (0 if fused_critic else 1)) if uc == 3.0 * fc
                  else uc * E * kept_fraction + (0 if fused_critic else fc))
    return total


def drawn_stage_flops(cfg, learner, used, drawn, kept_fraction: float) -> Optional[float]:
    """:func:`stage_flops` of a stage whose learner trained on ``used`` while it drew ``drawn`` (dynamic
    sampling: the dropped groups were generated too; None: ``used`` is all it drew): the update's work
    on ``used`` and the generation of every row of ``drawn``. ``fused_critic`` is the learner's rule."""
    fused = learner._fuses_critic(torch.tensor(kept_fraction == 1.0))
    if drawn is None:
        return stage_flops(cfg, learner, used, kept_fraction, fused_critic=fused)
    total = stage_flops(cfg, learner, used, kept_fraction, fused_critic=fused) if used.num_sequences else 0.0
    if total is None:
        return None

    def gen(ro) -> float:
        return forward_flops(learner.policy, ro.prompt_mask.sum(1).cpu() + ro.completion_mask.sum(1).cpu())
    return total + gen(drawn) - (gen(used) if used.num_sequences else 0.0)
