"""Every gold answer of the real data sets grades correct against its own solution and against
itself written the ways models write final answers (evals.grading, evals.datasets).

Data sets (``data_dir``): GSM8K train + test (7,473 + 1,319 golds, the text after ``####``),
MATH test + train (5,000 + 7,498 golds, the last ``\\boxed{}`` of the solution; the two train
rows whose solution ends in an empty ``\\boxed{}`` have no gold and are left out by the task,
listed in ``MATH_TRAIN_WITHOUT_GOLD``) and MATH-500 (500 golds, the ``answer`` field, graded
against the ``solution`` text, which the ``answer`` field was not extracted from).

A failure that is accepted must be listed in ``EXCEPTIONS`` with its reason; the tests assert
that the failures are exactly the listed ones (so a fixed one must be removed from the list).
"""
import json
import re

import pytest

from evals.grading import _HASH_RE, answer_key, extract_answer, extract_gsm8k_gold, grade, last_boxed
from evals.verifier import get_pool

# (data set, form, line number) -> why it is allowed to fail. None at present.
EXCEPTIONS: dict[tuple[str, str, int], str] = {}

# MATH train rows (line numbers) whose solution's only \boxed{} is empty: no gold answer.
MATH_TRAIN_WITHOUT_GOLD = {5530: "'... there are $\\boxed{}$ primes in that range.'",
                           5532: "'... so the answer is $\\boxed{}$.'"}

_ROW_BREAK = re.compile(r"\\\\\s*")


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return [(n, json.loads(line)) for n, line in enumerate(f, 1) if line.strip()]


def forms(g: str) -> dict[str, str]:
    """A gold answer ``g`` in the forms model output puts it in (the regressions included)."""
    out = {
        "boxed": f"So the result is $\\boxed{{{g}}}$.",
        "final_answer_is": f"The final answer is {g}",
        "final_answer_dollar": f"Final Answer: The final answer is ${g}$. I hope it is correct.",
        "answer_colon": f"We are done.\nAnswer: ${g}$",
        "hash": f"Adding up.\n#### {g}",
        "box_then_prose": f"Hence $\\boxed{{{g}}}$ dollars. The final answer is reasonable.",
        "empty_box_after": f"The answer is ${g}$.\n\n$\\boxed{{}}$",
        "unclosed_box": f"so the answer is $\\boxed{{{g}",
    }
    if "\\\\" in g:  # matrices / cases: row breaks with and without a following space
        out["rows_tight"] = "\\boxed{" + _ROW_BREAK.sub(lambda m: "\\\\", g) + "}"
        out["rows_spaced"] = "\\boxed{" + _ROW_BREAK.sub(lambda m: "\\\\ ", g) + "}"
    return out


def _check(name: str, items) -> tuple[dict, dict]:
    """items: (line, solution text, gold, gold as written). Returns (failures, counts per form)."""
    failures: dict[tuple[str, str, int], tuple[str, object]] = {}
    counts: dict[str, int] = {}
    for line, solution, gold, raw in items:
        texts = {"solution": solution, **forms(raw)}
        for form, text in texts.items():
            counts[form] = counts.get(form, 0) + 1
            g = grade(text, gold)
            if not g.correct:
                failures[(name, form, line)] = (gold, g.answer)
    return failures, counts


def _assert_only_exceptions(name, failures):
    listed = {k for k in EXCEPTIONS if k[0] == name}
    assert set(failures) == listed, {k: v for k, v in failures.items() if k not in listed}


def _gsm8k_items(data_dir, split):
    out = []
    for n, r in _rows(data_dir / "gsm8k" / f"{split}.jsonl"):
        raw = list(_HASH_RE.finditer(r["answer"]))[-1].group(1).strip()  # as written: "1,000"
        out.append((n, r["answer"], extract_gsm8k_gold(r["answer"]), raw))
    return out


def _math_items(data_dir, split):
    out, no_gold = [], []
    for n, r in _rows(data_dir / "math" / f"{split}.jsonl"):
        gold = last_boxed(r["solution"])
        if not (gold or "").strip():
            no_gold.append(n)
            continue
        out.append((n, r["solution"], gold.strip(), gold.strip()))
    return out, no_gold


@pytest.mark.parametrize("split, size", [("test", 1319), ("train", 7473)])
def test_gsm8k_golds(data_dir, split, size):
    items = _gsm8k_items(data_dir, split)
    assert len(items) == size
    failures, counts = _check(f"gsm8k/{split}", items)
    _assert_only_exceptions(f"gsm8k/{split}", failures)
    assert counts["solution"] == counts["boxed"] == counts["unclosed_box"] == size
    assert sum(counts.values()) == 9 * size  # no GSM8K gold has a row break


@pytest.mark.parametrize("split, size", [("test", 5000), ("train", 7498)])
def test_math_golds(data_dir, split, size):
    items, no_gold = _math_items(data_dir, split)
    assert len(items) == size
    assert set(no_gold) == (set(MATH_TRAIN_WITHOUT_GOLD) if split == "train" else set())
    # the extractor reads the gold itself out of every solution, not just something equal to it
    assert [extract_answer(sol) for _, sol, _, _ in items] == [gold for _, _, gold, _ in items]
    failures, counts = _check(f"math/{split}", items)
    _assert_only_exceptions(f"math/{split}", failures)
    assert counts["solution"] == size
    assert counts["rows_tight"] == counts["rows_spaced"] > 50  # matrices are exercised


def test_math500_golds(data_dir):
    items = [(n, r["solution"], r["answer"], r["answer"]) for n, r in _rows(data_dir / "math" / "math500_test.jsonl")]
    assert len(items) == 500
    failures, counts = _check("math500", items)
    _assert_only_exceptions("math500", failures)
    assert counts["solution"] == 500 and counts["boxed"] == 500
    # 7 golds are pmatrix answers written with "\\ " (row break + space)
    assert sum("\\\\ " in gold for _, _, gold, _ in items) == 7
    assert counts["rows_tight"] == counts["rows_spaced"] == 7


def test_math500_matrix_golds_spaced_and_tight_grade_the_same(data_dir):
    golds = [r["answer"] for _, r in _rows(data_dir / "math" / "math500_test.jsonl") if "pmatrix" in r["answer"]]
    assert len(golds) >= 7
    for g in golds:
        tight, spaced = _ROW_BREAK.sub(lambda m: "\\\\", g), _ROW_BREAK.sub(lambda m: "\\\\ ", g)
        assert tight != spaced
        assert answer_key(tight) == answer_key(spaced) == answer_key(g), g
        assert grade(f"$\\boxed{{{tight}}}$", spaced).correct and grade(f"$\\boxed{{{spaced}}}$", tight).correct
        # rows in another order are a different matrix
        rows = _ROW_BREAK.split(re.sub(r"\\(?:begin|end)\{pmatrix\}", "", g))
        if len(rows) > 1 and len(set(rows)) == len(rows):
            swapped = "\\begin{pmatrix}" + "\\\\".join(rows[::-1]) + "\\end{pmatrix}"
            assert not grade(f"$\\boxed{{{swapped}}}$", g).correct, (g, swapped)


def test_a_solution_does_not_grade_correct_against_another_gold(data_dir):
    """The grader is not trivially true: MATH-500 solution i against gold i+1, through the
    verifier where the fast paths cannot decide (pairs with equal golds left out)."""
    rows = [r for _, r in _rows(data_dir / "math" / "math500_test.jsonl")]
    calls0 = get_pool().stats["calls"]
    pairs = [(rows[i]["solution"], rows[i + 1]["answer"]) for i in range(len(rows) - 1)
             if answer_key(rows[i]["answer"]) != answer_key(rows[i + 1]["answer"])]
    assert len(pairs) == 496
    wrong_right = [(s[-60:], g) for s, g in pairs if grade(s, g).correct]
    assert wrong_right == []
    assert get_pool().stats["calls"] - calls0 > 100  # the verifier was asked, not only the fast paths

