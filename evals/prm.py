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

``harness.engine.models.load_prm(spec, task)`` builds one from ``algorithm.prm`` (null = rule-based).
"""
from __future__ import annotations

import re
from typing import Callable, Optional, Protocol

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

    @torch.no_grad()
    def step_rewards(self, completion: str, problem: Problem, finished: bool = True) -> list[StepReward]:
        steps = self.splitter(completion or "")
        if not steps:
            return [StepReward(0.0, len(completion or ""))]
        ids = self.tok(problem.question + "\n")["input_ids"]
        tag_pos = []
        for text, _ in steps:
            ids = ids + self.tok(text, add_special_tokens=False)["input_ids"] + self.tag_ids
            tag_pos.append(len(ids) - 1)
        logits = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0].float()
        pair = torch.softmax(logits[tag_pos][:, [self.good, self.bad]], -1)[:, 0]
        rewards = [StepReward(float(p), end) for p, (_, end) in zip(pair.tolist(), steps)]
        if not finished:  # a truncated completion never gets credit for its last step
            rewards[-1] = StepReward(0.0, rewards[-1].end)
        return rewards
