"""Limits of the study's design that a sweep file is checked against before any work (kept apart from
`harness.report.decisions`, which needs scipy, so that checking a sweep file imports nothing heavy)."""
from __future__ import annotations

MAX_CAP = 100
"""The most seeds a study's design may plan for an arm (a sweep file's ``report.cap``)."""
DESIGN_FIRST_LOOK = 3
"""The study's first look (`harness.report.decisions.Design.first_look`'s default)."""
