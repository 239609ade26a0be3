"""The budget vocabulary, defined once: units, the counters on every metrics row, and what "consumed" and "reached" mean.

A run's budget is ``budget.amount`` of one **unit** (:data:`BUDGET_UNITS`): ``samples``
(completions generated), ``tokens`` (completion tokens generated), ``steps`` (training
stages) or ``seconds`` (training wall-clock, evaluation excluded).

Every ``metrics.jsonl`` row starts with the **counters** (:data:`COUNTERS`), one per unit,
holding what has been consumed so far. The counter of the ``steps`` unit is spelled ``step``
on a row (``{"step": 3, "samples": 96, ...}``); every other counter has its unit's name.
:data:`UNIT_COUNTER` is the one place that says so: code that reads or writes a counter
goes through it (:func:`counter_key`, :func:`consumed`, :func:`row_consumed`). Renaming the
row key would only change :data:`UNIT_COUNTER` (and readers would then have to accept old
files that say ``step``); it is kept as ``step`` so that existing run directories, MLflow
steps and reports stay byte-identical.

``summary.json``'s ``budget.consumed`` is keyed by unit (``{"samples": .., "tokens": ..,
"steps": .., "seconds": ..}``): :func:`consumed_by_unit`.

Evaluation happens at ``budget.eval_points`` evenly spaced thresholds
(:func:`eval_thresholds`); the run stops once :func:`budget_reached`. Both compare with a
tolerance of :data:`EPS`, so float budgets (seconds) land on their thresholds.

Imports nothing of the project: :mod:`harness.config.schema` takes :data:`BUDGET_UNITS`
from here.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

__all__ = ["BUDGET_UNITS", "COUNTERS", "UNIT_COUNTER", "COUNTER_UNIT", "STEP", "EPS", "new_counters",
           "counter_key", "consumed", "row_consumed", "consumed_by_unit", "row_counters", "eval_thresholds",
           "thresholds_passed", "budget_reached", "unit_of"]

BUDGET_UNITS = ("samples", "tokens", "steps", "seconds")
"""The units a budget can be given in (``budget.unit``)."""

UNIT_COUNTER = {"samples": "samples", "tokens": "tokens", "steps": "step", "seconds": "seconds"}
"""Budget unit -> the metrics-row counter that counts it (the one place ``steps`` <-> ``step`` is written)."""

COUNTER_UNIT = {c: u for u, c in UNIT_COUNTER.items()}
"""Metrics-row counter -> its budget unit."""

STEP = UNIT_COUNTER["steps"]
"""Row key of the step counter (also the stage index of the next training step)."""

COUNTERS = (STEP, "samples", "tokens", "seconds")
"""The counters carried, in this order, at the start of every metrics.jsonl row."""

_ZERO = {STEP: 0, "samples": 0, "tokens": 0, "seconds": 0.0}

EPS = 1e-9
"""Tolerance of threshold comparisons (a float budget counts as reached when within EPS)."""


def new_counters() -> dict:
    """Counters of a run that has consumed nothing yet."""
    return {c: _ZERO[c] for c in COUNTERS}


def counter_key(unit: str) -> str:
    """The metrics-row key counting ``unit`` (an unknown unit is its own key)."""
    return UNIT_COUNTER.get(unit, unit)


def consumed(counters: Mapping[str, Any], unit: str):
    """Budget consumed so far in ``unit``, from a run's counters (or a complete metrics row)."""
    return counters[UNIT_COUNTER[unit]]


def row_consumed(row: Mapping[str, Any], unit: str, default: Any = None) -> Any:
    """Budget consumed in ``unit`` at a metrics row that may lack the counter (``default`` then)."""
    return row.get(counter_key(unit), default)


def consumed_by_unit(counters: Mapping[str, Any]) -> dict:
    """``{unit: consumed}`` for every unit (summary.json's ``budget.consumed``); a counter
    missing from ``counters`` (e.g. an empty last row) counts as zero."""
    return {u: counters.get(UNIT_COUNTER[u], _ZERO[UNIT_COUNTER[u]]) for u in BUDGET_UNITS}


def row_counters(counters: Mapping[str, Any]) -> dict:
    """The counter entries that open a metrics row."""
    return {c: counters[c] for c in COUNTERS}


def eval_thresholds(budget) -> list[float]:
    """Budget amounts at which to evaluate: ``budget.eval_points`` evenly spaced up to
    ``budget.amount`` (``budget`` is a :class:`~harness.config.schema.BudgetConfig`)."""
    return [budget.amount * k / budget.eval_points for k in range(1, budget.eval_points + 1)]


def thresholds_passed(thresholds: Sequence[float], passed: int, amount_consumed: float) -> int:
    """How many of ``thresholds`` have been reached, given ``passed`` already were."""
    while passed < len(thresholds) and amount_consumed >= thresholds[passed] - EPS:
        passed += 1
    return passed


def budget_reached(budget, counters: Mapping[str, Any]) -> bool:
    """Whether ``counters`` have consumed ``budget.amount`` of ``budget.unit``."""
    return consumed(counters, budget.unit) >= budget.amount - EPS


def unit_of(counter: str) -> Optional[str]:
    """The budget unit a metrics-row counter counts (None for any other key)."""
    return COUNTER_UNIT.get(counter)
