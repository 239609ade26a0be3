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

Evaluation happens at ``budget.eval_points`` thresholds (:func:`eval_thresholds`); the run
stops once :func:`budget_reached`. Both compare with a tolerance of :data:`EPS`, so float
budgets (seconds) land on their thresholds. A training stage consumes a whole batch, so:

- ``samples``: the thresholds are multiples of the samples a stage consumes
  (:func:`stage_samples`), the nearest to ``amount * k / eval_points``, and the last stage is
  cut to land on ``amount``; every algorithm with the same batch shape evaluates at the same
  sample counts. :func:`threshold_warning` says when ``amount / eval_points`` is not such a
  multiple (the points are then not exact fractions of the budget).
- ``steps``: thresholds are rounded to whole steps.
- ``tokens`` / ``seconds``: a stage's consumption is only known after it, so evaluation is at
  the first stage boundary at or after each threshold; every evaluation row records the
  threshold (``budget/threshold``) next to the counters (the actual budget value), and the
  run overshoots ``amount`` by less than one stage: :func:`overshoot` (summary.json's
  ``budget.overshoot``).

Imports nothing of the project: :mod:`harness.config.schema` takes :data:`BUDGET_UNITS`
from here.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

__all__ = ["BUDGET_UNITS", "COUNTERS", "UNIT_COUNTER", "COUNTER_UNIT", "STEP", "EPS", "new_counters",
           "counter_key", "consumed", "row_consumed", "consumed_by_unit", "row_counters", "eval_thresholds",
           "thresholds_passed", "budget_reached", "unit_of", "stage_samples", "threshold_warning", "overshoot",
           "eval_points"]

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


def stage_samples(prompts_per_step: int, samples_per_prompt: int) -> int:
    """Samples (completions) one full training stage consumes, over all ranks."""
    return prompts_per_step * samples_per_prompt


def eval_thresholds(budget, per_stage: Optional[int] = None) -> list[float]:
    """Budget amounts at which to evaluate: ``budget.eval_points`` points up to
    ``budget.amount`` (``budget`` is a :class:`~harness.config.schema.BudgetConfig`).

    Evenly spaced, except that with unit ``samples`` and ``per_stage`` (samples a stage
    consumes, :func:`stage_samples`) every threshold but the last is the multiple of
    ``per_stage`` nearest to ``amount * k / eval_points`` (at least one stage, strictly
    increasing while room is left), and with unit ``steps`` thresholds are whole steps. The
    last threshold is always ``amount``."""
    n, amount = budget.eval_points, budget.amount
    even = [amount * k / n for k in range(1, n + 1)]
    if budget.unit == "steps":
        return [float(max(1, math.floor(t + 0.5))) for t in even[:-1]] + [amount]
    if budget.unit != "samples" or not per_stage:
        return even
    out: list[float] = []
    for t in even[:-1]:
        m = max(1, math.floor(t / per_stage + 0.5)) * per_stage
        if out and m <= out[-1]:
            m = out[-1] + per_stage
        out.append(float(min(m, amount)))
    return out + [amount]


def eval_points(budget, per_stage: Optional[int] = None) -> list[float]:
    """The budget amounts at which a run really evaluates: `eval_thresholds` with repeats merged
    (thresholds rounded to the same stage boundary are crossed, and evaluated, once)."""
    return sorted(set(eval_thresholds(budget, per_stage)))


def _amounts(points: Sequence[float]) -> str:
    return ", ".join(f"{t:g}" for t in points)


def threshold_warning(budget, per_stage: Optional[int] = None) -> Optional[str]:
    """A sentence when the evaluation points are not what ``budget.eval_points`` asks: fewer
    of them (a stage consumes more than ``amount / eval_points``, so rounded thresholds
    coincide), or not exact fractions of the budget (unit ``samples``: ``amount /
    eval_points`` not a multiple of ``per_stage``; unit ``steps``: not whole); else None."""
    step = amount_step = budget.amount / budget.eval_points
    if budget.unit == "samples" and per_stage:
        got = eval_points(budget, per_stage)
        if len(got) < budget.eval_points:
            return (f"budget.eval_points={budget.eval_points} asks for more evaluation points than the budget has "
                    f"stages ({per_stage} samples each, evaluated at stage boundaries): {len(got)} happen, at "
                    f"{_amounts(got)} samples")
        if abs(step / per_stage - round(step / per_stage)) > EPS:
            return (f"budget.amount / budget.eval_points = {amount_step:g} samples is not a multiple of the "
                    f"{per_stage} samples a stage consumes: evaluating at {_amounts(got)} samples")
    elif budget.unit == "steps" and abs(step - round(step)) > EPS:
        got = eval_points(budget)
        return (f"budget.amount / budget.eval_points = {amount_step:g} steps is not whole: evaluating at "
                f"{_amounts(got)} steps")
    return None


def overshoot(budget, counters: Mapping[str, Any], stage_bound: Optional[float] = None) -> dict:
    """How far the run went past ``budget.amount`` (summary.json's ``budget.overshoot``):
    ``amount`` (in ``budget.unit``, >= 0), ``fraction`` (of ``budget.amount``) and ``bound``,
    the most one stage can consume (``stage_bound``: 0 for samples, cut to land exactly, and
    steps; the caller's bound for tokens and seconds; None when unknown). A run stops at the
    first stage boundary at or after ``amount``, so ``amount < bound`` whenever one is known."""
    over = max(0, consumed(counters, budget.unit) - budget.amount)
    if over <= EPS:
        over = 0 if budget.unit != "seconds" else 0.0
    bound = 0 if budget.unit in ("samples", "steps") else stage_bound
    return {"amount": over, "fraction": over / budget.amount, "bound": bound}


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
