"""Limits of the study's design that a sweep file is checked against before any work (kept apart from
`harness.report.decisions`, which needs scipy, so that checking a sweep file imports nothing heavy)."""
from __future__ import annotations

MAX_CAP = 100
"""The most seeds a study's design may plan for an arm (a sweep file's ``report.cap``)."""
DESIGN_FIRST_LOOK = 3
"""The study's first look (`harness.report.decisions.Design.first_look`'s default)."""


def is_cap(value) -> bool:
    """Whether ``value`` is a study design's cap: a whole number of seeds from the first look to `MAX_CAP` (the rule
    of a sweep file's ``report.cap``)."""
    return isinstance(value, int) and not isinstance(value, bool) and DESIGN_FIRST_LOOK <= value <= MAX_CAP
