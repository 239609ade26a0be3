"""LoRA as a model option (``model.lora``): low-rank adapters on a frozen base, through PEFT.

- :func:`apply_lora` wraps the starting policy with PEFT's ``get_peft_model`` (``LoraConfig``: rank,
  alpha, target modules, dropout 0): the base weights are frozen, each target linear layer gains
  ``W + (alpha / r) B A`` with ``B`` zero, so the wrapped model computes exactly what the base does
  until the first update.
- :class:`AdapterOffView` is the reference model of a LoRA run: the policy with its adapters off. It
  holds no weights of its own (the frozen base *is* the starting policy), so no second copy of the
  model exists; the learner calls it as any model (``harness.engine.fastlm`` reads the base's
  weights without the adapters; the ``transformers`` forward runs under PEFT's ``disable_adapter()``).
- :func:`shared_base_copy` copies the policy for PPO's critic backbone sharing every frozen weight
  (the critic trains its own adapters and head).
- :func:`trainable_state` / :func:`load_trainable_state`: what a resume point keeps of a LoRA model
  (its adapters; the frozen base is reloaded from where it came); :func:`merged_state_dict` and
  :func:`save_lora_policy`: ``final_model/`` as merged weights ``from_pretrained`` loads, plus the
  adapter alone in ``final_model/adapter/`` (PEFT's ``PeftModel.from_pretrained`` loads it).

PEFT is an optional dependency (the ``lora`` extra); it is imported only where LoRA is on.
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.foundation.errors import ModelLoadError

ADAPTER_DIR = "adapter"
"""The subfolder of ``final_model/`` holding the adapter alone (PEFT's format)."""


def is_lora(model) -> bool:
    """Whether ``model`` is a PEFT-wrapped model (:func:`apply_lora`'s result)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def apply_lora(model, lora_cfg):
    """``model`` wrapped with LoRA adapters as ``lora_cfg`` (``model.lora``) says; ``model`` itself when
    the rank is 0. The adapters' A is drawn from torch's RNG (seeded by the run)."""
    if not lora_cfg.enabled:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ModelLoadError("model.lora.rank > 0 needs PEFT: pip install 'grpo-harness[lora]'") from None
    conf = LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=0.0,
                      target_modules=list(lora_cfg.target_modules), bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, conf)


def trainable_count(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class AdapterOffView(nn.Module):
    """The policy with its LoRA adapters off: the frozen starting model, as a reference that holds no
    weights (``parameters()`` is empty; ``policy`` is not a submodule)."""

    adapters_off = True  # harness.engine.fastlm reads the base's weights alone

    def __init__(self, policy):
        super().__init__()
        object.__setattr__(self, "policy", policy)  # not registered: its weights are not this module's

    @property
    def config(self):
        return self.policy.config

    @property
    def lm_head(self):
        return self.policy.get_base_model().lm_head

    def forward(self, *args, **kwargs):
        with self.policy.disable_adapter():
            return self.policy(*args, **kwargs)


def unwrap(model) -> tuple[Any, bool]:
    """(the plain ``transformers`` model under ``model``, whether its LoRA adapters are on): through an
    :class:`AdapterOffView` (off) and a PEFT wrapper; any other model is itself, adapters on (it has none)."""
    if getattr(model, "adapters_off", False):
        return unwrap(model.policy)[0], False
    if is_lora(model):
        return model.get_base_model(), True
    return model, True


def frozen_params(model) -> list:
    return [p for p in model.parameters() if not p.requires_grad]


def shared_base_copy(policy):
    """A copy of ``policy`` whose frozen weights are the policy's own tensors (not copied) and whose
    trainable ones (the adapters) are its own."""
    memo = {id(p): p for p in frozen_params(policy)}
    return copy.deepcopy(policy, memo)


def _trainable_names(model) -> set:
    return {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}


def has_frozen_base(model) -> bool:
    """Whether ``model`` (a policy or a critic) trains only part of its weights (LoRA)."""
    return any(not p.requires_grad for p in model.parameters())


def trainable_state(model) -> dict:
    """``model.state_dict()`` less its frozen weights (a LoRA model: the adapters, plus a critic's head);
    the whole state dict of a model that trains every weight."""
    sd = model.state_dict()
    if not has_frozen_base(model):
        return sd
    keep = _trainable_names(model)
    return {k: v for k, v in sd.items() if k in keep}


def load_trainable_state(model, state: dict) -> None:
    """:func:`trainable_state`'s inverse: every trainable weight must be in ``state``, and nothing else."""
    if not has_frozen_base(model):
        model.load_state_dict(state)
        return
    keep = _trainable_names(model)
    missing, extra = sorted(keep - set(state)), sorted(set(state) - set(model.state_dict()))
    if missing or extra:
        raise KeyError(f"LoRA state does not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
    model.load_state_dict(state, strict=False)


def lora_layers(base) -> list:
    """(name, PEFT LoRA linear layer) of every adapted layer of ``base`` (the model under the wrapper)."""
    return [(n, m) for n, m in base.named_modules() if hasattr(m, "base_layer") and hasattr(m, "lora_A")]


@torch.no_grad()
def merged_state_dict(policy) -> dict:
    """The state dict of the plain model the LoRA ``policy`` computes: every adapted weight merged
    (``W + delta``, PEFT's ``get_delta_weight``), under the base model's own key names."""
    base = policy.get_base_model()
    merged = {}
    for name, layer in lora_layers(base):
        w = layer.base_layer.weight.detach().clone()
        for adapter in layer.active_adapters:
            w += layer.get_delta_weight(adapter)
        merged[f"{name}.weight"] = w
    out = {}
    for k, v in base.state_dict().items():
        if ".lora_" in k:
            continue
        plain = k.replace(".base_layer.", ".")
        out[plain] = merged.get(plain, v)
    return out


def save_lora_policy(policy, tokenizer, path: str | os.PathLike) -> None:
    """``path``: the merged model (``from_pretrained`` loads it as a plain model), its tokenizer, and the
    adapter alone in ``path/adapter`` (``PeftModel.from_pretrained(base, path/adapter)``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    policy.get_base_model().save_pretrained(str(path), state_dict=merged_state_dict(policy))
    tokenizer.save_pretrained(str(path))
    policy.save_pretrained(str(path / ADAPTER_DIR))
