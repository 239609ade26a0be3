"""The arith task: generator determinism, split, worked solutions, outcome and step rewards."""
import random

import pytest

from evals.arith import ArithTask, admissible, evaluate, is_heldout, solution_text
from evals.tasks import Problem, Task, TaskSpec as TaskConfig


@pytest.fixture
def task():
    return ArithTask(TaskConfig(min_ops=2, max_ops=3, max_operand=9, eval_size=50))


def prob(task, expr):
    return task.make_problem(expr)


def test_precedence_and_worked_solution():
    assert evaluate("3+4*2-5") == 6
    assert evaluate("10-3+2") == 9  # left to right
    assert evaluate("2*3*4-1") == 23
    assert solution_text("3+4*2-5") == "4*2=8;3+8=11;11-5=6;#6"
    assert solution_text("9-3-2") == "9-3=6;6-2=4;#4"


def test_generator_is_deterministic_and_respects_knobs(task):
    a = [p.id for p in task.sample_train(random.Random(7), 30)]
    b = [p.id for p in task.sample_train(random.Random(7), 30)]
    assert a == b
    assert a != [p.id for p in task.sample_train(random.Random(8), 30)]
    for p in task.sample_train(random.Random(0), 200):
        ops = sum(ch in "+-*" for ch in p.question)
        assert 2 <= ops <= 3
        assert all(1 <= int(x) <= 9 for x in p.question.replace("*", "+").replace("-", "+").split("+"))
        assert not is_heldout(p.question)
    only_add = ArithTask(TaskConfig(operators="+", min_ops=1, max_ops=1))
    assert all("+" in p.question and "*" not in p.question for p in only_add.sample_train(random.Random(0), 20))


def test_heldout_split_is_deterministic_and_disjoint(task):
    ev = task.eval_problems()
    assert len(ev) == 50 and len({p.id for p in ev}) == 50
    assert all(is_heldout(p.id) for p in ev)
    assert [p.id for p in ArithTask(TaskConfig(eval_size=50)).eval_problems()] == [p.id for p in ev]


def test_outcome_reward_correct_malformed_truncated(task):
    p = prob(task, "3+4*2-5")
    assert task.reward("4*2=8;3+8=11;11-5=6;#6", p) == 1.0
    assert task.reward("#6", p) == 0.0  # no steps: not well formed
    assert task.reward("4*2=8;3+8=11;11-5=6;#6", p, finished=False) == 0.0  # truncated
    for bad in ["", "#", "###", "4*2=8;3+8=11", "4*2=8;#6;junk", "#6#6", "#seven", "#6 6", "\x00", "#" + "9" * 500]:
        assert task.reward(bad, p) == 0.0
    assert task.reward(None, p) == 0.0  # never raises


def test_step_rewards_with_one_wrong_step(task):
    p = prob(task, "3+4*2-5")
    right = task.step_rewards("4*2=8;3+8=11;11-5=6;#6", p)
    assert [s.reward for s in right] == [1, 1, 1, 1]
    # "4*2=8;" ends at char 6, "3+8=11;" at 13, "11-5=6;" at 20, "#6" at 22
    assert [s.end for s in right] == [6, 13, 20, 22]
    wrong = task.step_rewards("4*2=8;3+8=12;12-5=7;#7", p)
    # step 2 wrong; step 3 is right given what was written (error carried); final answer wrong
    assert [s.reward for s in wrong] == [1, 0, 1, 0]


def test_step_rewards_reject_precedence_violations_and_junk(task):
    p = prob(task, "3+4*2")
    assert [s.reward for s in task.step_rewards("3+4=7;7*2=14;#14", p)] == [0, 0, 0]
    p2 = prob(task, "10-3+2")
    assert [s.reward for s in task.step_rewards("3+2=5;10-5=5;#5", p2)] == [0, 0, 0]
    assert [s.reward for s in task.step_rewards("10-3=7;7+2=9;#9", p2)] == [1, 1, 1]
    # truncated after one of two steps: the missing step scores 0, the final-answer slot 0
    assert [s.reward for s in task.step_rewards("4*2=8;#11", p, finished=False)] == [1, 0, 0]
    assert task.step_rewards("", p)[0].reward == 0.0
    assert all(s.reward == 0 for s in task.step_rewards(";;;", p))


def test_admissible_rules():
    assert admissible(["+", "*"], 1) and not admissible(["+", "*"], 0)
    assert admissible(["-", "+"], 0) and not admissible(["-", "+"], 1)
    assert admissible(["+", "-"], 1)


def test_demo_errors_change_only_the_supervised_target():
    from evals.arith import left_to_right_steps, parse_expr
    assert solution_text("3+4*2-5", left_to_right=True) == "3+4=7;7*2=14;14-5=9;#9"
    noisy = ArithTask(TaskConfig(demo_error_rate=1.0))
    for p in noisy.sample_train(random.Random(1), 50):
        assert p.answer == str(evaluate(p.question))  # the reward's gold is always the true value
        assert p.solution.endswith(f"#{left_to_right_steps(*parse_expr(p.question))[-1][3]}")
        assert noisy.reward(solution_text(p.question), p) == 1.0
    half = ArithTask(TaskConfig(demo_error_rate=0.5)).sample_train(random.Random(2), 400)
    frac = sum(p.meta.get("demo_error", False) for p in half) / 400
    assert 0.42 < frac < 0.58
    clean = ArithTask(TaskConfig()).sample_train(random.Random(2), 50)
    assert all(p.solution == solution_text(p.question) for p in clean)


def test_outcome_reward_requires_every_step_well_formed(task):
    p = prob(task, "3+4*2-5")  # = 6
    assert task.reward(" 4*2=8 ; 3+8=11;11-5=6;#6\n", p) == 1.0  # whitespace around pieces is fine
    assert task.reward("4*2=8;#6", p) == 1.0  # one well-formed step suffices; the form, not the path
    assert task.reward("4*2=9;3+9=12;12-5=6;#6", p) == 1.0  # wrong step values: still well formed
    for bad in ["#6", "4*2=8;three+8=11;#6", "4*2=8;;#6", "4*2=8;3+8;#6", "4*2=8;3+8=11;11-5=6;# 6x",
                "4*2=8;3/8=1;#6", "4*2=8;3+8=11=11;#6", "hello;#6", "4*2=8 3+8=11;#6"]:
        assert task.reward(bad, p) == 0.0, bad
    assert task.well_formed("4*2=8;#7", p) and not task.well_formed("#6", p)
    # an expression with no operation needs no step
    seven = Problem(id="7", question="7", answer="7", solution="#7", meta={})
    assert task.reward("#7", seven) == 1.0 and task.reward("#8", seven) == 0.0
    # no process credit where the outcome reward is 0: "#6" alone is three missing steps and a final 0
    assert [s.reward for s in task.step_rewards("#6", p)] == [0.0, 0.0, 0.0, 0.0]
    assert [s.reward for s in task.step_rewards("#7", seven)] == [1.0]  # nothing to reduce: the answer is it


def test_validation_split_disjoint_from_train_and_test(task):
    val, test = task.validation_problems(), task.eval_problems()
    assert len(val) == 50 and len({p.id for p in val}) == 50
    assert all(is_heldout(p.id) for p in val)  # the bucket training never draws from
    assert not {p.id for p in val} & {p.id for p in test}
    train = {p.id for p in task.sample_train(random.Random(0), 2000)}
    assert not {p.id for p in val} & train
    # deterministic, and the test set is unchanged by asking for validation first
    t2 = ArithTask(TaskConfig(min_ops=2, max_ops=3, max_operand=9, eval_size=50))
    assert [p.id for p in t2.validation_problems()] == [p.id for p in val]
    assert [p.id for p in t2.eval_problems()] == [p.id for p in test]
    assert [p.id for p in val[:3]] == ["7*1+1+2", "1+4-4+2", "5+6+6"]


def rewards_and_ends(task, completion, problem, finished=True):
    return [(s.reward, s.end) for s in task.step_rewards(completion, problem, finished)]


def test_step_rewards_full_derivation(task):
    p = prob(task, "3+4*2-5")  # 3 operations: 3 steps and the answer
    assert rewards_and_ends(task, "4*2=8;3+8=11;11-5=6;#6", p) == [(1, 6), (1, 13), (1, 20), (1, 22)]
    # the other admissible order is as good (4*2 first is forced; then 3+8 and 11-5)
    q = prob(task, "2*3+4*5")  # both products are admissible first
    assert [r for r, _ in rewards_and_ends(task, "4*5=20;2*3=6;6+20=26;#26", q)] == [1, 1, 1, 1]
    assert task.reward("4*5=20;2*3=6;6+20=26;#26", q) == 1.0


def test_step_rewards_skipped_reductions_earn_nothing_for_the_missing_work(task):
    p = prob(task, "3+4*2-5")  # = 6, K = 3
    # one step, then the (right) answer: two missing steps of 0 at the answer's end, the answer 0
    # (the outcome reward accepts this form: one step suffices; the process reward does not credit it)
    assert task.reward("4*2=8;#6", p) == 1.0
    assert rewards_and_ends(task, "4*2=8;#6", p) == [(1, 6), (0, 8), (0, 8), (0, 8)]
    # two steps, the second folding two operations (3+8-5 is not a step): one missing, no reduction
    assert rewards_and_ends(task, "4*2=8;3+8-5=6;#6", p) == [(1, 6), (0, 14), (0, 16), (0, 16)]
    # a step whose operands are not the current adjacent pair: 2*12 folds 3*4 in (12 was never written)
    q = prob(task, "2*3*4-1")  # = 23
    assert task.reward("2*12=24;24-1=23;#23", q) == 1.0
    assert rewards_and_ends(task, "2*12=24;24-1=23;#23", q) == [(0, 8), (0, 16), (0, 19), (0, 19)]
    # as many steps as operations, one of them not a reduction: the answer still scores 0 (3*4 never reduced)
    assert [r for r, _ in rewards_and_ends(task, "2*3=6;2*12=24;6*4=24;24-1=23;#23", q)] == [1, 0, 1, 1, 1]
    assert [r for r, _ in rewards_and_ends(task, "2*3=6;6*4=24;24-1=23;#23", q)] == [1, 1, 1, 1]


def test_bare_final_answer_earns_no_process_credit(task):
    p = prob(task, "3+4*2-5")
    assert task.reward("#6", p) == 0.0
    assert rewards_and_ends(task, "#6", p) == [(0, 2)] * 4
    assert rewards_and_ends(task, "#7", p) == [(0, 2)] * 4
    # never credit what the outcome reward rejects: a full reduction with a malformed piece or trailing junk
    assert task.reward("4*2=8;hello;3+8=11;11-5=6;#6", p) == 0.0
    assert [r for r, _ in rewards_and_ends(task, "4*2=8;hello;3+8=11;11-5=6;#6", p)] == [1, 0, 1, 1, 0]
    assert rewards_and_ends(task, "4*2=8;3+8=11;11-5=6;#6;x", p) == [(1, 6), (1, 13), (1, 20), (0, 23), (0, 24)]


def test_step_rewards_of_truncated_outputs(task):
    p = prob(task, "3+4*2-5")
    # cut inside the third step: the cut piece is the final-answer slot (0), one step missing (0)
    assert rewards_and_ends(task, "4*2=8;3+8=11;11-", p, finished=False) == [(1, 6), (1, 13), (0, 16), (0, 16)]
    # every step written, cut before EOS: the answer does not score
    assert rewards_and_ends(task, "4*2=8;3+8=11;11-5=6;#6", p, finished=False) == [(1, 6), (1, 13), (1, 20), (0, 22)]
    assert rewards_and_ends(task, "", p, finished=False) == [(0, 0)] * 4


def test_process_reward_never_credits_a_rejected_outcome(task):
    """On many random completions: a ``#N`` piece scores 1 only where the outcome reward is 1 and the
    completion is not short, and every completion is scored over at least K + 1 steps."""
    rng = random.Random(0)
    pieces = ["4*2=8", "3+8=11", "11-5=6", "3+4=7", "7*2=14", "#6", "#14", "#9", "x", ""]
    p = prob(task, "3+4*2-5")
    credited = 0
    for _ in range(3000):
        if rng.random() < 0.5:  # the worked solution with pieces dropped or replaced
            parts = [x for x in ["4*2=8", "3+8=11", "11-5=6", "#6"] if rng.random() < 0.8]
            parts = [rng.choice(pieces) if rng.random() < 0.1 else x for x in parts] or ["#6"]
        else:
            parts = [rng.choice(pieces) for _ in range(rng.randint(1, 5))]
        c = ";".join(parts)
        finished = rng.random() < 0.8
        sr = task.step_rewards(c, p, finished)
        assert len(sr) >= 4, c
        ends, pos = {}, 0
        for j, piece in enumerate(c.split(";")):
            pos += len(piece) + (j < c.count(";"))
            ends[pos] = piece
        for s in sr:
            if s.reward == 1.0 and ends.get(s.end, "").startswith("#"):
                credited += 1
                assert task.reward(c, p, finished) == 1.0 and not task.short_output(c, p, finished), c
    assert credited > 0  # the full derivation does come up


def test_short_output(task):
    p = prob(task, "3+4*2-5")
    assert not task.short_output("4*2=8;3+8=11;11-5=6;#6", p)
    assert not task.short_output("4*2=8;3+8=12;12-5=7;#7", p)  # wrong values, but every step written
    for c in ["#6", "4*2=8;#6", "4*2=8;3+8-5=6;#6", "4*2=8;3+8=11", "", "4*2=8;#6;3+8=11;11-5=6"]:
        assert task.short_output(c, p), c
    assert not task.short_output("4*2=8", p, finished=False)  # truncated: not a choice to skip
    assert Task().short_output("#6", p) is None  # a task that does not know (the default)


def test_disjoint_validation_halves_never_overlap_whatever_the_sizes():
    """task.disjoint_validation: the test set draws from one half of the held-out bucket and the
    validation set from the other (a second hash), so a validation set of one eval_size never
    meets the test set of another (the old split overlaps: its validation set is only disjoint
    from a test set of its own size)."""
    from evals.arith import is_validation
    small = ArithTask(TaskConfig(min_ops=2, max_ops=3, eval_size=200, disjoint_validation=True))
    large = ArithTask(TaskConfig(min_ops=2, max_ops=3, eval_size=1000, disjoint_validation=True))
    val, test = {p.id for p in small.validation_problems()}, {p.id for p in large.eval_problems()}
    assert len(val) == 200 and len(test) == 1000 and not val & test
    assert all(is_heldout(e) and is_validation(e) for e in val)
    assert all(is_heldout(e) and not is_validation(e) for e in test)
    # the old split, the same sizes: the smaller run's validation set overlaps the larger test set
    old_val = {p.id for p in ArithTask(TaskConfig(min_ops=2, max_ops=3, eval_size=200)).validation_problems()}
    old_test = {p.id for p in ArithTask(TaskConfig(min_ops=2, max_ops=3, eval_size=1000)).eval_problems()}
    assert len(old_val & old_test) > 0
    # the second hash is independent of the first: about half the held-out expressions are validation
    held = [e for e in (f"{a}+{b}*{c}" for a in range(1, 10) for b in range(1, 10) for c in range(1, 10))
            if is_heldout(e)]
    share = sum(map(is_validation, held)) / len(held)
    assert 0.35 < share < 0.65, share


def test_disjoint_validation_in_a_counted_space_stops_at_each_half():
    from evals.arith import is_validation, problem_space
    spec = TaskConfig(min_ops=1, max_ops=1, max_operand=9, operators="+", eval_size=50, disjoint_validation=True)
    space = problem_space(spec)
    held = [f"{a}+{b}" for a in range(1, 10) for b in range(1, 10) if is_heldout(f"{a}+{b}")]
    assert space.exact and space.heldout == len(held) and space.validation == sum(map(is_validation, held))
    t = ArithTask(spec)
    assert sorted(p.id for p in t.validation_problems()) == sorted(e for e in held if is_validation(e))
    assert sorted(p.id for p in t.eval_problems()) == sorted(e for e in held if not is_validation(e))
