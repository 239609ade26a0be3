"""`arith`: synthetic multi-step arithmetic whose every step can be checked.

A problem is an expression such as ``3+4*2-5``; '*' binds tighter than '+' and '-',
which associate left to right. The worked solution reduces one operation per step::

    Q:3+4*2-5
    A:4*2=8;3+8=11;11-5=6;#6

Outcome reward: 1 when the completion is well formed, finished (not truncated) and its
final ``#N`` equals the value of the expression. Well formed (:meth:`ArithTask.well_formed`):
``;``-separated pieces (surrounding whitespace ignored), every piece but the last a step
``a<op>b=c`` (integers, op one of ``+ - *``), the last ``#N``, and at least one step when the
expression has an operation. The form is checked, not the steps' values: a wrong
intermediate value with the right final answer still scores 1 (the process rewards judge the
steps). A bare ``#6`` scores 0.

Process rewards: one per step, in order, with the character offset where the step ends.
A step ``a op b=c`` scores 1 when ``a op b`` is an admissible reduction of the current
expression (it respects precedence and left-to-right order, and ``a``, ``b`` are the current
adjacent pair) and ``c`` is its value. The expression state follows the completion's own
steps: a consistent step with a wrong value is applied with that wrong value (the error is
carried forward, so later steps are judged on whether they are right given what was written
before); a step that matches no admissible reduction (a malformed piece, a precedence
violation, or operands that are not the current adjacent pair, e.g. ``2*12=24`` for
``2*3*4-1``, which folds two operations into one step) scores 0 and changes nothing.
Each piece before the final answer is one step; the final ``#N`` is one more.

Skipped work is scored, never credited (an expression with K operations needs K steps):

- The final ``#N`` scores 1 only when the outcome reward is 1 (well formed, finished, N right:
  so never where the outcome reward is 0; a bare ``#6`` scores 0) *and* the completion's
  own steps reduced every operation (the state is a single number). A right answer reached
  over a skipped or unmatched reduction earns no process credit.
- Fewer pieces before the final-answer slot than K: each missing step is scored as one
  more step of reward 0, placed at the end of the final-answer slot, just before the final
  answer's own score (a skipped reduction is a wrong step, so the group statistics of
  §4.1.3 count it). A completion is thus scored over at least K + 1 steps; truncated ones
  too (their last piece is the final-answer slot, scoring 0).

Examples for ``3+4*2-5`` (K = 3; reward, with where each step ends)::

    4*2=8;3+8=11;11-5=6;#6   [1, 1, 1, 1]  (ends 6, 13, 20, 22)
    4*2=8;#6                 [1, 0, 0, 0]  (ends 6, 8, 8, 8: two missing steps, final 0)
    #6                       [0, 0, 0, 0]  (all at 2)
    4*2=8;3+8=11;11-         [1, 1, 0, 0]  truncated (ends 6, 13, 16, 16)

and ``2*3*4-1`` (K = 3) as ``2*12=24;24-1=23;#23``: [0, 0, 0, 0] (neither step is a
reduction of the state, one step missing, final 0), though its outcome reward is 1.
:meth:`ArithTask.short_output` flags a finished completion with fewer steps than K.

The train/held-out split is a hash of the expression text (10% held out), so it is the
same whatever the generator's seed or difficulty knobs. With ``task.disjoint_validation`` a
second hash splits the held-out bucket in two halves (:func:`is_validation`): the test set
draws only from one and the validation set only from the other, so the two are disjoint by
construction whatever ``eval_size`` and seed each run uses. Off (the default, which older runs
used), the validation set is the held-out problems the test set did not draw, which overlap
the test set of a run with a larger ``eval_size``.
"""
from __future__ import annotations

import hashlib
import itertools
import random
import re
import warnings
from functools import lru_cache
from typing import NamedTuple, Optional

from evals.tasks import Problem, StepReward, Task, TaskSpec, register_task

HELDOUT_MOD = 10  # 1 in 10 expressions is held out

_STEP_RE = re.compile(r"^(-?\d+)([+\-*])(-?\d+)=(-?\d+)$")
_FINAL_RE = re.compile(r"^#(-?\d+)$")


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def is_heldout(expr: str) -> bool:
    return int(hashlib.sha256(expr.encode()).hexdigest()[:8], 16) % HELDOUT_MOD == 0


def is_validation(expr: str) -> bool:
    """With ``task.disjoint_validation``: is a held-out expression in the validation half (by a
    second hash, independent of the first), rather than the test half?"""
    return int(hashlib.sha256(b"validation:" + expr.encode()).hexdigest()[:8], 16) % 2 == 1


COUNT_EXACTLY = 50_000
"""Problem spaces of at most this many expressions are enumerated to count their held-out
problems exactly (~0.1 s); larger ones hold about 1 in ``HELDOUT_MOD`` held out (the hash is
uniform), which is what :func:`problem_space` then reports."""
_COUNT_CAP = 10 ** 18  # spaces larger than this are only known to be larger


class ProblemSpace(NamedTuple):
    """How many distinct problems a task's knobs allow, and how many of them are held out."""

    total: int
    """Distinct expressions (capped at 10**18)."""
    heldout: int
    """Of them in the held-out bucket (the test and validation sets draw from it; training never)."""
    exact: bool
    """``heldout`` counted (a small space), or estimated as total / HELDOUT_MOD."""
    validation: int = 0
    """Of the held-out ones, in the validation half (:func:`is_validation`; counted, or estimated as
    half of ``heldout``): what the validation set draws from with ``task.disjoint_validation``."""

    @property
    def train(self) -> int:
        """Expressions training and the warm-up may draw."""
        return self.total - self.heldout


def problem_space(cfg) -> ProblemSpace:
    """The distinct expressions a task spec's knobs (``min_ops``..``max_ops`` operations over
    operands ``min_operand``..``max_operand`` and the distinct ``operators``) allow, and how many
    fall in the held-out bucket: counted exactly when there are at most `COUNT_EXACTLY` of them.
    Operands are written without a sign and separated by operators, so every (operands,
    operators) choice is a distinct expression."""
    return _problem_space(int(cfg.min_ops), int(cfg.max_ops), int(cfg.min_operand), int(cfg.max_operand),
                          "".join(sorted(set(cfg.operators))))


@lru_cache(maxsize=64)
def _problem_space(min_ops: int, max_ops: int, lo: int, hi: int, ops: str) -> ProblemSpace:
    n, m = hi - lo + 1, len(ops)
    if n < 1 or m < 1 or max_ops < min_ops:
        return ProblemSpace(0, 0, True)
    if n * m == 1:  # one expression per number of operations
        total = max_ops - min_ops + 1
    else:  # the terms grow geometrically: the cap is passed within ~60 of them
        total = 0
        for k in range(min_ops, max_ops + 1):
            total += n ** (k + 1) * m ** k
            if total > _COUNT_CAP:
                total = _COUNT_CAP
                break
    if total > COUNT_EXACTLY:
        return ProblemSpace(total, total // HELDOUT_MOD, False, total // HELDOUT_MOD // 2)
    held = val = 0
    operands = [str(v) for v in range(lo, hi + 1)]
    for k in range(min_ops, max_ops + 1):
        for nums in itertools.product(operands, repeat=k + 1):
            for chosen in itertools.product(ops, repeat=k):
                e = "".join(a + o for a, o in zip(nums, chosen)) + nums[-1]
                if is_heldout(e):
                    held += 1
                    val += is_validation(e)
    return ProblemSpace(total, held, True, val)


def split_sizes(cfg) -> tuple[int, int]:
    """(problems the test set may draw, problems the validation set may draw) under ``cfg``'s
    knobs: the two halves of the held-out bucket with ``disjoint_validation``, else the whole
    bucket for both (the validation set then takes what the test set leaves)."""
    space = problem_space(cfg)
    if getattr(cfg, "disjoint_validation", False):
        return space.heldout - space.validation, space.validation
    return space.heldout, space.heldout


def admissible(ops: list[str], i: int) -> bool:
    """May operation ``ops[i]`` (between numbers i and i+1) be reduced now?

    '*' always may (it binds tightest and is associative). '+'/'-' may only when no '*'
    touches it and the operation to its left is absent or '+' (left-to-right for '-')."""
    op = ops[i]
    if op == "*":
        return True
    left = ops[i - 1] if i > 0 else None
    right = ops[i + 1] if i + 1 < len(ops) else None
    return right != "*" and left in (None, "+")


def canonical_steps(nums: list[int], ops: list[str]) -> list[tuple[int, str, int, int]]:
    """Reduction order of the worked solution: leftmost '*' first, then left to right."""
    nums, ops = list(nums), list(ops)
    steps = []
    while ops:
        i = ops.index("*") if "*" in ops else 0
        a, op, b = nums[i], ops[i], nums[i + 1]
        c = _apply(a, op, b)
        steps.append((a, op, b, c))
        nums[i:i + 2] = [c]
        del ops[i]
    return steps


def left_to_right_steps(nums: list[int], ops: list[str]) -> list[tuple[int, str, int, int]]:
    """The misconception: every operation in written order, ignoring precedence."""
    steps, acc = [], nums[0]
    for op, b in zip(ops, nums[1:]):
        c = _apply(acc, op, b)
        steps.append((acc, op, b, c))
        acc = c
    return steps


def parse_expr(expr: str) -> tuple[list[int], list[str]]:
    tokens = re.findall(r"\d+|[+\-*]", expr)
    return [int(t) for t in tokens[0::2]], tokens[1::2]


def evaluate(expr: str) -> int:
    nums, ops = parse_expr(expr)
    return canonical_steps(nums, ops)[-1][3] if ops else nums[0]


def solution_text(expr: str, left_to_right: bool = False) -> str:
    nums, ops = parse_expr(expr)
    steps = (left_to_right_steps if left_to_right else canonical_steps)(nums, ops)
    return ";".join(f"{a}{op}{b}={c}" for a, op, b, c in steps) + f";#{steps[-1][3]}"


def describe_knobs(cfg) -> str:
    """``1..1 operations on operands 1..1 with '+'``: the knobs that size the problem space."""
    ops = "".join(sorted(set(cfg.operators)))
    return (f"{cfg.min_ops}..{cfg.max_ops} operations on operands {cfg.min_operand}..{cfg.max_operand} "
            f"with {ops!r}")


def space_problem(cfg, evaluate_only: bool = False) -> Optional[str]:
    """Why the knobs of ``cfg`` leave nothing to evaluate or (unless ``evaluate_only``) nothing to
    train on (None if they do not): the held-out bucket is empty, or every expression is in it
    (the warm-up and training would draw forever)."""
    space = problem_space(cfg)
    if not space.exact:
        return None
    knobs = describe_knobs(cfg)
    what = f"{space.total:,} expression{'s' if space.total != 1 else ''}"
    if space.heldout == 0:
        return (f"these arith knobs ({knobs}) allow {what} and none is held out for evaluation (1 in "
                f"{HELDOUT_MOD} is, by a hash of its text): widen the task (max_operand, operators, max_ops)")
    if space.train == 0 and not evaluate_only:
        return (f"these arith knobs ({knobs}) allow {what}, all held out for evaluation, so there is "
                f"nothing to train on: widen the task (max_operand, operators, max_ops)")
    return None


def held_out_shortfall(cfg, wanted: int) -> Optional[int]:
    """The number of held-out problems the knobs of ``cfg`` allow when it is smaller than
    ``wanted`` (None otherwise, or when the space is too large to count: then about 1 in
    ``HELDOUT_MOD`` of :func:`problem_space`'s total)."""
    space = problem_space(cfg)
    have = split_sizes(cfg)[0]
    return have if space.exact and wanted > have else None


class ArithTask(Task):
    name = "arith"
    has_process_rewards = True
    SEP = ";"
    """What separates the pieces (steps, final answer) of a worked solution."""
    STEP_RE = _STEP_RE
    """A step ``a<op>b=c``: groups a, op, b, c (a subclass may write steps in words around them)."""
    FINAL_RE = _FINAL_RE
    """The final answer: group 1 the number."""

    def expression(self, problem: Problem) -> str:
        """The arith expression behind a problem (arith: its question; evals.wordarith: its id)."""
        return problem.question

    def __init__(self, cfg=None):
        self.cfg = cfg or TaskSpec()
        self._eval: Optional[list[Problem]] = None
        self._val: Optional[list[Problem]] = None

    # -- generation -------------------------------------------------------
    def random_expr(self, rng: random.Random) -> str:
        c = self.cfg
        k = rng.randint(c.min_ops, c.max_ops)
        nums = [rng.randint(c.min_operand, c.max_operand) for _ in range(k + 1)]
        ops = [rng.choice(c.operators) for _ in range(k)]
        return "".join(str(n) + o for n, o in zip(nums, ops)) + str(nums[-1])

    def make_problem(self, expr: str) -> Problem:
        sol = solution_text(expr)
        return Problem(id=expr, question=expr, answer=str(evaluate(expr)), solution=sol,
                       meta={"num_steps": len(parse_expr(expr)[1])})

    def sample_train(self, rng: random.Random, n: int) -> list[Problem]:
        out = []
        q = self.cfg.demo_error_rate
        misses = 0
        while len(out) < n:
            e = self.random_expr(rng)
            if is_heldout(e):
                misses += 1
                if misses == 100_000 and not problem_space(self.cfg).train:  # else 1 in 10 is held out
                    raise ValueError("arith: every expression these task knobs allow is held out for "
                                     "evaluation, so there is nothing to train on: widen the task "
                                     "(max_operand, operators, max_ops)")
            else:
                p = self.make_problem(e)
                if q > 0 and rng.random() < q:  # imperfect demonstration (warm-up target only)
                    p = Problem(p.id, p.question, p.answer, solution_text(e, left_to_right=True),
                                {**p.meta, "demo_error": True})
                out.append(p)
        return out

    def eval_problems(self) -> list[Problem]:
        if self._eval is None:
            half = False if self._disjoint else None
            self._eval = self._draw_heldout(f"arith-eval-{self.cfg.seed}", set(), half)
        return self._eval

    @property
    def _disjoint(self) -> bool:
        return bool(getattr(self.cfg, "disjoint_validation", False))

    def _draw_heldout(self, stream: str, exclude: set, half: Optional[bool] = None) -> list[Problem]:
        """Up to ``eval_size`` distinct held-out-bucket problems from generator ``stream``,
        none of whose expressions is in ``exclude``; ``half`` True/False: only those of the
        validation/test half (:func:`is_validation`), None: either."""
        rng = random.Random(stream)
        seen, out = set(exclude), []
        tries = 0
        space = problem_space(self.cfg)

        def wanted(e: str) -> bool:
            return is_heldout(e) and (half is None or is_validation(e) == half)

        # a small space's held-out bucket is counted: stop once all of it is drawn (the same problems
        # as drawing on to the tries limit, without the wait)
        size = space.heldout if half is None else space.validation if half else space.heldout - space.validation
        left = size - sum(map(wanted, seen)) if space.exact else None
        while len(out) < self.cfg.eval_size and tries < 200 * self.cfg.eval_size:
            if left is not None and len(out) >= left:
                return out  # every held-out problem there is (`held_out_shortfall` told the user)
            tries += 1
            e = self.random_expr(rng)
            if wanted(e) and e not in seen:
                seen.add(e)
                out.append(self.make_problem(e))
        if len(out) < self.cfg.eval_size:
            warnings.warn(f"arith: drew {len(out)} of the {self.cfg.eval_size} held-out problems asked for "
                          f"({stream}) in {tries:,} tries; the set is smaller than task.eval_size", stacklevel=3)
        return out

    def validation_problems(self) -> list[Problem]:
        """``eval_size`` problems of the held-out hash bucket that are not in
        :meth:`eval_problems`: never trained on (the bucket is excluded from training and
        warm-up) and disjoint from the test set, which stays exactly as it was. Its own
        generator stream (``arith-val-<seed>``). With ``disjoint_validation``: drawn from the
        validation half of the bucket only, which no test set of any size or seed draws from."""
        if self._val is None:
            if self._disjoint:
                self._val = self._draw_heldout(f"arith-val-{self.cfg.seed}", set(), True)
            else:
                self._val = self._draw_heldout(f"arith-val-{self.cfg.seed}", {p.id for p in self.eval_problems()})
        return self._val

    # -- prompting --------------------------------------------------------
    def format_prompt(self, problem: Problem) -> str:
        return f"Q:{problem.question}\nA:"

    # -- grading ------------------------------------------------------------
    def extract_answer(self, completion: str) -> Optional[str]:
        parts = completion.strip().split(self.SEP)
        m = self.FINAL_RE.match(parts[-1].strip()) if parts else None
        return m.group(1) if m else None

    def well_formed(self, completion: str, problem: Problem) -> bool:
        """Every ``;`` piece but the last parses as a step ``a<op>b=c``, the last as ``#N``, and
        there is at least one step when the expression has an operation (see the module doc)."""
        parts = [p.strip() for p in completion.strip().split(self.SEP)]
        if not self.FINAL_RE.match(parts[-1]) or not all(self.STEP_RE.match(p) for p in parts[:-1]):
            return False
        return len(parts) > 1 or not parse_expr(self.expression(problem))[1]

    def is_correct(self, completion: str, problem: Problem, finished: bool = True) -> bool:
        if not finished or not isinstance(completion, str) or not self.well_formed(completion, problem):
            return False
        ans = self.extract_answer(completion)
        return ans is not None and int(ans) == int(problem.answer)

    def short_output(self, completion: str, problem: Problem, finished: bool = True) -> Optional[bool]:
        """A finished completion with fewer steps (pieces ``a<op>b=c`` before its first ``#N``, or
        before its end where it has none) than the expression has operations: it skipped work
        (a bare ``#6``, ``4*2=8;#6`` for ``3+4*2-5``). A truncated one is not short (it ran out of
        tokens; ``rollout/truncated_frac`` counts it)."""
        if not finished or not isinstance(completion, str):
            return False
        steps = 0
        for piece in completion.split(self.SEP):
            text = piece.strip()
            if self.FINAL_RE.match(text):
                break
            steps += bool(self.STEP_RE.match(text))
        return steps < len(parse_expr(self.expression(problem))[1])

    def step_rewards(self, completion: str, problem: Problem, finished: bool = True) -> list[StepReward]:
        try:
            return self._step_rewards(completion, problem, finished)
        except Exception:
            return [StepReward(0.0, len(completion or ""))]

    def _step_rewards(self, completion: str, problem: Problem, finished: bool) -> list[StepReward]:
        nums, ops = parse_expr(self.expression(problem))
        n_ops = len(ops)
        out: list[StepReward] = []
        pos = 0
        pieces = completion.split(self.SEP)
        for j, piece in enumerate(pieces):
            end = pos + len(piece) + (len(self.SEP) if j < len(pieces) - 1 else 0)  # the ';' closes the step
            text = piece.strip()
            if j == len(pieces) - 1 or self.FINAL_RE.match(text):
                # the final-answer slot, after j pieces: each of the len(problem's ops) - j steps
                # not written is a 0 step; the answer scores only with a full reduction (see module doc)
                out.extend(StepReward(0.0, end) for _ in range(n_ops - j))
                ok = not ops and j == len(pieces) - 1 and self.is_correct(completion, problem, finished)
                out.append(StepReward(1.0 if ok else 0.0, end))
                if j < len(pieces) - 1:  # text after the final answer: malformed, rest is wrong
                    out.append(StepReward(0.0, len(completion)))
                break
            m = self.STEP_RE.match(text)
            r = 0.0
            if m:
                a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
                for i in range(len(ops)):
                    if ops[i] == op and nums[i] == a and nums[i + 1] == b and admissible(ops, i):
                        r = 1.0 if c == _apply(a, op, b) else 0.0
                        nums[i:i + 2] = [c]
                        del ops[i]
                        break
            out.append(StepReward(r, end))
            pos = end
        return out


@register_task("arith")
def _make(cfg):
    return ArithTask(cfg)
