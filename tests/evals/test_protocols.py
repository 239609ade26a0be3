"""evals.protocols: lighteval's GSM8K 5-shot draw, prompt text, stop-sequence cut and grading,
checked against hand-written values, the real GSM8K files and a literal re-run of lighteval's loop."""
import json
import random

import pytest

from evals.catalog import get_task
from evals.datasets import DatasetError
from evals.protocols import (LIGHTEVAL_STOP, PROTOCOLS, ProtocolError, check_protocol, cut_at_stop, get_protocol,
                             lighteval_fewshot_indices, lighteval_gsm8k_answer, lighteval_gsm8k_correct,
                             lighteval_order)
from evals.tasks import Problem, TaskSpec

TEST_SIZE, TRAIN_SIZE = 1319, 7473  # GSM8K (openai/grade-school-math, = hub openai/gsm8k "main")


def test_fewshot_draw_is_lighteval_loop_run_literally():
    """lighteval (ea46419a, lighteval_task.create_requests_from_tasks + prompt_manager): one
    Random(42) shuffles the test docs, then samples 5 few-shot docs per test doc in that order."""
    test_docs = [{"test": i} for i in range(TEST_SIZE)]
    train_docs = [{"train": j} for j in range(TRAIN_SIZE)]
    rnd = random.Random()
    rnd.seed(42)
    rnd.shuffle(test_docs)
    literal = {}
    for doc in test_docs:
        literal[doc["test"]] = [d["train"] for d in rnd.sample(train_docs, 5)]
    got = lighteval_fewshot_indices(TEST_SIZE, TRAIN_SIZE)
    assert got == [literal[i] for i in range(TEST_SIZE)]
    assert [d["test"] for d in test_docs] == lighteval_order(TEST_SIZE)
    # pinned: the draws of test rows 0 and 1318, and the first problems lighteval evaluates
    assert got[0] == [1946, 403, 6109, 3892, 2200] and got[1318] == [5970, 3414, 4955, 5288, 731]
    assert lighteval_order(TEST_SIZE)[:5] == [588, 1214, 57, 906, 1252]


@pytest.fixture(scope="module")
def gsm8k(data_dir):
    rows = {split: [json.loads(line) for line in open(data_dir / "gsm8k" / f"{split}.jsonl", encoding="utf-8")]
            for split in ("train", "test")}
    task = get_task(TaskSpec(name="gsm8k", data_path=str(data_dir / "gsm8k"), eval_size=3))
    return task, rows


def test_plain_prompt_is_lighteval_context_for_test_problem_0(gsm8k):
    task, rows = gsm8k
    view = PROTOCOLS["lighteval-5shot-plain"].bind(task, None)
    prompt = view.prompts(task.eval_problems()[:1])[0]
    # by hand from the raw files: train rows 1946, 403, 6109, 3892, 2200, full gold solutions, blank lines between
    shots = [rows["train"][j] for j in (1946, 403, 6109, 3892, 2200)]
    expected = "\n\n".join([f"Question: {r['question']}\nAnswer: {r['answer']}" for r in shots]
                           + [f"Question: {rows['test'][0]['question']}\nAnswer:"])
    assert prompt == expected
    assert prompt.startswith("Question: Randy has $200 in his piggy bank. He spends 2 dollars every time he goes to "
                             "the store.")
    assert "Answer: Randy spends 2*4=<<2*4=8>>8 dollars every month.\n" in prompt  # calculator notes kept
    assert "#### 104\n\nQuestion: " in prompt  # the gold's #### line, then a blank line
    assert prompt.endswith("There were 14+20=<<14+20=34>>34 legs.\n#### 34\n\nQuestion: Janet’s ducks lay 16 eggs "
                           "per day. She eats three for breakfast every morning and bakes muffins for her friends "
                           "every day with four. She sells the remainder at the farmers' market daily for $2 per "
                           "fresh duck egg. How much in dollars does she make every day at the farmers' market?"
                           "\nAnswer:")
    assert prompt.count("Question: ") == 6 and len(prompt) == 2314
    # "auto" without a chat template is the same plain text
    assert PROTOCOLS["lighteval-5shot"].bind(task, None).prompts(task.eval_problems()[:1])[0] == prompt


def test_cut_at_the_first_stop_sequence():
    text = " 16 - 3 - 4 = 9 eggs.\n9 * 2 = 18\n#### 18\n\nQuestion: A farmer has 3 cows\nAnswer: #### 3"
    assert cut_at_stop(text, LIGHTEVAL_STOP) == (" 16 - 3 - 4 = 9 eggs.\n9 * 2 = 18\n#### 18\n\n", True)
    # "Question" alone stops too, wherever it comes first
    assert cut_at_stop("x = 2\nQuestion 2: y\nQuestion: z", LIGHTEVAL_STOP) == ("x = 2\n", True)
    assert cut_at_stop("#### 5, no question here", LIGHTEVAL_STOP) == ("#### 5, no question here", False)
    assert cut_at_stop("Question: at once", LIGHTEVAL_STOP) == ("", True)


@pytest.mark.parametrize("text, number", [
    ("so 9 * 2 = 18\n#### 18", "18"),
    ("#### 1,000 dollars", "1000"),
    ("#### -5", "-5"),
    ("#### 2.50", "2.50"),          # compared as strings: not "2.5"
    ("#### 18.", "18."),            # a full stop is part of the number
    ("#### 3\nlater #### 4", "3"),  # the first one counts
    ("####18", None),               # exactly one space after ####
    ("#### $18", None),
    ("The answer is 18", None),
    ("\\boxed{18}", None),
    ("", None),
])
def test_lighteval_number_extraction(text, number):
    assert lighteval_gsm8k_answer(text) == number


def test_lighteval_exact_match():
    gold = ("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
            "She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18")
    assert lighteval_gsm8k_correct(" She has 9 eggs, 9*2 = 18.\n#### 18", gold)
    assert lighteval_gsm8k_correct("#### 18 dollars", gold)
    assert not lighteval_gsm8k_correct("#### 18.", gold)
    assert not lighteval_gsm8k_correct("#### 18.0", gold)
    assert not lighteval_gsm8k_correct("The answer is \\boxed{18}.", gold)
    assert not lighteval_gsm8k_correct("", gold)
    assert lighteval_gsm8k_correct("#### 1,234", "#### 1234") and lighteval_gsm8k_correct("#### 1234", "#### 1,234")


def test_grader_cuts_before_grading_and_ignores_finished(gsm8k):
    task, _ = gsm8k
    p = task.eval_problems()[0]  # gold 18
    view = PROTOCOLS["lighteval-5shot"].bind(task, None)
    g = view.grader
    assert g.is_correct(" 16-3-4=9\n9*2=18\n#### 18\n\nQuestion: Tom has 2 cats\nAnswer: #### 2", p)
    assert g.final_answer(" 16-3-4=9\n#### 18\n\nQuestion: x #### 2", finished=False) == "18"
    # the model's "#### 18" after it started the next Question is not its answer
    assert not g.is_correct(" I do not know.\nQuestion: what is 9*2?\nAnswer: #### 18", p)
    assert g.extract_answer(" I do not know.\nQuestion: what is 9*2?\nAnswer: #### 18") is None
    # truncated (no EOS, no stop) still counts, as in lighteval
    assert g.is_correct("9*2 = 18\n#### 18\n9*2 is also", p, finished=False)
    assert view.finish(" #### 18\n\nQuestion: next", False) == (" #### 18\n\n", True)
    assert view.finish(" #### 18 and on and on", False) == (" #### 18 and on and on", False)


def test_chat_protocol_is_the_task_itself(gsm8k):
    task, _ = gsm8k
    view = get_protocol("chat").bind(task, None)
    probs = task.eval_problems()
    assert view.grader is task and view.stop == ()
    assert view.prompts(probs) == [task.format_prompt(p) for p in probs]
    assert view.finish("#### 1\nQuestion: more", False) == ("#### 1\nQuestion: more", False)


def test_protocol_errors_are_one_line():
    for task_name in ("arith", "math", "math500"):
        with pytest.raises(ProtocolError) as e:
            check_protocol("lighteval-5shot", task_name)
        msg = str(e.value)
        assert "\n" not in msg and msg == (f"protocol lighteval-5shot is defined for gsm8k only, not {task_name}: use "
                                           f"protocol chat (the default) for {task_name}")
    with pytest.raises(ProtocolError) as e:
        get_protocol("lighteval")
    assert str(e.value) == ("unknown evaluation protocol 'lighteval': choose from chat, lighteval-5shot, "
                            "lighteval-5shot-plain")
    with pytest.raises(ProtocolError) as e:
        check_protocol("lighteval-5shot", "gsm8k", few_shot=3)
    assert str(e.value) == ("protocol lighteval-5shot brings its own 5 worked examples per problem: task few_shot "
                            "must be 0, got 3")
    assert isinstance(e.value, DatasetError)  # the command line prints it as one line, exit 2
    assert check_protocol("chat", "arith", few_shot=4) is PROTOCOLS["chat"]
    assert check_protocol("lighteval-5shot", "gsm8k").max_new_tokens == 256
    assert list(PROTOCOLS) == ["chat", "lighteval-5shot", "lighteval-5shot-plain"]


def test_problem_outside_the_test_split_is_refused(gsm8k):
    task, _ = gsm8k
    view = PROTOCOLS["lighteval-5shot"].bind(task, None)
    with pytest.raises(ProtocolError, match=r"problem 'train/7' is not a row of the gsm8k test split"):
        view.prompts([Problem(id="train/7", question="q", answer="1", meta={"split": "train", "index": 7})])
    with pytest.raises(ProtocolError, match=r"problem 'mine' is not a row"):
        view.prompts([Problem(id="mine", question="q", answer="1")])
