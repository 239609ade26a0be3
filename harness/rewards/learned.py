"""Learned outcome and process reward models on the policy's own model code: P(good) at step tags (Math-Shepherd), trained with cross-entropy on exact labels.

A :class:`TaggedRM` is a causal LM of the policy's kind (for the tiny model: a copy of its
Llama with the character tokenizer) read by :class:`evals.prm.CausalLMPRM`: the question, then
the completion with a tag after each step (``prm``) or one tag after the whole completion
(``orm``); its score at a tag is P(good) = sigmoid(l_good - l_bad) over the tokens ``+`` and
``-``. The tag is Math-Shepherd's `` ки`` where the tokenizer knows it, else ``@`` (the
character tokenizer has no Cyrillic). Training is :func:`algorithms.reward_losses.tag_bce`
against the labels that :func:`evals.prm.step_labels` derives from an example's exact step
labels (``prm``) or its outcome label (``orm``), AdamW, one optimizer step per micro-batch, the
gradient norm clipped at 1.

Saved as a Hugging Face model folder plus ``reward_model.json`` (:data:`evals.prm.RM_SPEC_FILE`:
kind, tags, splitter, how it was made and what it cost), so ``algorithm.prm=<folder>`` (a
frozen PRM) and ``reward_model.init=<folder>`` both load it.
"""
from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Optional, Sequence

import torch

from algorithms.reward_losses import tag_bce
from evals.prm import RM_SPEC_FILE, CausalLMPRM, read_spec, spec_kwargs, step_labels, tag_margins
from evals.rm_metrics import quality
from evals.tasks import StepReward
from harness.config.algorithm import TRAINED_REWARD_MODELS
from harness.engine.models import load_policy, save_policy
from harness.rewards.data import Example

KINDS = TRAINED_REWARD_MODELS
GOOD, BAD = "+", "-"
SHEPHERD_TAG, CHAR_TAG = " ки", "@"
SPEC_FORMAT = "grpo-harness-reward-model/1"


def choose_tag(tokenizer) -> str:
    """Math-Shepherd's step tag where every token of it is known to ``tokenizer``, else ``@``."""
    ids = tokenizer(SHEPHERD_TAG, add_special_tokens=False)["input_ids"]
    unk = tokenizer.unk_token_id
    return SHEPHERD_TAG if ids and (unk is None or unk not in ids) else CHAR_TAG


def new_spec(kind: str, tokenizer) -> dict:
    """The ``reward_model.json`` core of a new reward model of ``kind`` (orm | prm)."""
    if kind not in KINDS:
        raise ValueError(f"reward model kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return {"format": SPEC_FORMAT, "kind": kind, "good_token": GOOD, "bad_token": BAD,
            "step_tag": choose_tag(tokenizer), "splitter": "whole" if kind == "orm" else "steps"}


class TaggedRM:
    """A trainable ORM / PRM: a causal LM scored at tags (see the module docstring)."""

    def __init__(self, model, tokenizer, spec: dict, *, device="cpu", lr: float = 1e-4, micro_batch_size: int = 64):
        self.spec = dict(spec)
        self.kind = spec["kind"]
        self.scorer = CausalLMPRM(model, tokenizer, device=str(device), **spec_kwargs(spec))
        self.model, self.tok = self.scorer.model, tokenizer
        self.model.requires_grad_(True)
        self.micro_batch_size = micro_batch_size
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.99))
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @classmethod
    def from_policy(cls, policy, tokenizer, kind: str, **kw) -> "TaggedRM":
        """A new reward model initialised from (a copy of) ``policy``."""
        return cls(copy.deepcopy(policy), tokenizer, new_spec(kind, tokenizer), **kw)

    @classmethod
    def load(cls, folder, *, device="cpu", **kw) -> "TaggedRM":
        """A reward model saved by :meth:`save` (``reward_model.json`` required)."""
        spec = read_spec(folder)
        if spec is None:
            raise FileNotFoundError(f"{folder}: no {RM_SPEC_FILE}; not a reward model written by `harness rm train`")
        model, tok = load_policy(str(folder))
        return cls(model, tok, spec, device=device, **kw)

    # ------------------------------------------------------------------ labels and scores
    def targets(self, ex: Example) -> tuple[list[int], list[int], list[float]]:
        """(token ids, tag positions, label of each tag) of an example as this model reads it."""
        ids, pos, steps = self.scorer.encode(ex.completion, ex.problem())
        if self.kind == "orm":
            return ids, pos, [float(ex.outcome)]
        exact = [StepReward(float(r), int(e)) for r, e in ex.steps]
        return ids, pos, step_labels(steps, exact)

    def margins(self, examples: Sequence[Example], grad: bool = False) -> list[torch.Tensor]:
        """Per example, l_good - l_bad at each of its tags (``micro_batch_size`` per forward)."""
        out: list[torch.Tensor] = []
        with torch.set_grad_enabled(grad):
            for s in range(0, len(examples), self.micro_batch_size):
                enc = [self.targets(e) for e in examples[s:s + self.micro_batch_size]]
                flat = tag_margins(self.model, [e[0] for e in enc], [e[1] for e in enc], self.scorer.good,
                                   self.scorer.bad, self.pad)
                k = 0
                for _, pos, _ in enc:
                    out.append(flat[k:k + len(pos)])
                    k += len(pos)
        return out

    def fit(self, examples: Sequence[Example], epochs: int, seed: int = 0) -> dict:
        """``epochs`` passes over ``examples`` in a seeded shuffled order, one optimizer step per
        micro-batch. Returns ``{"loss": mean loss of the last pass, "steps", "examples", "tags"}``."""
        examples = list(examples)
        steps, last, tags = 0, [], 0
        for epoch in range(epochs):
            order = list(range(len(examples)))
            random.Random(f"rm-fit-{seed}-{epoch}").shuffle(order)
            last = []
            for s in range(0, len(order), self.micro_batch_size):
                part = [examples[i] for i in order[s:s + self.micro_batch_size]]
                enc = [self.targets(e) for e in part]
                margin = tag_margins(self.model, [e[0] for e in enc], [e[1] for e in enc], self.scorer.good,
                                     self.scorer.bad, self.pad)
                labels = torch.tensor([y for e in enc for y in e[2]], dtype=torch.float32)
                loss = tag_bce(margin, labels)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
                steps += 1
                last.append(float(loss.item()))
                tags += int(labels.numel()) if epoch == 0 else 0
        return {"loss": sum(last) / len(last) if last else None, "steps": steps, "examples": len(examples),
                "tags": tags}

    def quality(self, examples: Sequence[Example]) -> dict:
        """Accuracy and AUC of this model against the examples' exact labels: ``outcome`` (an ORM's
        score, a PRM's lowest step score: Math-Shepherd's verification rule) and, for a PRM, ``steps``
        (every tag against its label)."""
        if not examples:
            return {}
        margins = self.margins(examples)
        probs = [torch.sigmoid(m).tolist() for m in margins]
        out = {"outcome": quality([min(p) if p else 0.0 for p in probs], [e.outcome for e in examples])}
        if self.kind == "prm":
            labels = [self.targets(e)[2] for e in examples]
            out["steps"] = quality([x for p in probs for x in p], [y for ls in labels for y in ls])
        return out

    def score_batch(self, completions, problems, finished) -> list:
        """Step rewards (:class:`evals.tasks.StepReward`) of each completion, as the trainer uses them."""
        return self.scorer.score_batch(completions, problems, finished, self.micro_batch_size)

    # ------------------------------------------------------------------ persistence
    def save(self, folder, extra: Optional[dict] = None) -> Path:
        folder = Path(folder)
        save_policy(self.model, self.tok, folder)
        (folder / RM_SPEC_FILE).write_text(json.dumps({**self.spec, **(extra or {})}, indent=1, sort_keys=True))
        return folder

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, d: dict) -> None:
        self.model.load_state_dict(d["model"])
        self.opt.load_state_dict(d["opt"])

