"""Task protocol and registry.

A task is prompts + gold answers + a grader. Every grader is total: malformed or
truncated output scores 0, it never raises. Tasks are looked up by name with
:func:`evals.catalog.get_task`; tasks register themselves with :func:`register_task`
(``evals.arith``; ``evals.datasets`` for gsm8k, math, math500).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Optional


@dataclass(frozen=True)
class TaskSpec:
    """Which task, and its knobs. The run config's ``task`` section (``harness.config.schema.TaskConfig``)
    adds validation to exactly these fields."""

    name: str = "arith"
    """Task: 'arith' (synthetic multi-step arithmetic, every step checkable), or a dataset
    task from evals (gsm8k, math, math500)."""
    min_ops: int = 2
    """arith: fewest operations in a problem (a problem with k operations has k steps)."""
    max_ops: int = 3
    """arith: most operations in a problem."""
    min_operand: int = 1
    """arith: smallest operand."""
    max_operand: int = 9
    """arith: largest operand."""
    operators: str = "+-*"
    """arith: operator mix; '*' binds tighter than '+' and '-', which associate left to right."""
    demo_error_rate: float = 0.0
    """arith: fraction of the warm-up's worked solutions that evaluate strictly left to right,
    ignoring precedence (a common misconception), as imperfect SFT data has. Only the
    supervised targets change; rewards and evaluation always use the true value."""
    eval_size: int = 200
    """Held-out problems used for evaluation (arith: drawn from the held-out split)."""
    seed: int = 1234
    """Seed of the problem generator; the train/held-out split is a hash of the problem
    text, so it does not depend on this seed."""
    data_path: Optional[str] = None
    """Dataset tasks: local jsonl file (or a hub dataset name when online)."""
    few_shot: int = 0
    """Dataset tasks: number of worked examples prepended to each prompt."""
    disjoint_validation: bool = False
    """arith: split the held-out bucket by a second hash into a test half and a validation half
    (``eval.validation`` scores the latter), so the validation set is disjoint from every test
    set by construction, whatever eval_size or seed; off: the validation set is the held-out
    problems this run's test set did not draw (older runs; it overlaps a larger test set).
    Left out of config.yaml, run ids and cache keys while off."""

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("disjoint_validation",)
    """Fields that came later: left out of :func:`harness.foundation.base.to_dict` (so of config.yaml,
    run ids and cache keys) at their default, so configs without them keep their ids and caches."""


@dataclass(frozen=True)
class Problem:
    id: str
    """Stable identifier (arith: the expression; datasets: index or unique_id)."""
    question: str
    """The problem text, before any prompt template."""
    answer: str
    """Gold final answer, as text."""
    solution: str = ""
    """Worked solution (the SFT target for arith)."""
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StepReward:
    reward: float
    """Score of this reasoning step (1 = right, 0 = wrong)."""
    end: int
    """Character offset in the completion where the step ends (exclusive)."""


class Task:
    """Base class. Subclasses set ``name`` and implement the problem sources and grader."""

    name: str = "task"
    has_process_rewards: bool = False

    # -- problems ---------------------------------------------------------
    def sample_train(self, rng: random.Random, n: int) -> list[Problem]:
        raise NotImplementedError

    def eval_problems(self) -> list[Problem]:
        raise NotImplementedError

    def validation_problems(self) -> list[Problem]:
        """A validation split, disjoint from the training problems and from
        :meth:`eval_problems`, for choosing hyper-parameters (e.g. the learning rate) without
        looking at the test set. Tasks without one raise NotImplementedError."""
        raise NotImplementedError

    # -- prompting --------------------------------------------------------
    def bind_tokenizer(self, tokenizer) -> None:
        """Called once with the policy's tokenizer (dataset tasks use its chat template)."""

    def format_prompt(self, problem: Problem) -> str:
        return problem.question

    # -- grading (never raises) -------------------------------------------
    def extract_answer(self, completion: str) -> Optional[str]:
        raise NotImplementedError

    def is_correct(self, completion: str, problem: Problem, finished: bool = True) -> bool:
        raise NotImplementedError

    def final_answer(self, completion: str, finished: bool = True) -> Optional[str]:
        """The answer that counts for voting (maj@k); None for a truncated completion."""
        return self.extract_answer(completion) if finished else None

    def reward(self, completion: str, problem: Problem, finished: bool = True) -> float:
        """Outcome reward: 1.0 if the final answer is right, else 0.0."""
        try:
            return 1.0 if self.is_correct(completion, problem, finished) else 0.0
        except Exception:  # a grader must never take a run down
            return 0.0

    def step_rewards(self, completion: str, problem: Problem, finished: bool = True) -> list[StepReward]:
        """Process rewards, one per step. Default: the outcome reward as a single step."""
        return [StepReward(self.reward(completion, problem, finished), len(completion))]

    def short_output(self, completion: str, problem: Problem, finished: bool = True) -> Optional[bool]:
        """Did a completion write fewer reasoning steps than the problem needs (skipped work)?
        None where the task does not know how many steps a problem needs (default)."""
        return None


_REGISTRY: dict[str, Callable[..., Task]] = {}


def register_task(name: str):
    def deco(factory):
        _REGISTRY[name] = factory
        return factory
    return deco
