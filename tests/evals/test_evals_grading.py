"""Answer extraction, normalisation and equivalence (evals.grading, evals.verifier)."""
import json
import random
import sys
import threading
import time

import pytest

from evals.grading import (answer_key, clean_answer, extract_answer, extract_gsm8k_gold, grade, is_equiv, last_boxed,
                           normalize_answer, parse_number)
from evals.verifier import VerifierPool, get_pool


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# -- real data -------------------------------------------------------------------------
def test_every_gsm8k_test_solution_grades_correct(data_dir):
    rows = _rows(data_dir / "gsm8k" / "test.jsonl")
    assert len(rows) == 1319
    wrong = [i for i, r in enumerate(rows) if not grade(r["answer"], extract_gsm8k_gold(r["answer"])).correct]
    assert wrong == []
    # and a gold answer never matches the next problem's (the grader is not trivially true)
    gold = [extract_gsm8k_gold(r["answer"]) for r in rows]
    false_pos = sum(grade(rows[i]["answer"], gold[i + 1]).correct for i in range(len(rows) - 1)
                    if gold[i] != gold[i + 1])
    assert false_pos == 0


def test_gsm8k_gold_extraction_values(data_dir):
    rows = _rows(data_dir / "gsm8k" / "test.jsonl")
    assert [extract_gsm8k_gold(r["answer"]) for r in rows[:3]] == ["18", "3", "70000"]
    assert extract_gsm8k_gold("so 1,000 in all\n#### 1,000") == "1000"
    with pytest.raises(ValueError):
        extract_gsm8k_gold("no final line")


def test_math500_solution_matches_answer_field(data_dir):
    rows = _rows(data_dir / "math" / "math500_test.jsonl")
    assert len(rows) == 500
    t0 = time.time()
    ok = [grade(r["solution"], r["answer"]).correct for r in rows]
    elapsed = time.time() - t0
    assert sum(ok) / len(ok) >= 0.99, [r["unique_id"] for r, o in zip(rows, ok) if not o]
    assert elapsed < 60, f"grading MATH-500 took {elapsed:.1f}s"


def test_math500_answers_in_other_forms(data_dir):
    """The verifier path (not just string equality): MATH-500 answers rewritten by hand."""
    rows = {r["unique_id"]: r["answer"] for r in _rows(data_dir / "math" / "math500_test.jsonl")}
    cases = {
        "test/precalculus/807.json": ("(3, \\pi/2)", True),       # \left( 3, \frac{\pi}{2} \right)
        "test/algebra/2584.json": ("14/3", True),  # \frac{14}{3}
        "test/intermediate_algebra/1994.json": ("-q + p", True),  # p - q
    }
    for uid, (pred, expected) in cases.items():
        assert is_equiv(pred, rows[uid]) is expected, (uid, pred, rows[uid])
    assert is_equiv("(\\pi/2, 3)", rows["test/precalculus/807.json"]) is False


# -- extraction --------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18", "18"),
    ("... so the total is 1,000.\n#### 1,000", "1,000"),
    ("We get $x = \\boxed{\\frac{1}{\\sqrt{2}}}$.", "\\frac{1}{\\sqrt{2}}"),
    ("first \\boxed{1}, then \\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
    ("So \\fbox{7} it is", "7"),
    ("The answer is 42.", "42"),
    ("The final answer is $\\frac{3}{4}$. I hope it is correct.", "\\frac{3}{4}"),
    ("Final Answer: The final answer is $5$. I hope it is correct.", "5"),
    ("He pays 3 + 4 = 7 dollars, then 7 * 2 = 14 dollars in total", "14"),
    ("\\boxed{3} wait, the answer is 4.", "3"),        # a box beats any later prose
    ("the answer is 4. Double-check: \\boxed{5}", "5"),
    ("a temperature of -5 degrees", "-5"),
    ("no digits here", None),
    ("", None),
    ("\\boxed{unbalanced", "unbalanced"),               # an unclosed box runs to the end
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_without_number_fallback():
    assert extract_answer("it costs 5 dollars", fallback_last_number=False) is None
    assert extract_answer("it costs 5 dollars") == "5"


def test_last_boxed_nested():
    assert last_boxed("\\boxed{\\frac{a}{\\sqrt{b^{2}}}} and \\boxed{x^{y^{z}}}") == "x^{y^{z}}"
    assert last_boxed("\\boxed{a \\} b}") == "a \\} b"
    assert last_boxed("nothing") is None
    assert last_boxed(None) is None


# -- normalisation ---------------------------------------------------------------------------
@pytest.mark.parametrize("raw, expected", [
    ("1,000", "1000"), ("$1,000", "1000"), ("\\$18.00", "18"), ("18.0", "18"), ("2.50", "2.5"),
    ("50\\%", "50"), ("90^\\circ", "90"), ("18 dollars", "18"), ("5 cm^2", "5"), ("3 \\text{ inches}", "3"),
    ("10,\\!000", "10000"), ("1{,}234", "1234"), ("\\dfrac{3}{4}", "\\frac{3}{4}"), ("\\tfrac12", "\\frac{1}{2}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"), ("x = 5", "5"), ("\\text{(A)}", "A"),
    ("(c)", "C"), ("\\text{Evelyn}", "Evelyn"), ("\\boxed{7}", "7"), ("5 and 6", "5and6"), ("2m", "2m"),
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_clean_answer_keeps_structure():
    assert clean_answer("\\pi r^2") == "\\pi r^2"  # spaces kept for the parser
    assert clean_answer(None) == ""


def test_parse_number_and_key():
    from fractions import Fraction
    assert parse_number("\\frac{1}{2}") == Fraction(1, 2)
    assert parse_number("-0.25") == Fraction(-1, 4)
    assert parse_number("3/0") is None
    assert parse_number("x+1") is None
    assert answer_key("0.5") == answer_key("\\dfrac{1}{2}") == answer_key("1/2") == "1/2"
    assert answer_key("1,000") == answer_key("1000.0") == "1000"
    assert answer_key("x^2") == "x^2"
    assert answer_key(None) is None and answer_key("  ") is None


# -- equivalence ------------------------------------------------------------------------------
EQUIVALENT = [
    ("\\frac{1}{2}", "0.5"), ("1,000", "1000"), ("\\dfrac{3}{4}", "3/4"), ("x=5", "5"), ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\text{(A)}", "A"), ("(1, 2)", "(1,2)"), ("\\{1,2\\}", "\\{2,1\\}"), ("3, 5, 7", "7, 5, 3"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"), ("-2 + 7i", "7i - 2"), ("x^2+2x+1", "(x+1)^2"),
    ("90^\\circ", "90"), ("\\$18.00", "18"), ("50\\%", "50"), ("0.15", "\\frac{3}{20}"), ("11\\sqrt2", "11\\sqrt{2}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"), ("(-\\infty, 3]", "(-\\infty,3]"), ("y = 2x+3", "2x+3"),
    ("\\text{Evelyn}", "Evelyn"), ("x \\in [2, 5)", "[2,5)"), ("18 dollars", "18"),
]
NOT_EQUIVALENT = [
    ("(1,2)", "(2,1)"), ("[1,2)", "(1,2]"), ("\\frac{1}{2}", "\\frac{1}{3}"), ("\\pi", "3.14"), ("1", "2"),
    ("\\text{(A)}", "B"), ("\\text{Evelyn}", "Bob"), ("0.33", "\\frac{1}{3}"), ("2\\sqrt{2}", "\\sqrt{2}"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}2\\\\1\\end{pmatrix}"), ("x^2", "x^3"),
    ("5 and 6", "5"), ("-5", "5"), ("1000", "100"),
]


@pytest.mark.parametrize("pred, gold", EQUIVALENT)
def test_equivalent(pred, gold):
    assert is_equiv(pred, gold) is True
    assert is_equiv(gold, pred) is True


@pytest.mark.parametrize("pred, gold", NOT_EQUIVALENT)
def test_not_equivalent(pred, gold):
    assert is_equiv(pred, gold) is False


def test_grade_returns_extracted_answer():
    g = grade("so we get \\boxed{\\dfrac{3}{4}}.", "0.75")
    assert g.answer == "\\dfrac{3}{4}" and g.correct
    g = grade("the answer is 7", "8")
    assert g.answer == "7" and not g.correct


# -- time limit ------------------------------------------------------------------------------
def test_time_limit_on_a_pathological_expression():
    """10^{10^{10}} makes sympy build a ten-billion-digit integer: the worker is killed at the
    limit, the answer is wrong, and the next check runs on a fresh worker."""
    pool = VerifierPool()
    try:
        assert pool.verify("1", "1+0", timeout=30) is True  # warm: start-up is not part of the limit
        t0 = time.time()
        ok, how = pool.verify_ex("10^{10^{10}}", "1", timeout=1.0)
        elapsed = time.time() - t0
        assert (ok, how) == (False, "timeout")
        assert elapsed < 3.0, elapsed
        assert pool.stats["timeouts"] == 1
        assert pool.verify("2\\sqrt{2}", "\\sqrt{8}", timeout=30) is True
    finally:
        pool.close()


def test_time_limit_with_a_slow_verifier(tmp_path):
    slow = tmp_path / "slow_worker.py"
    slow.write_text("import sys, time, json\nprint(json.dumps({'ready': True}), flush=True)\n"
                    "for line in sys.stdin:\n    time.sleep(30)\n    print(json.dumps({'ok': True}), flush=True)\n")
    pool = VerifierPool(cmd=[sys.executable, str(slow)])
    try:
        pool.verify("warm", "up", timeout=0.01)  # starts the worker (start-up excluded), times out
        t0 = time.time()
        assert is_equiv("x+1", "1+x", timeout=0.5, pool=pool) is False
        assert time.time() - t0 < 1.5
        assert pool.stats["timeouts"] == 2
    finally:
        pool.close()


def test_verifier_is_thread_safe():
    pool = VerifierPool(workers=2)
    pairs = [("x^2+2x+1", "(x+1)^2", True), ("\\sqrt{8}", "2\\sqrt{2}", True), ("(1,2)", "(2,1)", False),
             ("\\frac{\\pi}{2}", "\\pi/2", True), ("x^2", "x^3", False)] * 2
    results = {}

    def work(i):
        p, g, _ = pairs[i]
        results[i] = pool.verify(p, g, timeout=30)

    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(pairs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [results[i] for i in range(len(pairs))] == [e for _, _, e in pairs]
        assert pool.verify_many([(p, g) for p, g, _ in pairs], timeout=30) == [e for _, _, e in pairs]
    finally:
        pool.close()


# -- malformed input ----------------------------------------------------------------------------
MALFORMED = [None, 5, 3.2, [], {}, b"bytes", "", "   ", "\\boxed{", "}}}{{{", "\\frac{", "\\sqrt{-}", "(((((((",
             "\\boxed{}", "####", "#### \n", "the answer is", "x" * 5000, "\x00\xff\ud800", "\\begin{pmatrix}1&",
             "$$$$", "\\left(", "1/0", "\\frac{1}{0}", "=", "x==", "\\text{", "^^^", "0" * 400]


@pytest.mark.parametrize("bad", MALFORMED)
def test_malformed_never_raises(bad):
    g = grade(bad, "5", timeout=5)
    assert g.correct is False
    assert is_equiv(bad, "5", timeout=5) is False
    assert is_equiv("5", bad, timeout=5) in (False, True)  # a junk gold cannot raise either
    normalize_answer(bad), clean_answer(bad), answer_key(bad), extract_answer(bad)


def test_forked_child_gets_its_own_worker():
    import os
    assert is_equiv("\\sqrt{18}", "3\\sqrt{2}")  # the parent's worker is running
    parent_worker = get_pool()._workers[0].proc.pid
    pid = os.fork()
    if pid == 0:  # child: must start its own worker, not write into the parent's pipes
        try:
            ok = is_equiv("x^2+4x+4", "(x+2)^2", timeout=30)
            child_worker = get_pool()._workers[0].proc.pid
            os._exit(0 if ok and child_worker != parent_worker else 1)
        except BaseException:
            os._exit(2)
    deadline = time.time() + 60
    while True:  # fail, do not hang, if the child gets stuck
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("forked child hung while grading")
        time.sleep(0.05)
    assert os.WEXITSTATUS(status) == 0
    assert get_pool()._workers[0].proc.pid == parent_worker
    assert is_equiv("\\frac{\\pi}{4}", "\\pi/4")  # the parent's worker still answers


def test_fuzzed_latex_never_raises():
    rng = random.Random(0)
    alphabet = list("0123456789+-*/^_=(){}[],.x ") + ["\\frac", "\\sqrt", "\\boxed", "\\left", "\\right",
                                                        "\\pi", "\\infty", "\\text", "$", "\\\\", "&", "%"]
    t0 = time.time()
    for _ in range(60):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 25)))
        assert isinstance(grade(s, "\\frac{1}{2}", timeout=3).correct, bool)
        assert isinstance(is_equiv(s, "(1,2)", timeout=3), bool)
    assert time.time() - t0 < 60
    assert get_pool().stats["calls"] > 0


# -- regressions: grading real model output -----------------------------------------------------
def test_row_break_followed_by_a_space_is_not_a_spacing_command():
    """``\\ `` (LaTeX space) was removed before row breaks were seen, so ``\\\\ 2`` (row break,
    space) lost a backslash: the same matrix graded differently with and without the space."""
    spaced = "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}"  # MATH-500 gold, as stored
    tight = "\\begin{pmatrix}-1/3\\\\2/3\\\\5/3\\end{pmatrix}"
    assert normalize_answer(spaced) == normalize_answer(tight) == tight
    assert clean_answer(spaced) == spaced  # only presentation goes; the row breaks stay
    assert clean_answer("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}") == "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"
    assert is_equiv(spaced, tight) and is_equiv(tight, spaced)
    assert grade(f"so $\\boxed{{{tight}}}$", spaced).correct
    assert grade(f"so $\\boxed{{{spaced}}}$", tight).correct
    assert not is_equiv(spaced, "\\begin{pmatrix}-1/3\\\\5/3\\\\2/3\\end{pmatrix}")
    # the spacing commands themselves still go, including next to a row break
    assert normalize_answer("10\\ 000") == "10000" and normalize_answer("1,\\!000") == "1000"
    assert normalize_answer("a\\\\\\ b") == "a\\\\b"  # row break, then a LaTeX space
    assert normalize_answer("x\\,y\\;z\\:w") == "xyzw"


def test_box_beats_trailing_answer_phrase():
    """"answer is / answer:" after a box used to win over the box (4 MATH test golds)."""
    assert extract_answer("It costs $\\boxed{18}$ dollars. The final answer is reasonable.") == "18"
    assert grade("It costs $\\boxed{18}$ dollars. The final answer is reasonable.", "18").correct
    assert extract_answer("\\boxed{-5}. Checking, the answer is correct.") == "-5"
    assert extract_answer("so $x=\\boxed{7}$.\nAnswer: yes, that is it") == "7"
    assert extract_answer("\\boxed{12}\n#### 13") == "12"  # a box beats #### too
    assert extract_answer("\\boxed{1} and later \\boxed{2}. The answer is 3.") == "2"  # the last box


def test_empty_box_does_not_win():
    assert extract_answer("The answer is 5. $\\boxed{}$") == "5"
    assert extract_answer("So \\boxed{6}, and then \\boxed{ }.") == "6"
    assert grade("The answer is 5. $\\boxed{}$", "5").correct
    assert extract_answer("$\\boxed{}$ primes in 3 ranges") == "3"  # no box: the last number
    assert extract_answer("$\\boxed{}$ primes", fallback_last_number=False) is None


def test_unclosed_box_runs_to_the_end():
    assert extract_answer("so the answer is \\boxed{\\frac{1}{2}") == "\\frac{1}{2}"
    assert grade("so the answer is \\boxed{\\frac{1}{2}", "0.5").correct
    assert extract_answer("then $\\boxed{\\frac{1}{2}$. Done, 3 steps.") == "\\frac{1}{2}"  # up to the $
    assert extract_answer("\\[\\boxed{x^{2}\\]\n\nSo 4 it is") == "x^{2}"
    assert extract_answer("\\boxed{3} first, then \\boxed{\\sqrt{2}") == "\\sqrt{2}"  # the last box
    assert extract_answer("\\boxed{\\$18") == "\\$18"  # an escaped dollar is not the end of math
    assert extract_answer("\\boxed{ $ then 7") == "7"  # empty unclosed box: no box
    assert last_boxed("\\boxed{\\frac{1}{2}") is None  # last_boxed still wants a complete box


@pytest.mark.parametrize("text, expected", [
    ("The final answer is $\\$15,\\!000$. I hope it is correct.", "\\$15,\\!000"),  # \$ is a dollar sign
    ("The final answer is \\$18.90.", "\\$18.90"),
    ("The final answer is 10\\;\\text{edges}", "10\\;\\text{edges}"),  # \; is a space, not a full stop
    ("The final answer is 34\\text{ sq. units}. Next", "34\\text{ sq. units}"),  # no sentence end inside {}
    ("The final answer is (-4, 27);(2, 15)", "(-4, 27);(2, 15)"),
    ("The answer is 5; that is all.", "5"),
    ("The final answer is $90\\text{ square\nunits}$. I hope it is correct.", "90\\text{ square\nunits}"),
    ("The final answer is\n$$\n\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}\n$$\nso 3",
     "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("The answer is 5.\nThen 7", "5"),
])
def test_answer_phrase_values(text, expected):
    assert extract_answer(text) == expected
