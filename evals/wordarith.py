"""`wordarith`: arith's expressions told as short word problems, for a pretrained chat model.

Every problem is an arith expression (:mod:`evals.arith`: ``+ - *``, '*' binding tighter)
written as a story, deterministically from the expression text alone (names, objects and verbs
drawn from a generator seeded by it). The expression is the problem's ``id``, so the splits are
arith's, by the same hashes of the same text: :func:`evals.arith.is_heldout` keeps 1 in 10
expressions out of training and the warm-up, and ``task.disjoint_validation`` splits that
bucket into a test half and a validation half (:func:`evals.arith.is_validation`).

The expression is a sum of terms, each a number or a product of two numbers; the story reads
its terms left to right::

    5+3*4   Mia has 5 apples. She buys 3 bags with 4 apples in each.
            How many apples does Mia have now?
    6*7-9   Tom has 6 boxes with 7 pens in each. He gives away 9 pens. How many ...

Only expressions a story can tell are drawn: no product of three numbers, and no step of the
worked solution below zero (``3-5`` is never drawn); the split of an expression never depends
on that filter.

Worked solution (the warm-up's target; one line per step, arith's reduction order: leftmost
'*' first, then left to right), and what the grader reads::

    3 * 4 = 12
    5 + 12 = 17
    The answer is 17.

Outcome reward (arith's rule with this layout): 1 when the completion is finished (not
truncated), every line but the last is a step ``a <op> b = c`` (spaces and a final '.'
optional), the last line is ``The answer is N.`` with N the value, and there is at least one
step. Blank lines or prose make it malformed (0). Process rewards, short outputs: arith's step
checker, run on these lines (:meth:`evals.arith.ArithTask.step_rewards`: each step against the
current state of the expression, errors carried forward, missing steps scored 0, the final
answer scored 1 only after a full reduction). Prompts go through the tokenizer's chat template
when it has one (:meth:`bind_tokenizer`), else a plain ``Question: ... Answer:`` layout.
"""
from __future__ import annotations

import random
import re
from typing import Optional

from evals.arith import ArithTask, canonical_steps, evaluate, parse_expr
from evals.tasks import Problem, register_task

INSTRUCTION = 'Write one calculation per line, then "The answer is N."'
MAX_DRAWS = 100_000
"""Draws of arith expressions without one a story can tell before the knobs are refused."""

NAMES = (("Tom", "He"), ("Mia", "She"), ("Sam", "He"), ("Ana", "She"), ("Leo", "He"), ("Zoe", "She"),
         ("Ben", "He"), ("Eva", "She"), ("Max", "He"), ("Ivy", "She"))
OBJECTS = ("apples", "pens", "stickers", "marbles", "cookies", "cards", "shells", "stamps")
CONTAINERS = ("bags", "boxes", "baskets", "packs", "jars")
GAIN = ("buys", "finds", "gets", "wins")
LOSS = ("gives away", "sells", "loses")


def terms(expr: str) -> list[tuple[str, list[int]]]:
    """``5+3*4`` -> ``[('+', [5]), ('+', [3, 4])]``: the expression's signed terms."""
    nums, ops = parse_expr(expr)
    out = [("+", [nums[0]])]
    for op, n in zip(ops, nums[1:]):
        if op == "*":
            out[-1][1].append(n)
        else:
            out.append((op, [n]))
    return out


def tellable(expr: str) -> bool:
    """Can a story tell ``expr``: every term at most two factors, no step of the worked solution
    below zero?"""
    nums, ops = parse_expr(expr)
    return (all(len(f) <= 2 for _, f in terms(expr))
            and all(c >= 0 for *_, c in canonical_steps(nums, ops)))


def story(expr: str) -> str:
    """The word problem of ``expr``: the same text for the same expression, always."""
    rng = random.Random(f"wordarith:{expr}")
    name, pron = rng.choice(NAMES)
    obj, box = rng.choice(OBJECTS), rng.choice(CONTAINERS)
    sentences = []
    for i, (sign, f) in enumerate(terms(expr)):
        who = name if i == 0 else pron
        if i == 0:
            what = (f"has {f[0]} {obj}" if len(f) == 1 else f"has {f[0]} {box} with {f[1]} {obj} in each")
        elif sign == "+":
            verb = rng.choice(GAIN)
            what = (f"{verb} {f[0]} more {obj}" if len(f) == 1
                    else f"{verb} {f[0]} {box} with {f[1]} {obj} in each")
        else:
            what = (f"{rng.choice(LOSS)} {f[0]} {obj}" if len(f) == 1
                    else f"gives {f[0]} friends {f[1]} {obj} each")
        sentences.append(f"{who} {what}.")
    sentences.append(f"How many {obj} does {name} have now?")
    return " ".join(sentences)


def solution_text(expr: str) -> str:
    nums, ops = parse_expr(expr)
    steps = canonical_steps(nums, ops)
    return "".join(f"{a} {op} {b} = {c}\n" for a, op, b, c in steps) + f"The answer is {evaluate(expr)}."


class WordArithTask(ArithTask):
    """arith's generator, splits and step checker; word problems, chat prompts, line layout."""

    name = "wordarith"
    SEP = "\n"
    STEP_RE = re.compile(r"^(-?\d+) *([+\-*]) *(-?\d+) *= *(-?\d+)\.?$")
    FINAL_RE = re.compile(r"^The answer is (-?\d+)\.?$")

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.tokenizer = None

    def expression(self, problem: Problem) -> str:
        return problem.id

    def random_expr(self, rng: random.Random) -> str:
        for _ in range(MAX_DRAWS):
            e = super().random_expr(rng)
            if tellable(e):
                return e
        raise ValueError(f"wordarith: no expression a story can tell in {MAX_DRAWS:,} draws of these task knobs "
                         f"(no step may go below zero, no product of three numbers): widen the operands "
                         f"or the operators")

    def make_problem(self, expr: str) -> Problem:
        return Problem(id=expr, question=story(expr), answer=str(evaluate(expr)), solution=solution_text(expr),
                       meta={"num_steps": len(parse_expr(expr)[1])})

    def sample_train(self, rng: random.Random, n: int) -> list[Problem]:
        if self.cfg.demo_error_rate > 0:
            raise ValueError("wordarith has no imperfect demonstrations: set task.demo_error_rate to 0")
        return super().sample_train(rng, n)

    # -- prompting --------------------------------------------------------
    def bind_tokenizer(self, tokenizer) -> "WordArithTask":
        """Use this tokenizer's chat template (if it has one) in :meth:`format_prompt`."""
        self.tokenizer = tokenizer
        return self

    def format_prompt(self, problem: Problem) -> str:
        tok = self.tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            msgs = [{"role": "user", "content": f"{problem.question}\n{INSTRUCTION}"}]
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return f"Question: {problem.question}\n{INSTRUCTION}\nAnswer:\n"

    # -- grading ------------------------------------------------------------
    def is_correct(self, completion: str, problem: Problem, finished: bool = True) -> bool:
        try:
            return super().is_correct(completion, problem, finished)
        except Exception:  # a grader never raises
            return False

    def extract_answer(self, completion: str) -> Optional[str]:
        if not isinstance(completion, str):
            return None
        return super().extract_answer(completion)


@register_task("wordarith")
def _make(cfg):
    return WordArithTask(cfg)
