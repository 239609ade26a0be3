"""The grader never evaluates a model's answer (issue 25): the verifier's fallback, used when
math_verify is not installed or cannot parse a side, parses with its own whitelisted grammar
instead of sympy's ``parse_expr`` (which runs the text as Python). Hostile answers run nothing
and grade wrong; ordinary answers grade as the old fallback graded them."""
from __future__ import annotations

import builtins
import importlib.util
import sys
from pathlib import Path

import pytest

from evals.grading import grade, is_equiv
from evals.verifier import _WORKER_SCRIPT, VerifierPool

# the worker as a process with math_verify unimportable: every check takes the fallback
NO_MATH_VERIFY = [sys.executable, "-c",
                  "import runpy, sys; sys.modules['math_verify'] = None; "
                  f"runpy.run_path({_WORKER_SCRIPT!r}, run_name='__main__')"]


def _hostile(marker: Path) -> list[str]:
    m = str(marker)
    return [
        f"__import__('os').system('touch {m}')",                      # os.system returns 0: gold "0"
        f"(lambda: __import__('os').system('touch {m}'))()",
        f"open('{m}', 'w')",
        f"exec(\"open('{m}', 'w')\")",
        f"eval(\"__import__('os').system('touch {m}')\")",
        f"sqrt(__import__('os').system('touch {m}'))",
        f"2*__import__('os').system('touch {m}')",
        f"[open('{m}', 'w')]",
        "().__class__.__base__.__subclasses__()",
        "x.__class__",
        "Symbol('x').func",
        "os.system",
        "lambda: 0",
    ]


def _load_worker():
    spec = importlib.util.spec_from_file_location("_verify_worker_under_test", _WORKER_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fallback_pool():
    pool = VerifierPool(cmd=NO_MATH_VERIFY)
    yield pool
    pool.close()


def test_hostile_answers_run_nothing_and_grade_wrong_on_the_fallback(tmp_path, fallback_pool):
    marker = tmp_path / "PWNED"
    for text in _hostile(marker):
        ok, how = fallback_pool.verify_ex(text, "0", timeout=30)
        assert ok is False, (text, how)
        assert how in ("error", "sympy"), (text, how)  # a refusal, not a timeout or a dead worker
        assert is_equiv(text, "0", pool=fallback_pool, timeout=30) is False, text
        assert grade(f"The answer is \\boxed{{{text}}}", "0", pool=fallback_pool, timeout=30).correct is False
        assert not marker.exists(), f"the grader ran {text!r}"


def test_hostile_answers_run_nothing_with_math_verify(tmp_path):
    pytest.importorskip("math_verify")
    marker = tmp_path / "PWNED"
    pool = VerifierPool()
    try:
        for text in _hostile(marker):
            assert pool.verify(text, "0", timeout=30) is False, text
            assert pool.verify("0", text, timeout=30) is False, text  # a hostile gold neither
            assert not marker.exists(), f"the grader ran {text!r}"
    finally:
        pool.close()


def test_fallback_parser_never_calls_eval(monkeypatch, tmp_path):
    vw = _load_worker()
    import sympy
    import sympy.parsing.sympy_parser as sp_parser

    vw._sympy_parse("x^2+2x+1") == vw._sympy_parse("(x+1)^2")  # sympy's lazy imports happen here
    real_eval, real_exec = builtins.eval, builtins.exec

    def boom(*a, **k):
        raise AssertionError("the fallback evaluated text")

    def trap(real):  # imports exec code objects; evaluating a string is what must never happen
        return lambda src, *a, **k: boom() if isinstance(src, (str, bytes)) else real(src, *a, **k)

    monkeypatch.setattr(builtins, "eval", trap(real_eval))
    monkeypatch.setattr(builtins, "exec", trap(real_exec))
    monkeypatch.setattr(sp_parser, "parse_expr", boom)
    monkeypatch.setattr(sympy, "sympify", boom)
    x = sympy.Symbol("x")
    assert vw._sympy_parse("\\frac{1}{2}") == sympy.Rational(1, 2)
    assert vw._sympy_parse("2\\sqrt{2}") == 2 * sympy.sqrt(2)
    assert vw._sympy_parse("x^2+2x+1") == x ** 2 + 2 * x + 1
    assert vw._sympy_parse("\\sqrt[3]{8}") == 2
    assert vw._sympy_parse("\\pi/2") == sympy.pi / 2
    assert vw._sympy_parse("-2^2") == -4 and vw._sympy_parse("2^-1") == sympy.Rational(1, 2)
    for text in _hostile(tmp_path / "PWNED"):
        with pytest.raises(ValueError):
            vw._sympy_parse(text)
    for text in ("x_1", "a[0]", "f'(x)", "1,2", "a:b", "x.y", "x = 1", "`x`", "\x00", "$x$", "x\u00a0!"):
        with pytest.raises(ValueError):
            vw._sympy_parse(text)


def test_fallback_refuses_huge_powers_and_deep_nesting_fast():
    vw = _load_worker()
    for text in ("10^{10^{10}}", "9**9**9", "2^(2^(2^(2^(2^2))))", "(" * 400 + "1" + ")" * 400, "-" * 400 + "1"):
        with pytest.raises(ValueError):
            vw._sympy_parse(text)
    assert vw._sympy_parse("2^{10}") == 1024


# (pred, gold, what the old parse_expr fallback answered): the same answers, by the new one
AS_BEFORE = [
    ("\\frac{1}{2}", "0.5", True), ("1000", "1000", True), ("\\frac{3}{4}", "3/4", True),
    ("2\\sqrt{2}", "\\sqrt{8}", True), ("(1, 2)", "(1,2)", True),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
    ("-2 + 7i", "7i - 2", True), ("x^2+2x+1", "(x+1)^2", True), ("0.15", "\\frac{3}{20}", True),
    ("11\\sqrt2", "11\\sqrt{2}", True), ("( 3, \\frac{\\pi}{2} )", "(3,\\pi/2)", True), ("2x+3", "2x+3", True),
    ("1e3", "1000", True), ("3^2", "9", True), ("2**3", "8", True), ("\\frac{14}{3}", "14/3", True),
    ("-q + p", "p - q", True), ("\\sqrt[3]{8}", "2", True), ("2x", "x*2", True), ("2(x+1)", "2x+2", True),
    ("\\pi/2", "\\frac{\\pi}{2}", True), ("0.1+0.2", "0.3", True), ("1/3", "0.333333333333", True),
    ("x y", "xy", True), ("xy", "yx", True), ("\\alpha", "alpha", True), ("3 \\cdot 4", "12", True),
    ("3\\times4", "12", True), ("-(-3)", "3", True), ("2^{10}", "1024", True), ("12\\sqrt{3}", "\\sqrt{432}", True),
    ("4/6", "2/3", True),
    ("(1,2)", "(2,1)", False), ("[1,2]", "[2,1]", False), ("\\frac{1}{2}", "\\frac{1}{3}", False),
    ("\\pi", "3.14", False), ("1", "2", False), ("0.33", "\\frac{1}{3}", False), ("2\\sqrt{2}", "\\sqrt{2}", False),
    ("x^2", "x^3", False), ("-5", "5", False), ("1000", "100", False), ("i^2", "-1", False),
    ("\\{1,2\\}", "\\{2,1\\}", False), ("3, 5, 7", "7, 5, 3", False), ("(-\\infty, 3]", "(-\\infty,3]", False),
    ("5 and 6", "5", False), ("[1,2)", "(1,2]", False),
]


def test_ordinary_answers_grade_as_the_old_fallback_did(fallback_pool):
    got = [(p, g, fallback_pool.verify(p, g, timeout=30)) for p, g, _ in AS_BEFORE]
    assert got == AS_BEFORE
