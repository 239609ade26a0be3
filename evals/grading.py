"""Answer extraction and grading for GSM8K / MATH-style tasks.

Extraction (:func:`extract_answer`) applies these rules in order; the first that yields a
non-empty answer wins:

1. a box: the *last* non-empty ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces allowed,
   also ``\\boxed 5``), by where it starts. A box beats every other marker, wherever they
   are: "... $\\boxed{18}$ dollars. The final answer is reasonable." gives ``18``, and
   ``#### N`` or "the answer is X" after a box do not override it. An empty ``\\boxed{}`` is
   no answer and is skipped (an earlier box, or the rules below, decide). A box that is never
   closed (``\\boxed{\\frac{1}{2}`` at the end of a truncated or sloppy completion) runs to
   the end of the text -- or of its math span, i.e. up to the first unescaped ``$``, ``\\]``
   or ``\\)`` or a blank line after it -- so it gives ``\\frac{1}{2}``, not the last number.
2. without a non-empty box: the last of ``#### X`` (GSM8K) and "the (final) answer is X" /
   "answer: X", taking whichever ends last in the text;
3. without any of those (and only if ``fallback_last_number``): the last number.

A gold that lists several answers (``-2, 3``; :func:`answer_items`) is matched as a set by
:func:`grade`: all the completion's non-empty boxes when it has two or more, else the items of
the extracted answer, each equal to a different gold item, any order.

Numbers people write (:mod:`evals.numbers`): :func:`parse_number` also reads repeating decimals
(``0.\\overline{3}``, ``0.(3)``, ``0.333...``) and English number words ("twelve", "two and a
half") in an extracted answer, exactly.

Normalisation (:func:`clean_answer`, :func:`normalize_answer`) removes presentation:
``$`` and math delimiters, thousands commas (``1,000``, ``1{,}000``, ``1,\\!000``), ``%``,
degree signs, ``\\text{}`` / ``\\mathrm{}`` wrappers, unit words after a number
(``18 dollars``), a trailing ``.0``, ``\\left`` / ``\\right``, LaTeX spacing,
``\\dfrac`` / ``\\tfrac`` -> ``\\frac``, a leading ``x =``, multiple-choice ``(A)`` -> ``A``.

Equivalence (:func:`is_equiv`) has fast paths (equal normalised strings; two plain numbers
compared exactly as fractions) and otherwise asks ``math_verify`` (parse + verify; when it
cannot parse a side, or is not installed, a fallback that parses both sides with a small
whitelisted grammar into sympy expressions and never evaluates the answer's text, so an answer
written as code grades wrong and runs nothing) in a separate worker process under a
per-answer time limit (the verifier pool, :mod:`evals.verifier`): a reply that is late kills the
worker (it is restarted for the next request) and the answer is graded wrong.
``math_verify``'s own signal-based timeouts are off (``parsing_timeout=None``,
``timeout_seconds=None``), so grading works from any thread. Ordered pairs and intervals
keep their order: ``(1,2)`` and ``(2,1)`` differ.

Every public function is total: malformed input grades wrong, it never raises.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence

from evals.numbers import repeating_decimal, words_to_number
from evals.verifier import DEFAULT_TIMEOUT, VerifierPool, get_pool

__all__ = [
    "Grade", "answer_items", "answer_key", "clean_answer", "extract_answer", "extract_gsm8k_gold", "grade",
    "is_equiv", "last_boxed", "normalize_answer", "parse_number", "strip_calculator_annotations",
]

_MAX_ANSWER_CHARS = 1000  # longer "answers" are garbage: graded wrong without a worker call

# --------------------------------------------------------------------------------------
# extraction
# --------------------------------------------------------------------------------------
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_HASH_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS_RE = re.compile(  # the value runs to the end of the line, or of a math span that started on it
    r"(?:final\s+answer|the\s+answer|answer)\s*(?:is|=|:)\s*:?\s*"
    r"((?:\$\$.*?\$\$|\\\[.*?\\\]|(?<!\\)\$(?:\\.|[^$\\])*\$|[^\n])+?)(?=\n|$)", re.IGNORECASE | re.DOTALL)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")


def strip_calculator_annotations(text: str) -> str:
    """Remove GSM8K calculator annotations ``<<48/2=24>>``."""
    return re.sub(r"<<[^<>]*>>", "", text)


def _match_brace(s: str, i: int) -> int:
    """Index just past the brace group opening at ``s[i] == '{'``; -1 if unbalanced."""
    depth = 0
    j = i
    while j < len(s):
        c = s[j]
        if c == "\\" and j + 1 < len(s):  # \{ and \} are literal braces
            j += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return -1


def _boxed_spans(text: str, unclosed: bool = False) -> list[tuple[int, int, str]]:
    """(start, end, content) of every complete ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed N``,
    in order of start. With ``unclosed``, a box whose brace is never closed is included too,
    its content running to the end of its math span (see :func:`_unclosed_end`)."""
    out = []
    for m in _BOX_RE.finditer(text):
        j = m.end()
        if j < len(text) and text[j] == "{":
            e = _match_brace(text, j)
            if e > 0:
                out.append((m.start(), e, text[j + 1:e - 1]))
            elif unclosed:
                e = _unclosed_end(text, j + 1)
                out.append((m.start(), e, text[j + 1:e]))
        elif m.group(0).endswith(" ") or (j < len(text) and text[j].isalnum()):
            mm = re.match(r"[^\s$.,;]+", text[j:])  # "\boxed 5"
            if mm:
                out.append((m.start(), j + mm.end(), mm.group(0)))
    return out


def _unclosed_end(s: str, i: int) -> int:
    """Where the content of a box left open at ``s[i]`` ends: the first unescaped ``$``,
    ``\\]`` or ``\\)`` (the end of the math span holding it) or blank line, else the end."""
    j = i
    while j < len(s):
        c = s[j]
        if c == "\\" and j + 1 < len(s):
            if s[j + 1] in "])":
                return j
            j += 2
            continue
        if c == "$" or (c == "\n" and s.startswith("\n\n", j)):
            return j
        j += 1
    return len(s)


def last_boxed(text: str) -> Optional[str]:
    """Content of the last complete ``\\boxed{...}`` (nested braces allowed), else None."""
    if not isinstance(text, str):
        return None
    spans = _boxed_spans(text)
    return spans[-1][2] if spans else None


def _answer_is_value(raw: str) -> Optional[str]:
    s = raw.strip()
    boxed = last_boxed(s)
    if boxed is not None:
        return boxed
    m = _MATH_SPAN_RE.search(s)  # "the answer is $\frac{1}{2}$." (an escaped \$ is a dollar sign)
    if m:
        return m.group(1).strip()
    m = re.match(r"\\\((.+?)\\\)", s, re.DOTALL) or re.match(r"\\\[(.+?)\\\]", s, re.DOTALL)
    if m:
        return m.group(1).strip()
    for m in _SENTENCE_END_RE.finditer(s):  # the end of the sentence, outside any {...}
        if _brace_depth(s, m.start()) == 0:
            s = s[:m.start()]
            break
    s = s.strip().strip("*").strip()
    return s or None


_MATH_SPAN_RE = re.compile(r"(?<!\\)\$((?:\\.|[^$\\])+)\$")
_SENTENCE_END_RE = re.compile(r"(?<!\\)\.(?:\s|$)|(?<!\\);(?:\s|$)|\s(?:because|since|as|so)\s")


def _brace_depth(s: str, end: int) -> int:
    """Depth of ``{...}`` nesting at ``s[end]`` (escaped braces do not count)."""
    depth, j = 0, 0
    while j < end:
        c = s[j]
        if c == "\\":
            j += 2
            continue
        depth += (c == "{") - (c == "}")
        j += 1
    return depth


def extract_answer(text: str, *, fallback_last_number: bool = True) -> Optional[str]:
    """The final answer of a completion (raw, before normalisation), or None.

    In order (see the module docstring): the last non-empty ``\\boxed{X}`` (an unclosed one
    runs to the end of its math span); else the last of ``#### X`` and "the answer is X"
    (by where it ends); else the last number in the text (if ``fallback_last_number``)."""
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        for _s, _e, content in reversed(_boxed_spans(text, unclosed=True)):
            if content.strip():
                return content.strip()
        cands: list[tuple[int, str]] = []
        for m in _HASH_RE.finditer(text):
            v = m.group(1).strip()
            if v:
                cands.append((m.end(), v))
        for m in _ANSWER_IS_RE.finditer(text):
            v = _answer_is_value(m.group(1))
            if v:
                cands.append((m.end(), v))
        if cands:
            cands.sort(key=lambda c: c[0])
            ans = cands[-1][1].strip()
            return ans if ans else None
        if fallback_last_number:
            nums = _NUMBER_RE.findall(strip_calculator_annotations(text))
            nums = [n.rstrip(",") for n in nums if n.rstrip(",")]
            if nums:
                return nums[-1]
    except Exception:
        return None
    return None


def extract_gsm8k_gold(answer: str) -> str:
    """Gold final answer of a GSM8K ``answer`` field (the text after ``####``), normalised."""
    m = list(_HASH_RE.finditer(answer or ""))
    if not m:
        raise ValueError("GSM8K answer has no '#### <number>' line")
    return normalize_answer(m[-1].group(1))


# --------------------------------------------------------------------------------------
# normalisation
# --------------------------------------------------------------------------------------
_UNITS_SPACED = (  # unit words that must be separated from the number by a space
    "dollars?|cents?|euros?|pounds?|yuan|usd|units?|sq|square|cubic|meters?|metres?|centimeters?|millimeters?|"
    "kilometers?|inch(?:es)?|in|feet|foot|yards?|miles?|hours?|minutes?|seconds?|days?|weeks?|months?|years?|"
    "degrees?|grams?|kilograms?|liters?|litres?|gallons?|cups?|percent|points?|people|persons?|students?|"
    "times|pieces?|items?|pages?|m|s|h|g|l")
_UNITS_ATTACHED = "cm|mm|km|kg|ft|yd|mi|mph|kph|ml|lbs?|oz|hrs?|mins?|secs?|sq ?(?:ft|m|cm|in)"
_NUM = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:/\d+)?"
_POW = r"(?:\^\{?[23]\}?|²|³)?"
_TRAILING_UNITS_RE = re.compile(
    r"^(" + _NUM + r")(?:\s+(?:" + _UNITS_SPACED + r")" + _POW + r"|\s*(?:" + _UNITS_ATTACHED + r")" + _POW + r")"
    r"(?:\s+(?:" + _UNITS_SPACED + "|" + _UNITS_ATTACHED + r")" + _POW + r")*\.?$", re.IGNORECASE)
_WORDS_AFTER_NUMBER_RE = re.compile(  # "18 apples", "5 more dollars" (not "5 and 6")
    r"^(" + _NUM + r")\s+(?![^\n]*\b(?:and|or|to|through|by|plus|minus|times|over)\b)[a-zA-Z][a-zA-Z\s\-']*\.?$")
_THOUSANDS_RE = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?$")
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{")
_LHS_VAR_RE = re.compile(r"^\s*[a-zA-Z](?:_\{?[\w]+\}?)?\s*=\s*(?!=)(.+)$")
_SPACING_RE = re.compile(r"\\[\\ !,;:]")
_SPACING = {"\\!": "", "\\,": " ", "\\;": " ", "\\:": " ", "\\ ": " "}  # "\\\\" stays
_CHOICE_RE = re.compile(r"^\(([A-Ea-e])\)\.?$|^([A-E])\.?$")


def _unwrap_command(s: str, cmd_re: re.Pattern) -> str:
    """``\\text{abc}`` -> ``abc`` (brace-aware, every occurrence)."""
    for _ in range(50):
        m = cmd_re.search(s)
        if not m:
            break
        e = _match_brace(s, m.end() - 1)
        if e < 0:
            s = s[:m.start()] + s[m.end():]
            continue
        s = s[:m.start()] + s[m.end():e - 1] + s[e:]
    return s


def clean_answer(ans: Optional[str]) -> str:
    """Remove presentation from an extracted answer, keeping its LaTeX structure (spaces kept,
    so ``\\pi r`` stays two symbols). This is what the equivalence checker sees."""
    if not isinstance(ans, str):
        return ""
    s = ans.strip()
    # a whole-answer \boxed{...}
    for _ in range(5):
        b = _boxed_spans(s)
        if len(b) == 1 and b[0][0] == 0 and b[0][1] == len(s):
            s = b[0][2].strip()
        else:
            break
    # LaTeX spacing: one pass over backslash pairs, so a row break ``\\\\`` is one token and the
    # ``\\ `` inside ``\\\\ `` (row break + space) is never read as a spacing command.
    s = _SPACING_RE.sub(lambda m: _SPACING.get(m.group(0), m.group(0)), s).replace("{,}", ",")
    s = s.replace("~", " ").replace("\\qquad", " ").replace("\\quad", " ")
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    s = s.replace("\\displaystyle", "")
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s).replace("°", "").replace("\\circ", "")
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\\text\s*\{\s*\}", "", s)
    s = _unwrap_command(s, _TEXT_CMD_RE)
    s = s.strip()
    s = re.sub(r"[.\s]+$", "", s) if not re.search(r"\d\.$", s) else s[:-1]  # trailing full stop
    s = s.strip()
    m = _LHS_VAR_RE.match(s)
    if m and "=" not in m.group(1):
        s = m.group(1).strip()
    m = _TRAILING_UNITS_RE.match(s) or _WORDS_AFTER_NUMBER_RE.match(s)
    if m:
        s = m.group(1)
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    if re.fullmatch(r"[-+]?\d+\.0*", s):  # 18.0 / 18. -> 18
        s = s.split(".")[0]
    elif re.fullmatch(r"[-+]?\d*\.\d*[1-9]0+", s):  # 2.50 -> 2.5
        s = s.rstrip("0")
    if s.startswith("+") and re.fullmatch(r"\+\d+(\.\d+)?", s):
        s = s[1:]
    m = _CHOICE_RE.match(s)
    if m:
        s = (m.group(1) or m.group(2)).upper()
    return s.strip()


def normalize_answer(ans: Optional[str]) -> str:
    """:func:`clean_answer` without any whitespace: the string compared by the fast path."""
    return _squeeze(clean_answer(ans))


def _squeeze(cleaned: str) -> str:
    """The normalisation of an already cleaned answer (see `normalize_answer`)."""
    s = re.sub(r"\s+", "", cleaned)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)  # \frac12
    s = re.sub(r"\\sqrt(\d+)", r"\\sqrt{\1}", s)  # \sqrt2
    return s


def parse_number(ans: Optional[str]) -> Optional[Fraction]:
    """A number as an exact Fraction: a plain one (integer, decimal, ``a/b``, ``\\frac{a}{b}``,
    optionally negative), else a repeating decimal (``0.\\overline{3}``, ``0.(3)``, ``0.333...``)
    or an English number phrase ("twelve", "two and a half": `evals.numbers`); None for anything
    else."""
    cleaned = clean_answer(ans)  # cleaned once: the normalised form and the word reader both start from it
    s = _squeeze(cleaned)
    if not s or len(s) > 200:
        return None
    for text in (ans, cleaned):  # before the plain rules: normalising drops the dots of "0.333..."
        v = repeating_decimal(text)
        if v is not None:
            return v
    plain = _plain_number(s)
    return plain if plain is not None else words_to_number(cleaned)


def _plain_number(s: str) -> Optional[Fraction]:
    """A normalised plain number (see `parse_number`), or None."""
    if len(s) > 60:
        return None
    neg = False
    if s.startswith("-"):
        neg, s = True, s[1:]
    try:
        if re.fullmatch(r"\d+(\.\d*)?|\.\d+", s):
            v = Fraction(s)
        else:
            m = re.fullmatch(r"\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}", s) or \
                re.fullmatch(r"(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)", s)
            if not m:
                return None
            den = Fraction(m.group(2))
            if den == 0:
                return None
            v = Fraction(m.group(1)) / den
    except (ValueError, ZeroDivisionError):
        return None
    return -v if neg else v


def answer_key(ans: Optional[str]) -> Optional[str]:
    """Canonical form used to group equal answers (majority voting): plain numbers map to
    their exact value (``0.5``, ``1/2``, ``\\frac{1}{2}`` share a key), anything else to its
    normalised string. None for a missing/empty answer."""
    if ans is None:
        return None
    try:
        v = parse_number(ans)
        if v is not None:
            return f"{v.numerator}/{v.denominator}" if v.denominator != 1 else str(v.numerator)
        s = normalize_answer(ans)
        return s or None
    except Exception:
        return None


# --------------------------------------------------------------------------------------
# equivalence (the worker processes: evals.verifier)
# --------------------------------------------------------------------------------------
_EQUIV_CACHE: dict[tuple[str, str], bool] = {}
_EQUIV_CACHE_MAX = 50000


def is_equiv(pred: Optional[str], gold: Optional[str], *, timeout: float = DEFAULT_TIMEOUT,
             pool: Optional[VerifierPool] = None, use_verifier: bool = True) -> bool:
    """Are two extracted answers mathematically equal? Never raises; a check that takes
    longer than ``timeout`` seconds is False."""
    try:
        if not isinstance(pred, str) or not isinstance(gold, str):
            return False
        if len(pred) > _MAX_ANSWER_CHARS or len(gold) > _MAX_ANSWER_CHARS:
            return False
        np_, ng = normalize_answer(pred), normalize_answer(gold)
        if not np_ or not ng:
            return False
        if np_ == ng:
            return True
        a, b = parse_number(pred), parse_number(gold)
        if a is not None and b is not None:
            return a == b or abs(a - b) <= Fraction(1, 10**9) * max(1, abs(b))
        if not use_verifier:
            return False
        key = (np_, ng)
        if key in _EQUIV_CACHE:
            return _EQUIV_CACHE[key]
        ok, how = (pool or get_pool()).verify_ex(clean_answer(pred), clean_answer(gold), timeout)
        if how != "timeout" and not how.startswith("error"):
            if len(_EQUIV_CACHE) > _EQUIV_CACHE_MAX:
                _EQUIV_CACHE.clear()
            _EQUIV_CACHE[key] = ok
        return ok
    except Exception:
        return False


@dataclass(frozen=True)
class Grade:
    answer: Optional[str]
    """The extracted answer (raw), None when nothing was found."""
    correct: bool


_LIST_SEP_RE = re.compile(r",|;|\s+and\s+|\s+or\s+")
_MAYBE_LIST_RE = re.compile(r"[,;]|\sand\s|\sor\s")  # a cheap look before splitting


def answer_items(text: Optional[str]) -> list[str]:
    """The answers a text lists: split at top-level commas, semicolons, "and", "or" (not inside
    ``()``, ``[]``, ``{}``: an ordered pair or interval is one answer; a set's ``\\{...\\}``
    braces are dropped first). One item for a single answer, a number with thousands commas
    (``1,000``) included."""
    if not isinstance(text, str) or not text.strip() or len(text) > _MAX_ANSWER_CHARS:
        return []
    s = clean_answer(text)
    m = re.fullmatch(r"\\\{(.*)\\\}", s.strip())
    if m:
        s = m.group(1)
    if _plain_number(normalize_answer(s)) is not None:
        return [s]
    items, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        depth += (c in "([{") - (c in ")]}")
        if depth == 0:
            m = _LIST_SEP_RE.match(s, i)
            if m and m.end() > i:
                items.append(s[start:i])
                start = i = m.end()
                continue
        i += 1
    items.append(s[start:])
    return [t.strip() for t in items if t.strip()]


def _same_items(pred: Sequence[str], gold: Sequence[str], timeout: float, pool) -> bool:
    """Each predicted answer equals a different gold answer (order does not matter)."""
    if len(pred) != len(gold):
        return False
    left = list(gold)
    for p in pred:
        hit = next((j for j, g in enumerate(left) if is_equiv(p, g, timeout=timeout, pool=pool)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def grade(completion: Optional[str], gold: str, *, timeout: float = DEFAULT_TIMEOUT,
          fallback_last_number: bool = True, pool: Optional[VerifierPool] = None) -> Grade:
    """Extract the final answer of ``completion`` and compare it with ``gold``. Never raises.

    A gold that lists several answers (``-2, 3``: the solutions of an equation) is matched as a
    set: by all the non-empty boxes of the completion when it has two or more ("$\\boxed{-2}$
    and $\\boxed{3}$"), else by the items of the extracted answer ("-2 and 3", "3, -2"); each
    must equal a different gold item, in any order. Failing that (and for a single-answer gold,
    where the last box is the answer), the extracted answer is compared whole."""
    try:
        ans = extract_answer(completion, fallback_last_number=fallback_last_number)
    except Exception:
        ans = None
    if ans is None:
        return Grade(None, False)
    try:
        gold_items = answer_items(gold) if _MAYBE_LIST_RE.search(gold) else []
        if len(gold_items) >= 2:
            boxes = [c.strip() for _s, _e, c in _boxed_spans(completion) if c.strip()]
            pred_items = boxes if len(boxes) >= 2 else answer_items(ans)
            if _same_items(pred_items, gold_items, timeout, pool):
                return Grade(", ".join(pred_items), True)
    except Exception:
        pass
    return Grade(ans, is_equiv(ans, gold, timeout=timeout, pool=pool))
