"""Process reward models: one score per reasoning step.

GRPO with process supervision needs, for each completion, a list of step rewards with the
character offset where each step ends (:class:`evals.tasks.StepReward`). Where they come
from is pluggable:

- :class:`RuleBasedPRM` — the task's own checker (``arith`` checks every step exactly, scores
  each skipped reduction as a 0 step and credits the final answer only where the outcome reward
  is 1 and every operation was reduced: see :mod:`evals.arith`).
- :class:`CausalLMPRM` — a neural PRM in the style of Math-Shepherd (Wang et al., 2023):
  a causal LM reads the question and the steps, each followed by a step tag, and the
  step's score is P(good) / (P(good) + P(bad)) at the tag. It is loaded from a local
  directory (or GGUF file); nothing is downloaded. It scores only the steps written: no
  step count is known to it, so skipped work is whatever the model makes of it.

An outcome reward model is the same machinery with one tag after the whole completion
(:func:`whole_completion` as the splitter). Reward models trained by ``harness rm train``
(:mod:`harness.rewards`) are saved with a ``reward_model.json`` (:data:`RM_SPEC_FILE`) naming
their kind and tags; :func:`spec_kwargs` turns it into this class's arguments. Their training
labels come from an exact checker through :func:`step_labels`; their batched scores (training and
scoring read the same tag positions) through :meth:`CausalLMPRM.encode` and :func:`tag_margins`.

``harness.engine.models.load_prm(spec, task)`` builds one from ``algorithm.prm`` (null = rule-based).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

import torch

from evals.tasks import Problem, StepReward, Task


class ProcessRewardModel(Protocol):
    def step_rewards(self, completion: str, problem: Problem, finished: bool = True) -> list[StepReward]: ...


class RuleBasedPRM:
    """Step rewards from the task's own checker."""

    def __init__(self, task: Task):
        if not task.has_process_rewards:
            raise ValueError(f"task '{task.name}' has no rule-based step checker; "
                             f"set algorithm.prm to a local process reward model")
        self.task = task

    def step_rewards(self, completion: str, problem: Problem, finished: bool = True) -> list[StepReward]:
        return self.task.step_rewards(completion, problem, finished)


def split_steps(text: str, sep: str = r"\n+|;") -> list[tuple[str, int]]:
    """(step text, end offset) pairs; a step ends after its separator."""
    out, pos = [], 0
    for m in re.finditer(sep, text):
        if m.start() > pos:
            out.append((text[pos:m.start()], m.end()))
        pos = m.end()
    if pos < len(text):
        out.append((text[pos:], len(text)))
    return out


def whole_completion(text: str) -> list[tuple[str, int]]:
    """The splitter of an outcome reward model: the whole completion is one step (one tag after it)."""
    return [(text, len(text))]


SPLITTERS = {"steps": split_steps, "whole": whole_completion}
"""Splitters by the name a ``reward_model.json`` gives them."""
RM_SPEC_FILE = "reward_model.json"
"""The file that makes a model folder a reward model of this harness (kind, tags, splitter)."""


def read_spec(folder) -> Optional[dict]:
    """The ``reward_model.json`` of ``folder`` (None when it has none: e.g. a Math-Shepherd model
    folder, scored with this module's defaults)."""
    f = Path(folder) / RM_SPEC_FILE
    if not f.is_file():
        return None
    spec = json.loads(f.read_text())
    if not isinstance(spec, dict) or spec.get("kind") not in ("orm", "prm"):
        raise ValueError(f"{f}: not a reward-model spec (expected a mapping with kind orm or prm)")
    return spec


def spec_kwargs(spec: Optional[dict]) -> dict:
    """:class:`CausalLMPRM` keyword arguments from a ``reward_model.json`` (empty for None)."""
    if not spec:
        return {}
    return {"good_token": spec["good_token"], "bad_token": spec["bad_token"], "step_tag": spec["step_tag"],
            "splitter": SPLITTERS[spec.get("splitter", "whole" if spec["kind"] == "orm" else "steps")]}


def step_labels(steps: Sequence[tuple[str, int]], exact: Sequence[StepReward]) -> list[float]:
    """The label of each written step (``(text, end)`` as the splitter gives them) from an exact
    checker's step rewards: the minimum of the exact rewards that end within the step (after the
    previous step's end, up to its own); exact rewards ending after the last step fold into it, and
    a step with none of its own takes the label of the next exact reward. So a step is labelled 1
    only when everything the checker scored inside it is right, and the last step carries what the
    checker says about the end (arith: skipped reductions and the final answer)."""
    out, prev = [], -1
    rewards = sorted(((int(r.end), float(r.reward)) for r in exact), key=lambda x: x[0])
    for j, (_, end) in enumerate(steps):
        last = j == len(steps) - 1
        inside = [r for e, r in rewards if prev < e <= end or (last and e > end)]
        if not inside:
            later = [r for e, r in rewards if e > end]
            inside = later[:1] or [0.0]
        out.append(min(inside))
        prev = end
    return out


def tag_margins(model, seqs: Sequence[Sequence[int]], positions: Sequence[Sequence[int]], good: int, bad: int,
                pad_id: int = 0) -> "torch.Tensor":
    """l_good - l_bad at every tag position of every sequence, concatenated in order (one forward
    of the right-padded batch; with gradients unless the caller disables them). Llama-style
    models run their decoder and apply the LM head to the tag positions only."""
    device = next(model.parameters()).device
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, :len(s)] = 1
    rows = torch.tensor([i for i, pos in enumerate(positions) for _ in pos], dtype=torch.long, device=device)
    cols = torch.tensor([c for pos in positions for c in pos], dtype=torch.long, device=device)
    ids, mask = ids.to(device), mask.to(device)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if head is not None and decoder is not None:
        h = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = head(h[rows, cols]).float()
    else:
        kw = {"attention_mask": mask} if not bool(mask.all()) else {}  # no padding: the plain call
        logits = model(input_ids=ids, **kw).logits[rows, cols].float()
    return logits[:, good] - logits[:, bad]


class CausalLMPRM:
    """Math-Shepherd-style PRM: score = P(good) / (P(good) + P(bad)) after each step tag."""

    def __init__(self, model, tokenizer, *, good_token: str = "+", bad_token: str = "-", step_tag: str = " ки",
                 splitter: Callable[[str], list[tuple[str, int]]] = split_steps, device: str = "cpu"):
        self.model, self.tok = model.to(device).eval(), tokenizer
        self.device, self.step_tag, self.splitter = device, step_tag, splitter
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in (good_token, bad_token)]
        if any(len(i) != 1 for i in ids):
            raise ValueError(f"good/bad tokens must each be one token; got {ids}")
        self.good, self.bad = ids[0][0], ids[1][0]
        self.tag_ids = tokenizer(step_tag, add_special_tokens=False)["input_ids"]

    def encode(self, completion: str, problem: Problem) -> tuple[list[int], list[int], list[tuple[str, int]]]:
        """(token ids, the tag positions, the steps) of a completion as this model reads it: the
        question and a newline, then each step followed by the step tag; a completion without a
        step gets one tag right after the question (training needs a position to label)."""
        steps = self.splitter(completion or "") or [("", 0)]
        ids = self.tok(problem.question + "\n")["input_ids"]
        tag_pos = []
        for text, _ in steps:
            ids = ids + self.tok(text, add_special_tokens=False)["input_ids"] + self.tag_ids
            tag_pos.append(len(ids) - 1)
        return ids, tag_pos, steps

    @torch.no_grad()
    def step_rewards(self, completion: str, problem: Problem, finished: bool = True) -> list[StepReward]:
        if not self.splitter(completion or ""):
            return [StepReward(0.0, len(completion or ""))]
        return self.score_batch([completion], [problem], [finished])[0]

    @torch.no_grad()
    def score_batch(self, completions: Sequence[str], problems: Sequence[Problem], finished: Sequence[bool],
                    micro_batch_size: int = 64) -> list[list[StepReward]]:
        """:meth:`step_rewards` of many completions, ``micro_batch_size`` sequences per forward."""
        enc = [self.encode(c, p) for c, p in zip(completions, problems)]
        out: list[list[StepReward]] = []
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        for s in range(0, len(enc), micro_batch_size):
            part = enc[s:s + micro_batch_size]
            probs = torch.sigmoid(tag_margins(self.model, [e[0] for e in part], [e[1] for e in part], self.good,
                                              self.bad, pad)).tolist()
            k = 0
            for ids, pos, steps in part:
                out.append([StepReward(float(p), end) for p, (_, end) in zip(probs[k:k + len(pos)], steps)])
                k += len(pos)
        for i, (c, f) in enumerate(zip(completions, finished)):
            if not self.splitter(c or ""):
                out[i] = [StepReward(0.0, len(c or ""))]
            elif not f:  # a truncated completion never gets credit for its last step
                out[i][-1] = StepReward(0.0, out[i][-1].end)
        return out
