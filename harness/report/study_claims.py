"""The study's claims: what each predicts and its smallest effect of interest, its parts (paired by seed, and by problem where records allow), verdicts, the sequential plan and the tables.

Each claim is one or more parts; a part is a paired difference ``arm_a - arm_b`` per seed, and
per problem when both runs of a seed have evaluation records that agree with their summaries
(`harness.report.problems`). `claims` builds them from a `study_data.Study`, hands them to
`harness.report.decisions` (tests, looks, Holm, verdicts) and says, per claim, whether it is
decided or which arms need more seeds (`decisions.sequential_plan`). The rules are stated in
the report and in docs/study.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from harness.config.schema import set_dotted
from harness.foundation.base import ConfigError
from harness.report.decisions import Design, PartData, Status, analyse_part, claim_verdict, decide, sequential_plan
from harness.report.format import table
from harness.report.problems import problem_values
from harness.report.sequential import nominal_levels
from harness.report.study_data import Study, arm_for, arm_name, final, initial, peak_rss, samples_to_reach
from harness.rundir.read import RunData, is_number

SESOI_MIB = 32.0
"""Smallest effect of interest of the memory claim (peak RSS, MiB)."""
SESOI_SAMPLES_SHARE = 0.10
"""Smallest effect of interest of a samples-to-accuracy claim: this share of the runs' budget."""

MARGINS_COMMITTED = ((range(1, 9), "3cda659 (2026-11-27)"), (range(9, 19), "8e7189c (2026-11-29)"))
"""Where each claim's prediction and SESOI were committed to docs/study.md before the runs that judge them
(claims 1-8 before study v1's runs, later changes being the design's listed amendments; claims 9-18 before study
v3's)."""


def margins_text(ids: list) -> str:
    """The commits that hold the predictions and SESOIs of the claims ``ids`` (text ids), for the report."""
    parts = []
    for ids_range, commit in MARGINS_COMMITTED:
        got = [i for i in ids if i.isdigit() and int(i) in ids_range]
        if got:
            parts.append(f"claim{'s' if len(got) > 1 else ''} {', '.join(got)} at {commit}")
    return "; ".join(parts)


RULES = {
    "simple": ("reproduced / contradicted: the difference test (two-sided, H0: no difference) is rejected after "
               "Holm, with the mean's sign as predicted / the other way (at the look that decided it); "
               "equivalent: not that, and the TOST (H0: |difference| >= SESOI) is rejected after Holm; otherwise "
               "underpowered"),
    "first_part": ("the claim's verdict is its first part's (the accuracy); the second part (valid-step "
                   "accuracy) is tested beside it, in the family, and shown with its own part verdict"),
    "equivalence": ("the claim predicts no difference: reproduced when the TOST (H0: |difference| >= SESOI) is "
                    "rejected after Holm and the difference test is not; contradicted when the difference test is "
                    "rejected (either sign); otherwise underpowered"),
    "maj_pass": ("parts: the maj@n gain (predicted > 0) and the pass@n gain (predicted not > 0: its own "
                 "'reproduced' means below 0), the paper's metrics over all correct answers; reproduced when maj@n "
                 "is reproduced and pass@n is reproduced or equivalent; contradicted when pass@n is contradicted "
                 "(a lift), or maj@n is contradicted or equivalent (no lift); otherwise underpowered. The "
                 "valid-step parts (valid_maj@n, valid_pass@n), where the runs carry them, are tested beside, in "
                 "the family, and shown with their own part verdicts"),
}


@dataclass
class PartSpec:
    """One paired difference of a claim before the data: its arms, predicted sign, how a seed's
    difference is computed and (``problems``) how its per-problem differences are."""
    what: str
    unit: str
    arm_a: str
    arm_b: str
    expected: int
    diff: Callable[[RunData, RunData], Optional[float]]
    problems: Optional[tuple] = None     # (task, metric, side_a, side_b, scale)
    sesoi: Optional[float] = None        # this part's default SESOI (else Design.sesoi_points)


@dataclass
class ClaimSpec:
    id: str
    claim: str
    comparison: str
    rule: str
    parts: list
    note: str = ""                       # one line the report prints under the claims (e.g. a fallback)
    retired: str = ""                    # why the claim is not tested (report.retired, the learned-PRM gate)
    aside: str = ""                      # a line printed under the claims whether or not the claim ran

    @property
    def arms(self) -> list:
        return sorted({a for p in self.parts for a in (p.arm_a, p.arm_b)})


def _side(side: str, key: str):
    return final(key) if side == "final" else initial(key)


def accuracy_part(what: str, task: str, metric: str, arm_a: str, side_a: str, arm_b: str, side_b: str,
                  expected: int) -> PartSpec:
    """``100 * (metric of arm_a's run at side_a - metric of arm_b's run at side_b)`` (points)."""
    va, vb = _side(side_a, f"{task}/{metric}"), _side(side_b, f"{task}/{metric}")

    def diff(ra, rb):
        a, b = va(ra), vb(rb)
        return 100.0 * (float(a) - float(b)) if is_number(a) and is_number(b) else None
    return PartSpec(what, "points", arm_a, arm_b, expected, diff, (task, metric, side_a, side_b, 100.0))


def _memory_part(arm_a: str, arm_b: str) -> PartSpec:
    def diff(ra, rb):
        a, b = peak_rss(ra), peak_rss(rb)
        return float(a) - float(b) if is_number(a) and is_number(b) else None
    return PartSpec("peak rss_mb", "MiB", arm_a, arm_b, -1, diff, sesoi=SESOI_MIB)


def _samples_part(study: Study, arm_a: str, arm_b: str) -> PartSpec:
    """Samples arm_a needs minus samples arm_b needs to reach the lower of the two runs' final
    accuracies (the same seed)."""
    task = study.task

    def diff(ra, rb):
        fa, fb = ra.final_eval.get(f"{task}/acc"), rb.final_eval.get(f"{task}/acc")
        if not (is_number(fa) and is_number(fb)):
            return None
        target = min(float(fa), float(fb))
        sa, sb = samples_to_reach(ra, task, target), samples_to_reach(rb, task, target)
        return sa - sb if sa is not None and sb is not None else None
    budgets = [((r.summary.get("budget") or {}).get("amount"), (r.summary.get("budget") or {}).get("unit"))
               for a in (arm_a, arm_b) for r in study.arms.get(a, {}).values()]
    amounts = [float(v) for v, u in budgets if is_number(v) and u == "samples"]
    sesoi = SESOI_SAMPLES_SHARE * max(amounts) if amounts else None
    return PartSpec("samples to the lower final accuracy", "samples", arm_a, arm_b, 1, diff, sesoi=sesoi)


def carries(study: Study, arm: str, metric: str, sides=("final", "initial"), every: bool = True) -> bool:
    """Whether the arm's runs carry ``metric`` (``<task>/<name>``) at each of ``sides``: every run
    (``every``), or at least one."""
    runs = list(study.arms.get(arm, {}).values())
    has = [all(is_number(_side(side, metric)(r)) for side in sides) for r in runs]
    return bool(runs) and (all(has) if every else any(has))


def is_lora_family(study: Study) -> bool:
    """A study with a LoRA arm is study v3's real-model (SmolLM2) family: claims 15-18 only."""
    return any(a.endswith("_lora") for a in study.arms)


def study_title(study: Study) -> str:
    """The report's first line: which study family it decides, and the sweep's folder name."""
    if is_lora_family(study):
        return f"# Real-model study (SmolLM2 family, claims 15-18): {study.sweep_dir.name}"
    return f"# DeepSeekMath small study: {study.sweep_dir.name}"


def claim_specs(study: Study) -> list:
    """The study's claims: a sweep with LoRA arms is the SmolLM2 family (claims 15-18, `_smollm2_specs`);
    otherwise the arithmetic family: 1-6 always, 7, 8 and v3's 9-14 when their arms ran. Claim 3 is decided on the
    paper's plain ``maj@n`` / ``pass@n``; when every GRPO run carries the valid-step
    ``valid_maj@n`` / ``valid_pass@n`` at the start and the end, those two are parts beside it
    (tested, shown, not decisive); claim 6 adds a second part on the OOD ``valid_acc`` when some
    GRPO run carries it at both ends (docs/study.md)."""
    if is_lora_family(study):
        return _smollm2_specs(study)
    t, o, n = study.task, study.ood or f"{study.task}_ood", study.ks.get(study.task, 0)
    valid3 = n > 0 and all(carries(study, "grpo", f"{t}/valid_{m}@{n}") for m in ("maj", "pass"))
    note3 = ("decided on the paper's maj@n / pass@n (all correct answers); beside them, not decisive, the same "
             "gains counted over valid-step solutions only (valid_maj@n, valid_pass@n: a sample with an invalid step "
             "counts as wrong)" if valid3 else
             "the runs carry no valid-step maj@n / pass@n (older evaluator): counted over all correct answers")
    parts3 = [accuracy_part(f"maj@{n}", t, f"maj@{n}", "grpo", "final", "grpo", "initial", 1),
              accuracy_part(f"pass@{n}", t, f"pass@{n}", "grpo", "final", "grpo", "initial", -1)]
    if valid3:
        parts3 += [accuracy_part(f"valid_maj@{n}", t, f"valid_maj@{n}", "grpo", "final", "grpo", "initial", 1),
                   accuracy_part(f"valid_pass@{n}", t, f"valid_pass@{n}", "grpo", "final", "grpo", "initial", -1)]
    valid6 = carries(study, "grpo", f"{o}/valid_acc", every=False)
    part6 = [accuracy_part(f"{o}/acc", o, "acc", "grpo", "final", "grpo", "initial", 1)]
    if valid6:
        part6.append(accuracy_part(f"{o}/valid_acc", o, "valid_acc", "grpo", "final", "grpo", "initial", 1))
    acc = f"{t}/acc"
    gate = study.prm_gate                 # None: the sweep names no learned-PRM gate (v1, v2)
    prm_ok = gate is None or gate["passes"]
    if prm_ok and "grpo_ps_prm_r4" in study.arms and "grpo_ps_prm" in study.arms:
        it = ("grpo_ps_prm_r4", "grpo_ps_prm", "4 rounds of iterative RL (PRM retrained, reference reset) vs 1")
    else:
        it = ("grpo_iter", "grpo", "GRPO with reference resets vs GRPO")
    aside4 = ("" if prm_ok else "its learned-PRM version (4 rounds of iterative RL, the PRM retrained, against 1) "
              f"is retired: {gate['text']}; it is decided on reference resets instead (docs/study.md)")
    specs = [
        ClaimSpec("1", "GRPO+PS > GRPO+OS", f"grpo_ps − grpo: final {acc} (points)", "simple",
                  [accuracy_part(acc, t, "acc", "grpo_ps", "final", "grpo", "final", 1)]),
        ClaimSpec("2", "GRPO > online RFT", f"grpo − rft: final {acc} (points)", "simple",
                  [accuracy_part(acc, t, "acc", "grpo", "final", "rft", "final", 1)]),
        ClaimSpec("3", "RL lifts Maj@K but not Pass@K (GRPO)",
                  f"grpo after RL − its start: {t}/maj@{n} and {t}/pass@{n} (the verdict)"
                  + (f"; beside: {t}/valid_maj@{n} and {t}/valid_pass@{n}" if valid3 else "") + " (points)", "maj_pass",
                  parts3, note=note3),
        ClaimSpec("4", "Iterative RL helps", f"{it[0]} − {it[1]}: final {acc} (points; {it[2]})", "simple",
                  [accuracy_part(acc, t, "acc", it[0], "final", it[1], "final", 1)], aside=aside4),
        ClaimSpec("5", "GRPO needs less memory than PPO at equal policy size",
                  f"grpo − ppo: peak RSS (MiB; expected < 0); {_policy_sizes(study, ('grpo', 'ppo'))}", "simple",
                  [_memory_part("grpo", "ppo")]),
        ClaimSpec("6", "RL improves out-of-domain too (GRPO)",
                  f"grpo after RL − its start: {o}/acc" + (f" (the verdict) and {o}/valid_acc" if valid6 else "")
                  + " (points)", "first_part" if valid6 else "simple", part6),
    ]
    retired = retired_claims(study)
    if ("prime" in study.arms and "rloo" in study.arms) or "7" in retired:
        specs.append(ClaimSpec("7", "PRIME reaches RLOO's accuracy with fewer samples",
                               f"rloo − prime: samples to reach the lower of the two final {acc} (same seed)",
                               "simple", [_samples_part(study, "rloo", "prime")]))
    if ("grpo_ps_prm" in study.arms and "grpo_ps" in study.arms) or gate is not None or "8" in retired:
        specs.append(ClaimSpec("8", "GRPO+PS: the exact step checker beats a learned PRM",
                               f"grpo_ps − grpo_ps_prm: final {acc} (points)", "simple",
                               [accuracy_part(acc, t, "acc", "grpo_ps", "final", "grpo_ps_prm", "final", 1)],
                               retired="" if prm_ok else gate["text"]))
    specs += [c for c in _v3_arith_specs(t) if all(a in study.arms for a in c.arms) or c.id in retired]
    return _retire(specs, retired)


def retired_claims(study: Study) -> dict:
    """The sweep file's ``report.retired`` as recorded in sweep.json: ``{claim id: why}`` ({} when none, or when
    sweep.json holds something else there)."""
    got = _report_key(study, "retired")
    if not isinstance(got, dict):
        return {}
    return {str(k): " ".join(v.split()) for k, v in got.items() if isinstance(v, str) and v.strip()}


def unknown_retired(study: Study, rows: list) -> list:
    """Claim ids ``report.retired`` names that are none of ``rows`` (`claims`'s: this study's family); ignored, and
    the report says so."""
    known = {c["id"] for c in rows}
    return sorted((i for i in retired_claims(study) if i not in known), key=lambda i: (len(i), i))


def _report_key(study: Study, key: str):
    """sweep.json's ``report.<key>`` (None when absent, or when sweep.json holds something else there)."""
    rep = study.sweep_json.get("report") if isinstance(study.sweep_json, dict) else None
    return rep.get(key) if isinstance(rep, dict) else None


def _retire(specs: list, retired: dict) -> list:
    """``specs`` with ``report.retired``'s reasons set (a reason the learned-PRM gate gave comes first)."""
    for spec in specs:
        why = retired.get(spec.id)
        if why:
            spec.retired = f"{spec.retired}; {why}" if spec.retired else why
    return specs


def _pair(cid: str, claim: str, t: str, a: str, b: str, expected: int) -> ClaimSpec:
    """A claim of one part: final ``<t>/acc`` of arm a minus arm b, paired by seed and problem (points);
    ``expected`` 0: predicted equivalent (rule ``equivalence``)."""
    acc = f"{t}/acc"
    said = {1: "expected > 0", -1: "expected < 0", 0: "expected within ±SESOI"}[expected]
    rule = "equivalence" if expected == 0 else "simple"
    return ClaimSpec(cid, claim, f"{a} − {b}: final {acc} (points; {said})", rule,
                     [accuracy_part(acc, t, "acc", a, "final", b, "final", expected)])


def _v3_arith_specs(t: str) -> list:
    """Study v3's claims on the arithmetic family (docs/study.md, "Study v3"): the 2026 objectives and
    off-policy training against GRPO. Listed when their arms ran (a v2 sweep has none of them)."""
    return [_pair("9", "DAPO beats GRPO", t, "dapo", "grpo", 1),
            _pair("10", "GSPO beats GRPO", t, "gspo", "grpo", 1),
            _pair("11", "CISPO beats GRPO", t, "cispo", "grpo", 1),
            _pair("12", "one step of staleness costs nothing", t, "grpo_k1", "grpo", 0),
            _pair("13", "staleness 8 without a correction costs accuracy", t, "grpo_k8", "grpo", -1),
            _pair("14", "token-level TIS buys accuracy back at staleness 8", t, "grpo_k8_token_tis", "grpo_k8", 1)]


def _smollm2_specs(study: Study) -> list:
    """Study v3's claims on the SmolLM2 family (LoRA arms; docs/study.md, "Study v3"): every one listed, a
    claim whose arms did not run as not run. "GRPO" there is Dr. GRPO."""
    t = study.task
    return _retire([_pair("15", "GRPO beats online RFT (LoRA, SmolLM2)", t, "dr_grpo_lora", "rft_lora", 1),
            _pair("16", "GRPO matches PPO without a critic (LoRA, SmolLM2)", t, "dr_grpo_lora", "ppo_lora", 0),
            _pair("17", "LoRA matches full fine-tuning for GRPO (SmolLM2)", t, "dr_grpo_lora", "dr_grpo", 0),
            ClaimSpec("18", "GRPO needs less memory than PPO (LoRA, SmolLM2)",
                      f"dr_grpo_lora − ppo_lora: peak RSS (MiB; expected < 0); "
                      f"{_policy_sizes(study, ('dr_grpo_lora', 'ppo_lora'))}", "simple",
                      [_memory_part("dr_grpo_lora", "ppo_lora")])], retired_claims(study))


def _policy_sizes(study: Study, arms: tuple) -> str:
    sizes = []
    for a in arms:
        vals = {(r.summary.get("params") or {}).get("policy") for r in study.arms.get(a, {}).values()}
        sizes.append(f"{a} {', '.join(str(v) for v in sorted(vals, key=str))}")
    return "policy parameters: " + "; ".join(sizes)


def part_data(study: Study, claim_id: str, index: int, spec: PartSpec, sesoi: float,
              planned: Optional[dict] = None) -> PartData:
    """The per-seed (and per-problem) differences of one part; its ``cap`` is the seeds the sweep
    plans for both its arms (``planned``, `planned_seeds`), None when the plan does not say."""
    ra, rb = study.arms[spec.arm_a], study.arms[spec.arm_b]
    planned = planned if planned is not None else {}
    cap = min(planned[spec.arm_a], planned[spec.arm_b]) if spec.arm_a in planned and spec.arm_b in planned else None
    vals, gaps = {}, []
    for s in sorted(set(ra) & set(rb)):
        v = spec.diff(ra[s], rb[s])
        if v is not None and np.isfinite(v):
            vals[s] = float(v)
        else:
            gaps.append(f"seed {s} ({ra[s].run_id} / {rb[s].run_id})")
    seeds = sorted(vals)
    data = PartData(spec.what, spec.unit, spec.expected, sesoi, seeds, [vals[s] for s in seeds],
                    key=f"{claim_id}/{index}", cap=cap)
    left_out = (f"left out for a value missing in a run: {', '.join(gaps)}" if gaps and seeds else "")

    def note(why: str = "") -> str:   # why the part is as it is, then the seeds left out
        return "; ".join(x for x in (why, left_out) if x)
    if not spec.problems:
        data.note = note("no per-problem level (one value per run)")
        return data
    data.note = note()
    if not seeds:
        return data
    task, metric, side_a, side_b, scale = spec.problems
    per = []
    for s in seeds:
        a, why_a = problem_values(ra[s], task, metric, side_a, study.records_cache)
        b, why_b = problem_values(rb[s], task, metric, side_b, study.records_cache)
        if a is None or b is None:
            data.note = note(f"problems not resampled: {why_a or why_b}")
            return data
        common = sorted(set(a) & set(b))
        if not common:
            data.note = note(f"problems not resampled: seed {s}'s runs share no problem")
            return data
        per.append((common, np.array([scale * (a[i] - b[i]) for i in common])))
    data.problems = [d for _, d in per]
    data.crossed = all(c == per[0][0] for c, _ in per)
    return data


def _sesoi(design: Design, claim_id: str, spec: PartSpec) -> float:
    default = spec.sesoi if spec.sesoi is not None else design.sesoi_points
    return design.sesoi_for(claim_id, default)


def claims(study: Study, design: Design) -> list:
    """Every claim with its parts' numbers, verdicts and sequential status. A claim whose arms
    did not run, or ran without measuring it on any seed, is 'not run' and outside the family."""
    out, pending = [], []
    planned = planned_seeds(study)
    for spec in claim_specs(study):
        missing = [a for a in spec.arms if a not in study.arms]
        row = {"id": spec.id, "claim": spec.claim, "comparison": spec.comparison, "rule": spec.rule,
               "note": spec.note, "aside": spec.aside, "arms": spec.arms, "not_run": missing, "parts": [],
               "verdict": "not run", "n_pairs": 0}
        out.append(row)
        if spec.retired:   # not tested, outside the family, whatever ran
            row.update(verdict="retired", not_run=[spec.retired], retired=True)
            continue
        if missing:
            continue
        parts = [part_data(study, spec.id, i, p, _sesoi(design, spec.id, p), planned) for i, p in enumerate(spec.parts)]
        if not any(d.values for d in parts):   # the arms ran but never measured it (e.g. no OOD set)
            row["not_run"] = [f"no data: {', '.join(d.what for d in parts)} in no seed of {', '.join(spec.arms)}"]
            continue
        for p, data in zip(spec.parts, parts):
            row["parts"].append({"spec": p, "data": data})
            pending.append((data, analyse_part(data, design)))
    results = iter(decide(pending, design))
    for row in out:
        if row["not_run"]:
            continue
        for part in row["parts"]:
            part["result"] = next(results)
        row["verdict"] = claim_verdict(row["rule"], [p["result"]["verdict"] for p in row["parts"]])
        row["n_pairs"] = min(p["result"]["n"] for p in row["parts"])
        row["cap"] = min(p["result"].get("cap") or design.cap for p in row["parts"])
    ran = [c for c in out if not c["not_run"]]
    plan = sequential_plan(ran, design)
    for c in ran:
        st = plan["status"][c["id"]]
        ended = sorted({a for a in c["arms"] if a in planned and planned[a] <= c["n_pairs"]})
        if not st.decided and ended and (st.arms or c["n_pairs"] < design.cap):
            # the sweep plans no further seed of an arm the claim pairs (its own cap, below the design's)
            st = Status(False, f"the sweep plans no more seeds of {', '.join(ended)} ({planned[ended[0]]}): "
                               f"stays underpowered")
        c["status"] = st
    return out


def planned_seeds(study: Study) -> dict:
    """``{arm: number of seeds the sweep plans}`` from sweep.json's runs (algorithm and grid cell:
    the arm follows `arms.arm_for`); {} when sweep.json lists no runs."""
    seeds: dict = {}
    for r in study.sweep_json.get("runs") or []:
        if not isinstance(r, dict) or not isinstance(r.get("algorithm"), str):
            continue
        config: dict = {}
        try:
            for key, value in (r.get("cell") or {}).items():
                set_dotted(config, str(key), value)
        except ConfigError:  # an edited sweep.json: a cell key through a value; the run is not counted
            continue
        seeds.setdefault(arm_for(r["algorithm"], config), set()).add(r.get("seed"))
    return {a: len(s) for a, s in seeds.items()}


def family(rows: list) -> tuple:
    """(claim ids in the Holm family, number of parts: Holm's divisor, one per part, whose two
    hypotheses exclude each other)."""
    ran = [c for c in rows if not c["not_run"]]
    return [c["id"] for c in ran], sum(len(c["parts"]) for c in ran)


def arms_to_extend(rows: list, design: Design) -> dict:
    """``{arm: seed count}`` the open claims ask for (each row's status from `claims`: a claim whose
    arms the sweep plans no more seeds of asks for none), the most any of them asks."""
    ran = [c for c in rows if not c["not_run"]]
    if not all("status" in c for c in ran):
        return sequential_plan(ran, design)["arms"]
    arms: dict = {}
    for c in ran:
        for a in c["status"].arms:
            arms[a] = max(arms.get(a, 0), max(c["n_pairs"] + 1, design.first_look))
    return dict(sorted(arms.items()))


# --------------------------------------------------------------------------- CSV and Markdown


def _g(x, spec: str = ".10g") -> str:
    """A number for a CSV: 10 significant digits (the same bytes on every machine for values
    that agree to 1e-10), '' for NaN / None."""
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return ""
    return format(x, spec)


def claims_csv_rows(rows: list) -> list:
    """One CSV row per part of each claim (a 'not run' claim: one row without numbers)."""
    out = []
    for c in rows:
        base = {"id": c["id"], "claim": c["claim"], "comparison": c["comparison"], "verdict": c["verdict"]}
        if c["not_run"]:
            said = "retired: " if c.get("retired") else "not run: "
            out.append({**base, "what": said + ", ".join(c["not_run"]), "n_pairs": 0})
            continue
        for p in c["parts"]:
            d, r = p["data"], p["result"]
            last = r["last"] or {}
            out.append({**base, "what": d.what, "unit": d.unit, "expected": expected_text(d.expected),
                        "sesoi": _g(d.sesoi), "n_pairs": r["n"], "seeds": " ".join(str(s) for s in d.seeds),
                        "per_seed": " ".join(_g(v, ".6g") for v in d.values), "mean_diff": _g(r["mean"]),
                        "boot_lo": _g(r["boot_lo"]), "boot_hi": _g(r["boot_hi"]), "boot_scheme": r["scheme"],
                        "n_problems": r["n_problems"], "t_lo": _g(r["t_lo"]), "t_hi": _g(r["t_hi"]),
                        "se": _g(last.get("se")), "var_problems": _g(last.get("var_problems")),
                        "p_diff": _g(last.get("p_diff")), "p_tost": _g(last.get("p_tost")),
                        "seq_p_diff": _g(r["seq_p_diff"]), "seq_p_tost": _g(r["seq_p_tost"]),
                        "holm_p_diff": _g(r["holm_p_diff"]), "holm_p_tost": _g(r["holm_p_tost"]),
                        "part_verdict": r["verdict"], "decided_at": r["decided_at"] or "",
                        "seeds_needed": r["seeds_needed"] or "", "status": c["status"].text, "note": r["note"]})
    return out


def expected_text(expected: int) -> str:
    """A part's prediction as the report writes it: ``> 0``, ``< 0``, or ``within ±SESOI`` (predicted equivalent)."""
    return "> 0" if expected > 0 else ("< 0" if expected < 0 else "within ±SESOI")


def _num(v: float, unit: str, sign: bool = True) -> str:
    if v is None or not np.isfinite(v):
        return "—"
    spec = ".2f" if unit == "points" else ".0f"
    return format(v, ("+" if sign else "") + spec)


def _p(v) -> str:
    return "—" if v is None or not np.isfinite(v) else (f"{v:.3g}" if v >= 1e-4 else "<1e-4")


def _needed(r: dict) -> str:
    if r["verdict"] != "underpowered":
        return "—"
    if r["n"] < 2:
        return "needs ≥ 2 seeds to estimate"
    return f"~{r['seeds_needed']}" if r["seeds_needed"] else f"> {1000} (the test set's size limits it)"


def amendments(study: Study) -> list:
    """The sweep file's ``report.amendments`` as recorded in sweep.json: dated changes to the design
    made after data came in ([] when none, or when sweep.json holds something else there)."""
    got = _report_key(study, "amendments")
    return [a for a in got if isinstance(a, str) and a.strip()] if isinstance(got, list) else []


def claims_markdown(rows: list, design: Design, amended: list = (), ignored: list = ()) -> list:
    """The claims section; ``ignored``: claim ids report.retired names that this family does not have."""
    ids, m = family(rows)
    verdicts, numbers, notes = [], [], []
    for c in rows:
        if c.get("aside"):
            notes.append(f"- claim {c['id']}: {c['aside']}")
        if c.get("retired"):
            verdicts.append([c["id"], c["claim"], c["comparison"], f"retired: {'; '.join(c['not_run'])}", 0, "—", "—"])
            continue
        if c["not_run"]:
            verdicts.append([c["id"], c["claim"], c["comparison"], f"not run ({', '.join(c['not_run'])})", 0, "—", "—"])
            continue
        dec = [p["result"]["decided_at"] for p in c["parts"] if p["result"]["decided_at"]]
        verdicts.append([c["id"], c["claim"], c["comparison"], f"**{c['verdict']}**", c["n_pairs"],
                         f"{max(dec)} seeds" if dec and c["verdict"] != "underpowered" else "—", c["status"].text])
        for p in c["parts"]:
            d, r = p["data"], p["result"]
            per = ", ".join(f"s{s}: {_num(v, d.unit)}" for s, v in zip(d.seeds, d.values)) or "—"
            scheme = {"crossed": f"seeds × {r['n_problems']} problems (crossed)",
                      "nested": f"seeds, problems within seeds ({r['n_problems']})", "seeds": "seeds only"}[r["scheme"]]
            numbers.append([c["id"], d.what, expected_text(d.expected), f"±{_num(d.sesoi, d.unit, False)}",
                            per, _num(r["mean"], d.unit), f"[{_num(r['boot_lo'], d.unit)}, {_num(r['boot_hi'], d.unit)}] "
                            f"({scheme})", f"[{_num(r['t_lo'], d.unit)}, {_num(r['t_hi'], d.unit)}]",
                            f"{_p(r['holm_p_diff'])} / {_p(r['holm_p_tost'])}", r["verdict"], _needed(r)])
            if r["note"]:
                notes.append(f"- claim {c['id']} {d.what}: {r['note']}")
        if c.get("note"):
            notes.append(f"- claim {c['id']}: {c['note']}")
    caps = sorted({c.get("cap") or design.cap for c in rows if not c["not_run"]} | {design.cap}, reverse=True)
    level_text = []
    for cap in caps:
        ns = list(range(design.first_look, cap + 1))
        if not ns:
            level_text.append(f"cap {cap}: below the first look, never tested")
            continue
        lv = nominal_levels([n / cap for n in ns], design.alpha, design.spending)
        level_text.append(f"cap {cap}: " + ", ".join(f"{n}: {v:.3g}" for n, v in zip(ns, lv)))
    looks = "; ".join(level_text)
    sesois = sorted({(c['id'], p['data'].sesoi, p['data'].unit) for c in rows if not c["not_run"] for p in c["parts"]})
    sesoi_text = "; ".join(f"claim {i}: ±{_num(s, u, False)} {u}" for i, s, u in sesois)
    plan = arms_to_extend(rows, design)
    extend = ", ".join(f"{arm_name(a)} to {n}" for a, n in plan.items()) or "none"
    by_rule: dict = {}
    for c in rows:
        if not c["not_run"]:
            by_rule.setdefault(c["rule"], []).append(c["id"])
    rules = [f"- claim{'s' if len(v) > 1 else ''} {', '.join(v)}: {RULES[k]}" for k, v in by_rule.items()]
    margins = margins_text(ids)
    return ["## Claims", "",
            f"Decision rules, stated before the data (docs/study.md): family-wise error rate α = {design.alpha} "
            f"(Holm) over the **family** of claims {', '.join(ids) or 'none'}: m = {m} parts (claims not run are "
            "outside it), each with a difference test and an equivalence test whose nulls (δ = 0, |δ| ≥ SESOI) cannot "
            "both be true, so Holm's step-down divides α by the parts that still hold an unrejected hypothesis, not by "
            f"the hypotheses (partitioning principle). **Smallest effects of interest (SESOI):** {sesoi_text or 'none'}"
            + (f"; the predictions and SESOIs were committed to docs/study.md before the runs that judge them: "
               f"{margins}" if margins else "") + ". "
            "**Tests:** Student t with n − 1 degrees of freedom on the per-seed differences, SE² = s²/n (seeds; it "
            "already holds the seed × problem residual) + σ̂²_b/P (the test set's problem main effect, from the seed × "
            "problem two-way analysis of variance when every seed scored the same P problems); the difference test "
            "is two-sided, the equivalence test is TOST within ±SESOI. **Looks:** the tests are made on the first n "
            f"paired seeds (by seed number) at every n from {design.first_look} to the part's cap: the seeds the "
            f"sweep plans for its arms, at most {design.cap}; {design.spending.replace('_', '-')}-type α spending "
            "(Lan-DeMets) with information fraction n / that cap, so the last planned look spends all of α; "
            f"two-sided nominal levels for α = {design.alpha} at n = {looks} (Holm's smaller levels follow the same "
            "spending); each hypothesis's looks give one sequential p-value, and Holm is applied to those. "
            "**Intervals shown:** the 95% t interval mean ± t·SE (the decision's SE), the 95% percentile interval of "
            f"the hierarchical bootstrap ({design.n_boot:,} resamples: seeds with replacement, then problems; crossed "
            f"when every seed scored the same problems; numpy default_rng seeded with ({design.seed}, crc32 of "
            "claim/part); it counts the seed × problem residual more than once, so it is wider: shown, not used to "
            "decide); per-seed values a − b.", "",
            *(["**Amendments to the design after data came in** (the sweep file's report.amendments; the rules above "
               "are the design as amended):", *[f"- {a}" for a in amended],
               "- (the report's rules since issue 49, 2026-11-29: each part's spending is measured against its arms' "
               "own cap, so levels an amendment quotes from a 10-seed plan are no longer the ones applied; the "
               "levels above are)", ""] if amended else []),
            table(["id", "claim", "comparison", "verdict", "seeds (pairs)", "decided at", "sequential design"],
                  verdicts, style="markdown"), "",
            table(["id", "part", "predicted", "SESOI", "per seed (a − b)", "mean", "95% bootstrap", "95% t (decision's SE)",
                   "Holm p: diff / TOST", "part verdict", "seeds needed (fixed design, 80% power)"],
                  numbers, style="markdown"), "",
            f"Seeds needed: the fewest seeds at which a fixed design would have 80% power at level α/m (Holm's "
            f"first step, m parts) for the observed mean and spread, for the difference test or, when |mean| < SESOI, the "
            f"equivalence test, whichever needs fewer (the test set's part of the variance does not shrink with "
            f"seeds). **Arms that need more seeds** (for the claims still open, up to the cap): {extend}.", "",
            *notes, *([""] if notes else []),
            *([f"report.retired names claim{'s' if len(ignored) > 1 else ''} {', '.join(ignored)}, not "
               f"{'claims' if len(ignored) > 1 else 'a claim'} of this study's family: ignored.", ""]
              if ignored else []),
            "Verdict rules:", *rules, ""]
