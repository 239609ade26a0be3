"""Dataset tasks gsm8k / math / math500 (evals.datasets): loading, prompts, grading, errors."""
import json
import random
import warnings
from pathlib import Path

import pytest

from evals.datasets import DatasetError, GSM8KTask, Math500Task, MathTask, find_data_root, iter_jsonl, read_jsonl
from evals.catalog import available_tasks, get_task
from harness.config.schema import TaskConfig


def _task(name, **kw):
    return get_task(TaskConfig(name=name, **kw))


def test_registered():
    assert {"gsm8k", "math", "math500", "arith"} <= set(available_tasks())


def test_data_root_is_found(data_dir, monkeypatch, tmp_path):
    monkeypatch.delenv("GRPO_HARNESS_DATA", raising=False)
    assert find_data_root().resolve() == data_dir
    monkeypatch.chdir(tmp_path)  # from elsewhere: found up from the package
    assert find_data_root().resolve() == data_dir
    monkeypatch.setenv("GRPO_HARNESS_DATA", str(tmp_path))
    assert find_data_root() == tmp_path


def test_gsm8k_from_shared_data(data_dir, monkeypatch):
    monkeypatch.delenv("GRPO_HARNESS_DATA", raising=False)
    t = _task("gsm8k", eval_size=5)
    ev = t.eval_problems()
    assert [p.id for p in ev] == [f"test/{i}" for i in range(5)]
    assert [p.answer for p in ev] == ["18", "3", "70000", "540", "20"]
    assert ev[0].question.startswith("Janet")
    assert len(_task("gsm8k", eval_size=10**6).eval_problems()) == 1319
    assert len(t.train_problems()) == 7473
    assert t.is_correct(ev[0].solution, ev[0]) and not t.is_correct(ev[1].solution, ev[0])


def test_math_and_math500_from_shared_data(data_dir):
    m = _task("math", eval_size=3)
    ev = m.eval_problems()
    assert [p.id for p in ev] == ["test/algebra/1.json", "test/algebra/2.json", "test/algebra/6.json"]
    assert [p.answer for p in ev] == ["2", "\\frac{1}{2}", "5"]
    assert ev[0].meta["level"] == "Level 3" and ev[0].meta["type"] == "Algebra"
    with pytest.warns(UserWarning, match=r"train\.jsonl:5530"):  # a MATH train row with an empty \boxed{}
        train = m.train_problems()
    assert len(train) == 7498
    assert len(_task("math", eval_size=10**6).eval_problems()) == 5000

    m5 = _task("math500", eval_size=500)
    ev5 = m5.eval_problems()
    assert len(ev5) == 500
    assert ev5[0].id == "test/precalculus/807.json" and ev5[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert ev5[0].meta["subject"] == "Precalculus" and ev5[0].meta["level"] == 2
    assert m5.is_correct("so it is $\\boxed{(3, \\frac{\\pi}{2})}$", ev5[0])
    assert not m5.is_correct("so it is $\\boxed{(\\frac{\\pi}{2}, 3)}$", ev5[0])
    assert not m5.is_correct("so it is $\\boxed{(3, \\frac{\\pi}{2})}$", ev5[0], finished=False)


def test_eval_and_train_sampling_are_deterministic(data_dir):
    a, b = _task("gsm8k", eval_size=7), _task("gsm8k", eval_size=7)
    assert [p.id for p in a.eval_problems()] == [p.id for p in b.eval_problems()]
    s1 = a.sample_train(random.Random(3), 6)
    s2 = b.sample_train(random.Random(3), 6)
    assert [p.id for p in s1] == [p.id for p in s2]
    assert len({p.id for p in s1}) == 6 and all(p.id.startswith("train/") for p in s1)
    assert [p.id for p in a.sample_train(random.Random(4), 6)] != [p.id for p in s1]


def test_plain_prompt_and_few_shot(data_dir):
    t = _task("gsm8k", eval_size=1, few_shot=2)
    p = t.eval_problems()[0]
    prompt = t.format_prompt(p)
    assert prompt.count("Question: ") == 3 and prompt.endswith(f"Question: {p.question}\nAnswer:")
    assert "<<" not in prompt and "####" not in prompt  # calculator notes and #### turned into \boxed
    assert prompt.count("\\boxed{") == 3  # the instruction + two worked examples
    shots = t.few_shot_examples()
    assert len(shots) == 2 and all(s.id.startswith("train/") for s in shots)
    assert [s.id for s in _task("gsm8k", few_shot=2).few_shot_examples()] == [s.id for s in shots]
    # plain template: the next "Question:" ends the answer, even in a truncated completion
    c = " 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\nThe answer is 18.\nQuestion: Tom has 7 apples"
    assert t.extract_answer(c) == "18"
    assert t.is_correct(c, p, finished=False)
    assert not t.is_correct(" 16 - 3 - 4 = 9 eggs, 9 * 2 = 18", p, finished=False)


@pytest.mark.filterwarnings("ignore:task math500")
def test_chat_template_prompt(data_dir):
    from harness.engine.models import build_char_tokenizer
    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    t = _task("math500", eval_size=1, few_shot=1).bind_tokenizer(tok)
    p = t.eval_problems()[0]
    prompt = t.format_prompt(p)
    assert prompt.startswith("<user>") and prompt.endswith("</user><assistant>")
    assert prompt.count("<user>") == 2 and prompt.count("<assistant>") == 2
    assert p.question in prompt and "\\boxed{}" in prompt
    # the next "Question:" is not a stop marker with a chat template
    assert t.extract_answer("\\boxed{4}\nQuestion: \\boxed{5}") == "5"


# -- bad files ----------------------------------------------------------------------------------
def _write(path: Path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        _task("gsm8k", data_path=str(tmp_path / "nope.jsonl"))
    t = _task("gsm8k", data_path=str(_write(tmp_path / "test.jsonl", [{"question": "q", "answer": "#### 1"}])))
    assert [p.answer for p in t.eval_problems()] == ["1"]
    with pytest.raises(FileNotFoundError, match=r"train split not found: .*train\.jsonl"):
        t.sample_train(random.Random(0), 1)


def test_row_without_field_names_file_line_and_field(tmp_path):
    f = _write(tmp_path / "test.jsonl", [{"question": "q1", "answer": "#### 1"}, "", {"question": "q2"}])
    with pytest.raises(DatasetError) as e:
        _task("gsm8k", data_path=str(f)).eval_problems()
    msg = str(e.value)
    assert str(f) in msg and ":3:" in msg and "'answer'" in msg


def test_bad_json_and_bad_values(tmp_path):
    f = _write(tmp_path / "bad.jsonl", [{"question": "q", "answer": "#### 1"}, '{"question": "q", '])
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: not valid JSON"):
        _task("gsm8k", data_path=str(f)).eval_problems()
    f = _write(tmp_path / "nohash.jsonl", [{"question": "q", "answer": "it is 4"}])
    with pytest.raises(DatasetError, match=r"nohash\.jsonl:1: field 'answer' has no '####"):
        _task("gsm8k", data_path=str(f)).eval_problems()
    f = _write(tmp_path / "notstr.jsonl", [{"question": 7, "answer": "#### 4"}])
    with pytest.raises(DatasetError, match=r"notstr\.jsonl:1: field 'question' must be a non-empty string"):
        _task("gsm8k", data_path=str(f)).eval_problems()
    f = _write(tmp_path / "list.jsonl", [[1, 2]])
    with pytest.raises(DatasetError, match=r"list\.jsonl:1: expected a JSON object"):
        _task("gsm8k", data_path=str(f)).eval_problems()
    f = _write(tmp_path / "empty.jsonl", [""])
    with pytest.raises(DatasetError, match="no rows"):
        read_jsonl(f)


def test_corrupt_line_past_the_limit_is_never_read(tmp_path):
    """``harness eval --limit N`` (eval_size N) reads the test file only up to the N-th usable
    row: a corrupt line after it does not fail the eval; one within it still does."""
    good = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(5)]
    bad = ['{"question": "broken', [1, 2], {"question": "no answer"}]  # lines 4-6
    f = _write(tmp_path / "test.jsonl", good[:3] + bad + good[3:])
    t = _task("gsm8k", data_path=str(f), eval_size=3)
    assert [p.answer for p in t.eval_problems()] == ["0", "1", "2"]
    assert [p.answer for p in t.eval_problems()] == ["0", "1", "2"]  # (again, from the cached head)
    assert [p.answer for p in _task("gsm8k", data_path=str(f), eval_size=2).eval_problems()] == ["0", "1"]
    with pytest.raises(DatasetError, match=r"test\.jsonl:4: not valid JSON"):
        _task("gsm8k", data_path=str(f), eval_size=4).eval_problems()
    with pytest.raises(DatasetError, match=r"test\.jsonl:4: not valid JSON"):
        t._load_split("test")  # the whole split is still checked when it is all read
    # a row left out (empty \boxed{}) does not count towards the limit
    m = _write(tmp_path / "m.jsonl", [{"problem": "p0", "solution": "\\boxed{}"},
                                      {"problem": "p1", "solution": "\\boxed{1}"}, "{oops"])
    with pytest.warns(UserWarning, match=r"m\.jsonl:1"):
        assert [p.answer for p in _task("math", data_path=str(m), eval_size=1).eval_problems()] == ["1"]
    # the reader itself: lazy, and read_jsonl(limit=) stops before the bad line
    assert read_jsonl(f, limit=3) == [(i + 1, good[i]) for i in range(3)]
    rows = iter_jsonl(f)
    assert [next(rows) for _ in range(3)] == [(i + 1, good[i]) for i in range(3)]
    with pytest.raises(DatasetError, match=r":4: not valid JSON"):
        next(rows)
    with pytest.raises(DatasetError, match=r":4: not valid JSON"):
        read_jsonl(f)


def test_math_row_errors(tmp_path):
    f = _write(tmp_path / "m.jsonl", [{"problem": "p", "solution": "so \\boxed{2}"}, {"problem": "p", "solution": "2"}])
    with pytest.raises(DatasetError, match=r"m\.jsonl:2: field 'solution' has no \\boxed"):
        _task("math", data_path=str(f)).eval_problems()
    f = _write(tmp_path / "m5.jsonl", [{"problem": "p", "solution": "s", "answer": "3"}, {"problem": "p", "solution": "s"}])
    with pytest.raises(DatasetError, match=r"m5\.jsonl:2: missing field 'answer'"):
        _task("math500", data_path=str(f)).eval_problems()
    f = _write(tmp_path / "m6.jsonl", [{"solution": "\\boxed{1}"}])
    with pytest.raises(DatasetError, match=r"m6\.jsonl:1: missing field 'problem'"):
        _task("math", data_path=str(f)).eval_problems()


def test_data_path_directory_and_train_file(tmp_path):
    d = tmp_path / "g"
    d.mkdir()
    _write(d / "train.jsonl", [{"question": f"t{i}", "answer": f"#### {i}"} for i in range(5)])
    _write(d / "test.jsonl", [{"question": f"e{i}", "answer": f"#### {10 + i}"} for i in range(3)])
    t = _task("gsm8k", data_path=str(d), eval_size=2, few_shot=1)
    assert [p.answer for p in t.eval_problems()] == ["10", "11"]
    assert {p.question for p in t.sample_train(random.Random(0), 5)} == {f"t{i}" for i in range(5)}
    assert "Question: t" in t.format_prompt(t.eval_problems()[0])
    t2 = _task("gsm8k", data_path=str(d / "train.jsonl"))  # a train file: test.jsonl beside it is the test split
    assert [p.question for p in t2.eval_problems()] == ["e0", "e1", "e2"]
    # math500 in a folder: test.jsonl stands in for math500_test.jsonl
    m = tmp_path / "m"
    m.mkdir()
    _write(m / "test.jsonl", [{"problem": "p", "answer": "\\frac12", "unique_id": "u1"}])
    t3 = _task("math500", data_path=str(m))
    assert [(p.id, p.answer) for p in t3.eval_problems()] == [("u1", "\\frac12")]
    with pytest.raises(FileNotFoundError, match=r"no math500_test\.jsonl or train\.jsonl"):
        _task("math500", data_path=str(tmp_path / "g" / ".."))


def test_graders_never_raise(data_dir):
    for t in (_task("gsm8k", eval_size=1), _task("math500", eval_size=1)):
        p = t.eval_problems()[0]
        for bad in (None, 3, "", "\\boxed{", "}" * 50, "\x00"):
            assert t.is_correct(bad, p) is False
            assert t.reward(bad, p) == 0.0
            t.extract_answer(bad)


def test_classes_are_the_registered_ones(data_dir):
    assert isinstance(_task("gsm8k"), GSM8KTask)
    assert isinstance(_task("math"), MathTask)
    assert isinstance(_task("math500"), Math500Task)
