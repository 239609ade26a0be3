"""Numbers as people write them, read exactly: English number words and repeating decimals.

The grader (`evals.grading.parse_number`) reads an *extracted* answer -- a box, ``#### X``, "the
answer is X" -- with these two readers after its plain-number rules; a chain of thought is
never scanned for words (its last-number fallback looks at digits only), so "two apples and
three pears" in a derivation is not an answer.

`words_to_number` reads a phrase that is a number and nothing else, apart from a sign word in
front and at most three unit words behind ("twelve", "twenty-one", "one hundred and five",
"3 thousand", "minus seven", "a dozen", "two and a half", "three quarters", "two thirds",
"twelve dollars"). Ordinals ("third") stand only as fraction denominators ("two thirds"), never
alone: "the third" is not 3. Anything else (an unknown word, "one two", "hundred hundred") is
None, so a word answer never matches by accident.

`repeating_decimal` reads ``0.\\overline{3}``, ``0.1\\overline{6}``, ``1.\\overline{142857}``,
``0.\\dot{3}``, ``0.(3)`` and a repeated block followed by dots (``0.333...``,
``0.142857142857...``, ``0.1666\\ldots``: the shortest block that repeats at least twice
before the dots; a single digit must appear at least three times) as the exact fraction.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional

UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i >= 2}
SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
DENOMINATORS = {"half": 2, "halves": 2, "third": 3, "thirds": 3, "quarter": 4, "quarters": 4, "fourth": 4,
                "fourths": 4, "fifth": 5, "fifths": 5, "sixth": 6, "sixths": 6, "seventh": 7, "sevenths": 7,
                "eighth": 8, "eighths": 8, "ninth": 9, "ninths": 9, "tenth": 10, "tenths": 10,
                "hundredth": 100, "hundredths": 100}
SIGNS = {"minus": -1, "negative": -1, "positive": 1, "plus": 1}
MAX_UNIT_WORDS = 3
VOCABULARY = set(UNITS) | set(TENS) | set(SCALES) | set(DENOMINATORS) | {"hundred", "dozen", "and", "a", "an"}
_DIGITS_RE = re.compile(r"^\d+(?:\.\d+)?$")


def _integer(words: list[str]) -> Optional[int]:
    """``["one", "hundred", "and", "five"]`` -> 105; None unless the words are one well-formed number."""
    if not words:
        return None
    total, current, last = 0, None, None  # last: kind of the previous word, for well-formedness
    for w in words:
        if w == "and":
            if last not in ("hundred", "scale"):
                return None
            last = "and"
            continue
        if w in UNITS or _DIGITS_RE.match(w):
            v = UNITS[w] if w in UNITS else Fraction(w)
            if last == "tens" and w in UNITS and 1 <= UNITS[w] <= 9:
                current += UNITS[w]
            elif last in ("hundred", "and") and current is not None and current % 100 == 0 and w in UNITS:
                current += UNITS[w]  # "one hundred (and) five"
            elif current is not None and last not in ("scale",):
                return None  # "one two"
            else:
                current = v
            last = "unit"
        elif w in TENS:
            if last in ("hundred", "and") and current is not None and current % 100 == 0:
                current += TENS[w]  # "two hundred (and) forty"
            elif current is not None and last != "scale":
                return None
            else:
                current = TENS[w]
            last = "tens"
        elif w == "hundred":
            if last not in ("unit", "tens", None) or current is None and last is not None:
                return None
            current, last = (current if current is not None else 1) * 100, "hundred"
        elif w in SCALES:
            if current is None:
                return None
            total, current, last = total + current * SCALES[w], None, "scale"
        elif w == "dozen":
            current, last = (current if current is not None else 1) * 12, "hundred"
        else:
            return None
    if last == "and":
        return None
    value = total + (current or 0)
    return int(value) if Fraction(value).denominator == 1 else None


def _phrase(words: list[str]) -> Optional[Fraction]:
    """A number phrase without sign or units: an integer, a fraction, or both ("two and a half")."""
    if not words:
        return None
    if words[0] in ("a", "an") and len(words) > 1:
        words = ["one"] + words[1:]
    if words[-1] in DENOMINATORS:  # "three quarters", "one half", "two and a half"
        den = DENOMINATORS[words[-1]]
        head = words[:-1]
        if len(head) >= 3 and head[-2] == "and" and head[-1] in ("a", "an", "one"):  # "two and a half"
            whole = _integer(head[:-2])
            return None if whole is None else whole + Fraction(1, den)
        if not head:
            return None  # "third", "half" alone: an ordinal or a word, not an answer
        num = _integer(["one" if w in ("a", "an") else w for w in head])
        if num is None or (num == 1) != (words[-1] in ("half", "third", "quarter", "fourth", "fifth", "sixth",
                                                        "seventh", "eighth", "ninth", "tenth", "hundredth")):
            return None  # "two third" / "one thirds": not how a fraction is said
        return Fraction(num, den)
    value = _integer(words)
    return None if value is None else Fraction(value)


def words_to_number(text: Optional[str]) -> Optional[Fraction]:
    """The number an English phrase names, exactly (see the module doc), else None."""
    if not isinstance(text, str) or len(text) > 200:
        return None
    words = [w for w in re.split(r"[\s\-]+", text.strip().lower().replace(",", " ")) if w]
    words = [w.rstrip(".!") for w in words if w.rstrip(".!")]
    if not words or not any(w in VOCABULARY and w not in ("and", "a", "an") for w in words):
        return None  # digits alone are the plain-number rules' job
    sign = 1
    if words[0] in SIGNS:
        sign, words = SIGNS[words[0]], words[1:]
    cut = 0  # unit words behind the number ("twelve dollars", "five more apples"), never number words
    while cut < min(MAX_UNIT_WORDS, len(words) - 1) and words[len(words) - 1 - cut] not in VOCABULARY \
            and not _DIGITS_RE.match(words[len(words) - 1 - cut]):
        cut += 1
    value = _phrase(words[:len(words) - cut])
    return None if value is None else sign * value


_OVERLINE_RE = re.compile(r"^([-+]?)(\d*)\.(\d*)\\(?:overline|dot)\s*\{(\d+)\}$")
_DOT_DIGIT_RE = re.compile(r"^([-+]?)(\d*)\.(\d*)\\dot\s*(\d)$")
_PAREN_RE = re.compile(r"^([-+]?)(\d*)\.(\d*)\((\d+)\)$")
_DOTS_RE = re.compile(r"^([-+]?)(\d*)\.(\d+?)(?:\.\.\.|\\ldots|\\cdots|…)$")


def _value(sign: str, whole: str, fixed: str, period: str) -> Fraction:
    """``whole.fixed(period)(period)...`` as a fraction."""
    base = Fraction(int(whole or "0")) + (Fraction(int(fixed), 10 ** len(fixed)) if fixed else 0)
    rep = Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
    v = base + rep
    return -v if sign == "-" else v


def repeating_decimal(text: Optional[str]) -> Optional[Fraction]:
    """A repeating decimal in one of the notations of the module doc, exactly; else None."""
    if not isinstance(text, str) or len(text) > 100:
        return None
    s = re.sub(r"\s+", "", text.strip().strip("$"))
    for rx in (_OVERLINE_RE, _DOT_DIGIT_RE, _PAREN_RE):
        m = rx.match(s)
        if m:
            return _value(*m.groups())
    m = _DOTS_RE.match(s)
    if not m:
        return None
    sign, whole, digits = m.groups()
    for size in range(1, len(digits) // 2 + 1):  # the shortest block repeated at the end
        block = digits[-size:]
        times = 0
        rest = digits
        while rest.endswith(block):
            rest, times = rest[:-size], times + 1
        if times >= (3 if size == 1 else 2):
            return _value(sign, whole, rest, block)
    return None
