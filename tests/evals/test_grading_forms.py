"""Answers as people write them (evals/numbers.py, evals/grading.py): number words, repeating
decimals, several boxed answers for a gold that lists several. Each class has positives and
negatives, so a grader that accepts everything fails."""
from fractions import Fraction as F

import pytest

from evals.grading import answer_items, answer_key, grade, is_equiv
from evals.numbers import repeating_decimal, words_to_number


@pytest.mark.parametrize("text,value", [
    ("twelve", 12), ("Twelve.", 12), ("zero", 0), ("twenty-one", 21), ("twenty one", 21), ("ninety-nine", 99),
    ("one hundred and five", 105), ("one hundred five", 105), ("two hundred and forty-five", 245),
    ("one thousand two hundred thirty four", 1234), ("three thousand four hundred", 3400), ("eleven hundred", 1100),
    ("a hundred", 100), ("one million", 10**6), ("a dozen", 12), ("two dozen", 24), ("minus seven", -7),
    ("negative three", -3), ("two and a half", F(5, 2)), ("three quarters", F(3, 4)), ("one half", F(1, 2)),
    ("a half", F(1, 2)), ("two thirds", F(2, 3)), ("twelve dollars", 12), ("five more apples", 5),
    ("1 thousand", 1000),
])
def test_number_words_read_exactly(text, value):
    assert words_to_number(text) == value


@pytest.mark.parametrize("text", ["one two", "the third", "third", "half", "hundred hundred", "two third",
                                  "one thirds", "twenty twenty", "five and", "apples", "12", "A", "", "forty-two-two"])
def test_what_is_not_one_number_in_words_is_none(text):
    assert words_to_number(text) is None


@pytest.mark.parametrize("completion,gold,ok", [
    ("The answer is twelve.", "12", True), ("The answer is twelve.", "13", False),
    ("So she has $\\boxed{\\text{forty-two}}$ stickers.", "42", True), ("#### seven", "7", True),
    ("The answer is two and a half.", "\\frac{5}{2}", True), ("The answer is three quarters.", "0.75", True),
    ("I bought two apples and three pears, 5 in all.", "2", False),  # words in the derivation are not answers
    ("The answer is a dozen.", "12", True), ("The answer is eleven.", "12", False),
])
def test_answers_in_words_grade_as_numbers(completion, gold, ok):
    assert grade(completion, gold).correct is ok


def test_words_and_digits_share_a_majority_vote_key():
    assert answer_key("twelve") == answer_key("12") == "12"
    assert answer_key("two and a half") == answer_key("5/2") == "5/2"


@pytest.mark.parametrize("text,value", [
    ("0.\\overline{3}", F(1, 3)), ("0.1\\overline{6}", F(1, 6)), ("1.\\overline{142857}", F(8, 7)),
    ("0.\\dot{3}", F(1, 3)), ("0.\\dot3", F(1, 3)), ("0.(3)", F(1, 3)), ("0.1(6)", F(1, 6)),
    ("0.333...", F(1, 3)), ("0.142857142857...", F(1, 7)), ("0.1666\\ldots", F(1, 6)),
    ("-0.\\overline{6}", F(-2, 3)), ("2.\\overline{9}", F(3)), ("0.\\overline{12}", F(4, 33)),
])
def test_repeating_decimals_read_exactly(text, value):
    assert repeating_decimal(text) == value


@pytest.mark.parametrize("text", ["0.33", "0.3...", "0.34...", "0.(a)", "1/3", "0.\\overline{}"])
def test_what_is_not_a_repeating_decimal_is_none(text):
    assert repeating_decimal(text) is None


@pytest.mark.parametrize("pred,gold,ok", [
    ("0.\\overline{3}", "\\frac13", True), ("\\frac{1}{3}", "0.\\overline{3}", True),
    ("0.1\\overline{6}", "\\frac{1}{6}", True), ("0.(3)", "1/3", True), ("0.333...", "\\frac{1}{3}", True),
    ("0.33", "0.\\overline{3}", False), ("0.\\overline{3}", "\\frac{1}{4}", False), ("0.\\overline{6}", "\\frac{2}{3}", True),
])
def test_repeating_decimals_equal_their_fractions(pred, gold, ok):
    assert is_equiv(pred, gold) is ok


@pytest.mark.parametrize("gold,items", [
    ("-2, 3", ["-2", "3"]), ("(1,2)", ["(1,2)"]), ("[0, 1)", ["[0, 1)"]), ("1,000", ["1000"]),
    ("\\{1, 2\\}", ["1", "2"]), ("x = -2 or x = 3", ["x = -2", "x = 3"]), ("5", ["5"]), ("-1; 4", ["-1", "4"]),
])
def test_a_gold_lists_its_answers(gold, items):
    assert answer_items(gold) == items


@pytest.mark.parametrize("completion,gold,ok", [
    ("So $\\boxed{-2}$ and $\\boxed{3}$.", "-2, 3", True),
    ("So $\\boxed{3}$ and $\\boxed{-2}$.", "-2, 3", True),          # a set of solutions: any order
    ("$x=\\boxed{-2}$ or $x=\\boxed{3}$", "x = -2 or x = 3", True),
    ("So $\\boxed{-2}$ and $\\boxed{4}$.", "-2, 3", False),         # one wrong
    ("So $\\boxed{-2}$, $\\boxed{3}$, $\\boxed{5}$.", "-2, 3", False),  # one too many
    ("So $\\boxed{3}$.", "-2, 3", False),                            # one missing
    ("The answer is -2 and 3.", "-2, 3", True),
    ("The solutions are -2 and 3.", "-2, 3", False),                 # no answer marker: the last number, 3
    ("$\\boxed{-2, 3}$", "-2, 3", True),
    ("So $\\boxed{3}$ and then $\\boxed{-2}$.", "3", False),         # one answer asked: the last box is it
    ("So $\\boxed{-2}$ and then $\\boxed{3}$.", "3", True),
    ("$\\boxed{(2,1)}$", "(1,2)", False),                            # an ordered pair keeps its order
])
def test_several_boxes_for_a_gold_that_lists_several(completion, gold, ok):
    assert grade(completion, gold).correct is ok
