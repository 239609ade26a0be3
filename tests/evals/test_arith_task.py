"""The arith task: generator determinism, split, worked solutions, outcome and step rewards."""
import random

import pytest

from evals.arith import ArithTask, admissible, evaluate, is_heldout, solution_text
from evals.tasks import Problem, TaskSpec as TaskConfig


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
    assert [s.reward for s in task.step_rewards("4*2=8;#11", p, finished=False)] == [1, 0]
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
    # process rewards are unchanged: "#6" alone is one (final) step, scored 1
    assert [s.reward for s in task.step_rewards("#6", p)] == [1.0]


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
