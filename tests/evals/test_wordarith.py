"""wordarith: arith's expressions as word problems (evals/wordarith.py)."""
import random
from pathlib import Path

import pytest

from evals.arith import is_heldout, is_validation
from evals.catalog import get_task, has_step_checker
from evals.tasks import TaskSpec
from evals.wordarith import WordArithTask, solution_text, story, tellable

SPEC = TaskSpec(name="wordarith", min_ops=1, max_ops=2, min_operand=2, max_operand=20, eval_size=60,
                disjoint_validation=True)
RIGHT = "3 * 4 = 12\n5 + 12 = 17\nThe answer is 17."


@pytest.fixture
def task():
    return WordArithTask(SPEC)


@pytest.fixture
def prob(task):
    return task.make_problem("5+3*4")


def test_story_and_solution_are_fixed_by_the_expression(task, prob):
    assert story("5+3*4") == ("Zoe has 5 stamps. She gets 3 bags with 4 stamps in each. "
                              "How many stamps does Zoe have now?")
    assert story("6*7-9") == ("Tom has 6 packs with 7 apples in each. He sells 9 apples. "
                              "How many apples does Tom have now?")
    assert story("13-4") == "Sam has 13 apples. He sells 4 apples. How many apples does Sam have now?"
    assert solution_text("6*7-9") == "6 * 7 = 42\n42 - 9 = 33\nThe answer is 33."
    assert (prob.id, prob.question, prob.answer, prob.solution) == ("5+3*4", story("5+3*4"), "17", RIGHT)
    # the same problems whatever the instance or call
    a = WordArithTask(SPEC).sample_train(random.Random(7), 20)
    b = WordArithTask(SPEC).sample_train(random.Random(7), 20)
    assert [(p.id, p.question, p.solution) for p in a] == [(p.id, p.question, p.solution) for p in b]
    assert [p.id for p in task.eval_problems()] == [p.id for p in WordArithTask(SPEC).eval_problems()]


def test_only_tellable_expressions_are_drawn(task):
    assert not tellable("3-5") and not tellable("2*3*4") and not tellable("2-1*3")
    assert tellable("5-5") and tellable("2*3+4") and tellable("9-2*3")
    drawn = [task.random_expr(random.Random(i)) for i in range(300)]
    assert all(tellable(e) for e in drawn)
    assert {"+", "-", "*"} <= set("".join(drawn))


def test_grader_scores_hand_written_completions(task, prob):
    assert task.reward(RIGHT, prob) == 1.0
    assert task.reward(RIGHT + "\n", prob) == 1.0  # surrounding whitespace is ignored
    assert task.reward("3*4=12\n5+12=17\nThe answer is 17", prob) == 1.0  # spaces and '.' optional
    assert task.reward(RIGHT, prob, finished=False) == 0.0  # truncated
    assert task.reward("3 * 4 = 12\n5 + 12 = 18\nThe answer is 18.", prob) == 0.0  # wrong answer
    assert task.reward("3 * 4 = 12\n5 + 12 = 17\nThe answer is 16.", prob) == 0.0
    assert task.reward("The answer is 17.", prob) == 0.0  # no step
    assert task.reward("3 * 4 = 12\n\n5 + 12 = 17\nThe answer is 17.", prob) == 0.0  # a blank line
    assert task.reward("She has 17 stamps.\nThe answer is 17.", prob) == 0.0  # prose
    assert task.reward("She gets 3 * 4 = 12 stamps.\n5 + 12 = 17\nThe answer is 17.", prob) == 0.0
    assert task.reward("3 * 4 = 12\n5 + 12 = 17", prob) == 0.0  # no final line
    assert task.reward("3 * 4 = 12\n5 + 12 = 17\nThe answer is 17.\nDone.", prob) == 0.0  # text after it
    assert task.reward("", prob) == 0.0 and task.reward(None, prob) == 0.0
    assert task.extract_answer(RIGHT) == "17" and task.extract_answer(None) is None
    assert task.final_answer(RIGHT, finished=False) is None


def test_step_rewards_of_a_hand_worked_example(task, prob):
    def steps(c, finished=True):
        return [(s.reward, s.end) for s in task.step_rewards(c, prob, finished)]

    assert steps(RIGHT) == [(1.0, 11), (1.0, 23), (1.0, 40)]
    # a wrong product is carried forward: the sum is right given it, the answer is not
    assert steps("3 * 4 = 13\n5 + 13 = 18\nThe answer is 18.") == [(0.0, 11), (1.0, 23), (0.0, 40)]
    # left to right, ignoring precedence: no step is a reduction of the expression
    assert steps("5 + 3 = 8\n8 * 4 = 32\nThe answer is 17.") == [(0.0, 10), (0.0, 21), (0.0, 38)]
    # a skipped step scores 0 and so does the answer reached over it
    assert steps("3 * 4 = 12\nThe answer is 17.") == [(1.0, 11), (0.0, 28), (0.0, 28)]
    assert steps(RIGHT, finished=False) == [(1.0, 11), (1.0, 23), (0.0, 40)]
    assert steps("3 * 4 = 12\n5 + 1", finished=False) == [(1.0, 11), (0.0, 16), (0.0, 16)]
    assert task.short_output("3 * 4 = 12\nThe answer is 17.", prob) is True
    assert task.short_output(RIGHT, prob) is False
    assert task.step_rewards(None, prob)[0].reward == 0.0  # never raises


def test_splits_are_arith_hashes_and_disjoint(task):
    train = task.sample_train(random.Random(0), 400)
    test, val = task.eval_problems(), task.validation_problems()
    assert len(test) == len(val) == 60
    assert not any(is_heldout(p.id) for p in train)
    assert all(is_heldout(p.id) and not is_validation(p.id) for p in test)
    assert all(is_heldout(p.id) and is_validation(p.id) for p in val)
    ids = [{p.id for p in s} for s in (train, test, val)]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])


class _ChatTok:
    chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"

    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in msgs) + "<assistant>"


def test_prompts_use_the_chat_template_when_there_is_one(task, prob):
    assert task.format_prompt(prob) == (f"Question: {prob.question}\nWrite one calculation per line, then "
                                        f'"The answer is N."\nAnswer:\n')
    task.bind_tokenizer(_ChatTok())
    assert task.format_prompt(prob) == (f"<user>{prob.question}\nWrite one calculation per line, then "
                                        f'"The answer is N."<assistant>')


def test_registered_and_configured():
    from harness.config.schema import load_config

    assert isinstance(get_task(SPEC), WordArithTask) and has_step_checker("wordarith")
    cfg = load_config(Path(__file__).parents[2] / "harness" / "configs" / "wordarith_smollm2.yaml")
    assert cfg.task.name == "wordarith" and cfg.warmup.pretrained and cfg.warmup.enabled
    with pytest.raises(ValueError, match="demo_error_rate"):
        WordArithTask(TaskSpec(name="wordarith", demo_error_rate=0.5)).sample_train(random.Random(0), 1)


def test_pretrained_warmup_is_opt_in_and_keyed_by_what_changes_it(tmp_path):
    from harness.config.paths import uses_warmup_cache
    from harness.config.schema import load_config
    from harness.train.warmup import start_fingerprint, warmup_key

    conf = Path(__file__).parents[2] / "harness" / "configs" / "wordarith_smollm2.yaml"
    cfg = load_config(conf)
    assert uses_warmup_cache(cfg)
    assert not uses_warmup_cache(load_config(conf, ["warmup.pretrained=false"]))  # as before: no warm-up
    key = warmup_key(cfg)
    assert key == warmup_key(load_config(conf, ["task.eval_size=7", "train.lr=1e-5"]))
    for change in ("warmup.steps=3", "warmup.lr=1e-4", "task.max_operand=9", "warmup.examples_per_step=4"):
        assert warmup_key(load_config(conf, [change])) != key, change
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"x")
    local = load_config(conf, [f"model.name_or_path={weights}"])
    before = warmup_key(local), start_fingerprint(str(weights))
    weights.write_bytes(b"xy")  # another model file, another warm-up
    assert warmup_key(local) != before[0] and start_fingerprint(str(weights)) != before[1]
