"""Labelled examples for reward models: the policy's samples labelled by an exact checker (or by Monte-Carlo completion), and the replay of earlier rounds.

An :class:`Example` is one sampled completion with what an exact checker says about it: the
outcome label (the task's reward: arith's checker, a data set's grader) and, where there is
one, the step labels as ``(label, end)`` pairs at character offsets (arith's step checker,
:meth:`evals.tasks.Task.step_rewards`; or Math-Shepherd's Monte-Carlo estimate,
:func:`harness.rewards.fit.mc_step_labels`). A reward model maps these onto its own tags
(:func:`evals.prm.step_labels`), so the data does not depend on how a model splits steps.

Replay (DeepSeekMath §4.2): when a reward model trains further in a later round, it sees the new
round's examples plus ``replay_count(len(history), fraction)`` examples drawn without
replacement from all earlier ones (``fraction`` 0.1: 10% of the historical data, rounded half up).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from evals.tasks import Problem, Task

DATA_FILE = "data.jsonl"
"""The labelled examples a reward-model folder keeps (one JSON object a line, with its ``split``)."""


@dataclass
class Example:
    """One completion of the policy with its exact labels (plain values: checkpoints and JSONL hold it)."""
    question: str
    """The problem text the reward model reads."""
    completion: str
    finished: bool
    """Ended with EOS (False: truncated)."""
    outcome: float
    """Exact outcome label (1 right, 0 wrong; the task's reward)."""
    steps: list = field(default_factory=list)
    """Exact step labels as [label, end character offset] pairs ([] where none are known)."""
    round: int = 0
    """The round whose policy drew it (0: before RL, or `harness rm train`)."""
    problem_id: str = ""

    def problem(self) -> Problem:
        return Problem(id=self.problem_id, question=self.question, answer="")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Example":
        return cls(question=str(d["question"]), completion=str(d["completion"]), finished=bool(d["finished"]),
                   outcome=float(d["outcome"]), steps=[[float(a), int(b)] for a, b in d.get("steps", [])],
                   round=int(d.get("round", 0)), problem_id=str(d.get("problem_id", "")))


def label_exact(task: Task, problems: Sequence[Problem], completions: Sequence[str], finished: Sequence[bool],
                with_steps: bool, round_: int = 0) -> list[Example]:
    """Examples labelled by the task's exact checker: the outcome always, the steps when
    ``with_steps`` (a task with a step checker)."""
    out = []
    for p, c, f in zip(problems, completions, finished):
        steps = [[float(s.reward), int(s.end)] for s in task.step_rewards(c, p, f)] if with_steps else []
        out.append(Example(question=p.question, completion=c, finished=bool(f), outcome=float(task.reward(c, p, f)),
                           steps=steps, round=round_, problem_id=str(p.id)))
    return out


def replay_count(n_history: int, fraction: float) -> int:
    """How many earlier examples a round replays: ``fraction`` of them, rounded half up."""
    return min(n_history, int(math.floor(fraction * n_history + 0.5)))


def replay_draw(history: Sequence[Example], fraction: float, rng: random.Random) -> list[Example]:
    """``replay_count(len(history), fraction)`` examples of ``history``, without replacement."""
    return rng.sample(list(history), replay_count(len(history), fraction))


SAMPLE_STREAM = "rm-train"
"""The random stream (with the config's seed) a reward model's training problems are drawn from."""


def training_problems(task: Task, seed: int, count: int) -> list[Problem]:
    """The ``count`` training problems a reward model of run seed ``seed`` is trained on, drawn from
    :data:`SAMPLE_STREAM` (`harness rm train` draws them; its up-front split check draws the same)."""
    return task.sample_train(random.Random(f"{SAMPLE_STREAM}-{seed}"), count)


def heldout(problem_id: str, fraction: float) -> bool:
    """Whether a problem is in the held-out part of a reward model's data (a hash of its id, so
    every sample of a problem falls on the same side)."""
    h = int.from_bytes(hashlib.sha256(f"rm-heldout:{problem_id}".encode()).digest()[:4], "big")
    return h % 10_000 < round(fraction * 10_000)


def load_examples(folder, split: str = "train") -> list[Example]:
    """The labelled examples of a reward-model folder's ``data.jsonl`` on one side of its split
    (none when it has no such file)."""
    f = Path(folder) / DATA_FILE
    if not f.is_file():
        return []
    out = []
    for line in f.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            if d.get("split", "train") == split:
                out.append(Example.from_dict(d))
    return out
