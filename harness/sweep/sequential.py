"""The study's sequential design, applied by the sweep (``report: {study: true, sequential: true}``).

docs/study.md ("Seeds: the sequential design") states the rule: the claims are tested at every seed
count from the design's first look to its cap, and after each added seed a claim is either decided
(stop adding seeds for it) or open (its arms need the next seed). A sweep with ``report.sequential``
runs that rule instead of the whole grid:

- the plan's seeds are taken in ascending order, one seed at a time (its runs in parallel, as many
  as the launcher's workers); the runs of the first ``first_look`` seeds all run;
- before each later seed, the study's claims are computed on the finished runs
  (`harness.report.study_claims.claims` with the sweep's design, `harness.report.study.design_of`:
  exactly what the study report prints); only the runs of that seed whose arm an open claim needs
  (`harness.report.study_claims.arms_to_extend`) run, and the others are *not needed* (recorded in
  sweep.json and the results table with the looks that decided it);
- a decided claim stays decided when shared arms get more seeds (the design's sequential p-values
  only fall as looks are added), so the stop is final; running the same command again repeats the
  same decisions from the same runs (nothing else is stored).

A seed whose runs did not all finish (failed or interrupted) stops the sweep there: the next
seed's decision needs the whole look. Seeds are numbered as the runs' ``seed``; the looks use the
first n seeds by number, so an arm's seeds are always a prefix of the plan's.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional

from harness.report.aggregate import comparable_settings, setting_difference
from harness.report.decisions import Design
from harness.report.study import design_of
from harness.report.study_claims import arms_to_extend, claim_specs, claims
from harness.report.arms import arm_for
from harness.report.study_data import Study, load_study
from harness.sweep.plan import PlannedRun, Sweep

__all__ = ["sweep_design", "seed_batches", "arm_of_run", "needed_arms", "decide", "design_warnings",
           "arm_setting_problem"]


def arm_of_run(run: PlannedRun) -> str:
    """The study arm of a planned run (as the report names it: `harness.report.arms.arm_for`)."""
    return arm_for(run.config.algo.name, run.config_dict)


def sweep_design(sw: Sweep) -> Design:
    """The study design the sweep file states (`harness.report.study.design_of` of its ``report.cap``): the one the
    study report applies to the sweep.json it writes."""
    return design_of({"report": {"cap": sw.report_cap}})


def seed_batches(runs: list[PlannedRun]) -> list[tuple[int, list[PlannedRun]]]:
    """``(seed, runs of that seed)`` in ascending seed order (plan order within a seed)."""
    seeds = sorted({r.config.seed for r in runs})
    return [(s, [r for r in runs if r.config.seed == s]) for s in seeds]


def _look(sw: Sweep) -> Optional[tuple[Study, list]]:
    """The sweep's finished runs and their claims (`harness.report.study_claims.claims`: one bootstrap
    per claim part); None when no run has finished yet."""
    try:
        study = load_study(sw.sweep_dir)
    except FileNotFoundError:  # no run folder yet
        return None
    return (study, claims(study, sweep_design(sw))) if study.arms else None


def needed_arms(sw: Sweep) -> Optional[dict]:
    """``{arm: seed count it needs}`` for the claims still open on the sweep's finished runs
    (`harness.report.study_claims.arms_to_extend`); None when there is nothing to decide from yet."""
    look = _look(sw)
    return None if look is None else arms_to_extend(look[1], sweep_design(sw))


def decide(sw: Sweep, batch: list[PlannedRun]) -> tuple[dict, list[str]]:
    """The decision before one seed's runs ``batch``, from the sweep's finished runs (their claims
    computed once): ``({run id: why}`` for the runs no open claim needs, ``[one line per claim: its
    id, verdict and sequential status])``; ``({}, [])`` when nothing is finished yet. An arm with no
    finished run is always needed (nothing is known of it)."""
    look = _look(sw)
    if look is None:
        return {}, []
    study, rows = look
    need = arms_to_extend(rows, sweep_design(sw))
    drop = {}
    for r in batch:
        arm = arm_of_run(r)
        if arm in study.arms and arm not in need:
            drop[r.run_id] = (f"sequential design: no open claim needs {arm} after {len(study.arms[arm])} seed(s) "
                              f"(decided, or at its cap)")
    lines = [f"claim {c['id']} ({c['claim']}): {c['verdict']} at {c['n_pairs']} seed(s); {c['status'].text}"
             for c in rows if not c["not_run"]]
    return drop, lines


def design_warnings(sw: Sweep, design: Optional[Design] = None) -> list[str]:
    """One line per claim that the plan's seeds leave untestable, said before any run starts: a claim is looked at
    from ``design.first_look`` seeds to the fewest seeds any of its arms has in the grid (each part spends its whole
    alpha by its arms' own cap, `harness.report.decisions.part_cap`), so a grid that gives an arm fewer seeds than
    the first look leaves its claims never tested. [] otherwise; claims whose arms the sweep does not run are left
    out (the report says "not run")."""
    design = design or sweep_design(sw)
    seeds: dict = {}
    for r in sw.runs:
        seeds.setdefault(arm_of_run(r), set()).add(r.config.seed)
    counts = {a: len(s) for a, s in seeds.items()}
    if not counts:
        return []
    task = sw.runs[0].config.task.name
    study = Study(sweep_dir=sw.sweep_dir, arms=OrderedDict((a, {}) for a in counts), task=task, ood=f"{task}_ood")
    out = []
    for spec in claim_specs(study):
        if not all(a in counts for a in spec.arms):
            continue
        n = min(counts[a] for a in spec.arms)
        if n >= design.first_look:
            continue
        short = ", ".join(f"{a} ({counts[a]} seeds)" for a in spec.arms if counts[a] == n)
        out.append(f"claim {spec.id} ({spec.claim}): the grid gives {short}: it is never tested (the first look "
                   f"needs {design.first_look} seeds); give its arms at least {design.first_look} (docs/study.md, "
                   f"Seeds)")
    return out


def arm_setting_problem(sw: Sweep) -> Optional[str]:
    """Why the study sweep's plan cannot be a study (None when it can): one of its arms (`arm_of_run`) would hold
    runs at two settings (seeds, names, paths, tracking, device and threads aside), which the study report never
    pools (`harness.report.study_data.off_setting` excludes all but the most common): said before any run."""
    first: dict = {}
    for r in sw.runs:
        arm, flat = arm_of_run(r), comparable_settings(r.config_dict)
        if arm not in first:
            first[arm] = (r, flat)
            continue
        diff = setting_difference(flat, first[arm][1])
        if diff:
            return (f"report.study is invalid for this grid: its study arm {arm} would hold two settings ({r.run_id}: "
                    f"{diff}, against {first[arm][0].run_id}); a study arm is one setting over seeds: give the "
                    f"other setting an arm of its own (another algorithm or knob the arm's name carries) or a "
                    f"sweep of its own")
    return None
