"""Evaluation protocols by name: how prompts are built, completions cut and graded (chat, lighteval-5shot).

A protocol fixes everything about an evaluation that is not the model or the sampler: the prompt
text, where a completion ends and how it is graded. :data:`PROTOCOLS` maps each name to one:

``chat`` (the default)
    Today's behaviour, unchanged: ``task.format_prompt`` (the tokenizer's chat template when it
    has one, with the instruction to answer in ``\\boxed{}``) and the task's own grader. Every task.

``lighteval-5shot``
    GSM8K as lighteval scores it in the setup behind SmolLM2's model cards ("GSM8K 5-shot"):
    huggingface/smollm ``text/evaluation/smollm2`` (task ``custom|gsm8k|5|1``) on lighteval
    ea46419a93fb390e8f694f7c6c64c1e684487c9d; docs/eval_protocols.md has the details read there.

    * prompt: five worked examples from the train split, then the question, each as
      ``Question: {question}\\nAnswer:`` followed (examples only) by a space and the full gold
      solution (calculator annotations and ``#### N`` line included). With a tokenizer that has a
      chat template (SmolLM2-Instruct; the card's instruct numbers were run with
      ``--use_chat_template``) each example is a user turn and its solution an assistant turn;
      without one the blocks are joined by a blank line as plain text.
    * examples: lighteval's draw, reproduced exactly: ``random.Random(42)`` shuffles the test
      split's indices, then draws 5 train indices (``rnd.sample``) for each test problem in that
      shuffled order, from the same generator (:func:`lighteval_fewshot_indices`).
    * decoding: greedy, 256 new tokens (:attr:`Protocol.max_new_tokens`); the completion is cut at
      the first stop sequence ``Question:`` / ``Question`` (here after generation: the sampler does
      not stop early, so a completion that goes on costs its full 256 tokens).
    * grading: lighteval's ``quasi_exact_match_gsm8k``: the first ``#### <number>`` (regex
      ``#### (-?[0-9.,]+)``, commas removed) of the cut completion must equal, as a string, the
      same extraction from the gold solution; a completion without one is wrong. Whether the
      completion finished does not matter.

``lighteval-5shot-plain``
    The same, always as plain text (lighteval without ``--use_chat_template``: the setup of the
    SmolLM2 *base* models' card numbers).

Use :func:`check_protocol` before any work starts (unknown names, protocols a task does not
define, a task ``few_shot`` the protocol does not take: one-line :class:`ProtocolError`), then
``PROTOCOLS[name].bind(task, tokenizer)`` for the prompts, the cut and the grader
(:class:`BoundProtocol`); :func:`harness.engine.evaluate.evaluate` does both.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from evals.catalog import get_task
from evals.datasets import DatasetError
from evals.tasks import Problem, TaskSpec

__all__ = ["PROTOCOLS", "DEFAULT_PROTOCOL", "ProtocolError", "Protocol", "BoundProtocol", "check_protocol",
           "get_protocol", "lighteval_fewshot_indices", "lighteval_order", "lighteval_gsm8k_answer",
           "lighteval_gsm8k_correct", "cut_at_stop"]

DEFAULT_PROTOCOL = "chat"

LIGHTEVAL_SEED = 42
"""Seed of lighteval's ``random.Random`` that shuffles the test docs and draws the few-shot examples."""
LIGHTEVAL_SHOTS = 5
LIGHTEVAL_STOP = ("Question:", "Question")
"""Stop sequences of the SmolLM2 gsm8k task (the model's EOS token is the third; the sampler stops there)."""
LIGHTEVAL_MAX_NEW_TOKENS = 256
"""``generation_size`` of lighteval's gsm8k task."""

_LIGHTEVAL_ANSWER_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


class ProtocolError(DatasetError):
    """A protocol that does not exist or is not defined for the task asked (one line). A
    :class:`evals.datasets.DatasetError`, so the command line prints it as one line, exit 2."""


# --------------------------------------------------------------------------------------
# lighteval's pieces
# --------------------------------------------------------------------------------------
def lighteval_order(test_size: int, seed: int = LIGHTEVAL_SEED) -> list[int]:
    """The order in which lighteval evaluates a test split of ``test_size`` rows: the indices
    shuffled by ``random.Random(seed)`` (``--max_samples N`` scores the first N of them)."""
    rnd = random.Random()
    rnd.seed(seed)
    order = list(range(int(test_size)))
    rnd.shuffle(order)
    return order


def lighteval_fewshot_indices(test_size: int, train_size: int, k: int = LIGHTEVAL_SHOTS,
                              seed: int = LIGHTEVAL_SEED) -> list[list[int]]:
    """Train-split indices of the ``k`` few-shot examples of every test row, as lighteval draws
    them (``few_shots_select="random_sampling_from_train"``, one few-shot seed): one generator
    seeded with ``seed`` first shuffles the test rows, then draws ``rnd.sample(train, k)`` for
    each test row in that shuffled order. Element ``i`` belongs to test row ``i``, in its
    example order."""
    if train_size < k:
        raise ProtocolError(f"the train split has {train_size} rows, fewer than the {k} few-shot examples")
    rnd = random.Random()
    rnd.seed(seed)
    order = list(range(int(test_size)))
    rnd.shuffle(order)  # the same draws as lighteval_order: the sampling below continues this stream
    pool = range(int(train_size))
    out: list[list[int]] = [[] for _ in range(int(test_size))]
    for i in order:
        out[i] = rnd.sample(pool, k)  # only the population's length matters: a range draws as a list
    return out


def lighteval_gsm8k_answer(text: Optional[str]) -> Optional[str]:
    """The number lighteval's ``gsm8k_normalizer`` reads: the *first* ``#### <number>`` (exactly
    one space after ``####``; digits, ``-``, ``.`` and ``,``) with the commas removed; None where
    there is none (lighteval's ``[invalid]``)."""
    if not isinstance(text, str):
        return None
    m = _LIGHTEVAL_ANSWER_RE.search(text.strip())
    return m.group(1).strip().replace(",", "") if m else None


def lighteval_gsm8k_correct(prediction: Optional[str], gold_solution: str) -> bool:
    """lighteval's ``quasi_exact_match_gsm8k`` for one completion: an empty prediction is wrong;
    else both sides go through :func:`lighteval_gsm8k_answer` and are compared as strings
    (``[invalid]`` on both sides would match, as in lighteval; GSM8K golds always have a number)."""
    if not prediction:
        return False
    pred = lighteval_gsm8k_answer(prediction) or "[invalid]"
    gold = lighteval_gsm8k_answer(gold_solution) or "[invalid]"
    return pred == gold


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """(``text`` up to the earliest occurrence of any of ``stop``, whether one occurred): what a
    sampler stopping at these strings would have returned (the stop string left out)."""
    cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    if not cuts:
        return text, False
    return text[:min(cuts)], True


# --------------------------------------------------------------------------------------
# protocols
# --------------------------------------------------------------------------------------
@dataclass
class BoundProtocol:
    """A protocol bound to a task and a tokenizer: what :func:`harness.engine.evaluate.evaluate` uses."""

    grader: object
    """What grades completions into records (``final_answer`` / ``is_correct``, ``name``): the
    task itself for ``chat``."""
    format_prompt: Callable[[Problem], str]
    stop: tuple[str, ...] = ()

    def prompts(self, problems: Sequence[Problem]) -> list[str]:
        return [self.format_prompt(p) for p in problems]

    def finish(self, completion: str, finished: bool) -> tuple[str, bool]:
        """The completion as graded and recorded: cut at the first stop sequence (a completion cut
        there counts as finished). Unchanged when the protocol has no stop sequences."""
        if not self.stop or not isinstance(completion, str):
            return completion, finished
        text, stopped = cut_at_stop(completion, self.stop)
        return text, bool(finished or stopped)


class Protocol:
    """Base class: a name, the tasks it is defined for (None: every task) and how it binds."""

    name: str = "protocol"
    summary: str = ""
    tasks: Optional[tuple[str, ...]] = None
    max_new_tokens: Optional[int] = None
    """Completion length the protocol is defined with (None: the caller's)."""
    stop: tuple[str, ...] = ()

    def check(self, task_name: str, few_shot: int = 0) -> None:
        """Raise a one-line :class:`ProtocolError` when this protocol is not defined for the task."""
        if self.tasks is not None and task_name not in self.tasks:
            raise ProtocolError(f"protocol {self.name} is defined for {', '.join(self.tasks)} only, not "
                                f"{task_name}: use protocol chat (the default) for {task_name}")

    def bind(self, task, tokenizer) -> BoundProtocol:
        raise NotImplementedError


class ChatProtocol(Protocol):
    name = "chat"
    summary = "the task's own prompt (chat template, \\boxed{} instruction) and grader"

    def bind(self, task, tokenizer) -> BoundProtocol:
        bind = getattr(task, "bind_tokenizer", None)
        if bind is not None:
            bind(tokenizer)
        return BoundProtocol(grader=task, format_prompt=task.format_prompt)


class _LightevalGrader:
    """Grades like lighteval's ``quasi_exact_match_gsm8k`` (see the module docstring); never raises."""

    def __init__(self, name: str, stop: tuple[str, ...]):
        self.name = name
        self.stop = stop

    def _cut(self, completion) -> str:
        return cut_at_stop(completion, self.stop)[0] if isinstance(completion, str) else ""

    def extract_answer(self, completion: str) -> Optional[str]:
        return lighteval_gsm8k_answer(self._cut(completion))

    def final_answer(self, completion: str, finished: bool = True) -> Optional[str]:
        return self.extract_answer(completion)  # lighteval does not look at how generation ended

    def is_correct(self, completion: str, problem: Problem, finished: bool = True) -> bool:
        try:
            return lighteval_gsm8k_correct(self._cut(completion), problem.solution or f"#### {problem.answer}")
        except Exception:
            return False

    def reward(self, completion: str, problem: Problem, finished: bool = True) -> float:
        return 1.0 if self.is_correct(completion, problem, finished) else 0.0


class LightevalGSM8K(Protocol):
    """lighteval's GSM8K 5-shot (see the module docstring); ``chat_template``: "auto" (use the
    tokenizer's when it has one) or "never"."""

    tasks = ("gsm8k",)
    max_new_tokens = LIGHTEVAL_MAX_NEW_TOKENS
    stop = LIGHTEVAL_STOP

    def __init__(self, name: str, chat_template: str, summary: str):
        self.name = name
        self.chat_template = chat_template
        self.summary = summary

    def check(self, task_name: str, few_shot: int = 0) -> None:
        super().check(task_name, few_shot)
        if few_shot:
            raise ProtocolError(f"protocol {self.name} brings its own {LIGHTEVAL_SHOTS} worked examples per "
                                f"problem: task few_shot must be 0, got {few_shot}")

    def bind(self, task, tokenizer) -> BoundProtocol:
        self.check(task.name, int(getattr(getattr(task, "cfg", None), "few_shot", 0) or 0))
        pool = task.train_problems()
        test_size = len(_test_split(task))
        shots = lighteval_fewshot_indices(test_size, len(pool))
        use_chat = self.chat_template == "auto" and bool(getattr(tokenizer, "chat_template", None))

        def format_prompt(problem: Problem) -> str:
            meta = problem.meta or {}
            idx = meta.get("index")
            if meta.get("split") != "test" or not isinstance(idx, int) or not 0 <= idx < test_size:
                raise ProtocolError(f"protocol {self.name}: problem {problem.id!r} is not a row of the "
                                    f"{task.name} test split, which decides its few-shot examples")
            examples = [pool[j] for j in shots[idx]]
            return build_prompt(problem, examples, tokenizer if use_chat else None)

        return BoundProtocol(grader=_LightevalGrader(task.name, self.stop), format_prompt=format_prompt,
                             stop=self.stop)


def build_prompt(problem: Problem, examples: Sequence[Problem], tokenizer=None) -> str:
    """lighteval's gsm8k context for ``problem`` after ``examples``: plain text (blocks joined by a
    blank line), or through ``tokenizer.apply_chat_template`` (user / assistant turns, generation
    prompt added) when a tokenizer is given."""
    def query(p: Problem) -> str:
        return f"Question: {p.question}\nAnswer:"

    if tokenizer is None:
        return "\n\n".join([query(ex) + f" {ex.solution}" for ex in examples] + [query(problem)])
    msgs = []
    for ex in examples:
        msgs.append({"role": "user", "content": query(ex)})
        msgs.append({"role": "assistant", "content": f" {ex.solution}"})
    msgs.append({"role": "user", "content": query(problem)})
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def _test_split(task) -> list[Problem]:
    """The whole test split of ``task`` (its length decides lighteval's shuffle)."""
    spec = TaskSpec(name=task.name, data_path=getattr(getattr(task, "cfg", None), "data_path", None), eval_size=0)
    return get_task(spec).eval_problems()


PROTOCOLS: dict[str, Protocol] = {
    "chat": ChatProtocol(),
    "lighteval-5shot": LightevalGSM8K(
        "lighteval-5shot", "auto",
        "GSM8K as SmolLM2's model card: lighteval's 5 examples, stop at 'Question', first '#### N' exact match"),
    "lighteval-5shot-plain": LightevalGSM8K(
        "lighteval-5shot-plain", "never", "lighteval-5shot as plain text, never the chat template"),
}


def get_protocol(name: str) -> Protocol:
    """The protocol called ``name``; a one-line :class:`ProtocolError` naming the valid ones otherwise."""
    proto = PROTOCOLS.get(name)
    if proto is None:
        raise ProtocolError(f"unknown evaluation protocol {name!r}: choose from {', '.join(PROTOCOLS)}")
    return proto


def check_protocol(name: str, task_name: str, few_shot: int = 0) -> Protocol:
    """``get_protocol(name)``, checked against the task (name and few_shot) before any work starts."""
    proto = get_protocol(name)
    proto.check(task_name, few_shot)
    return proto
