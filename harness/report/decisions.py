"""Verdicts with known error rates for the study's claims: SESOI, t and TOST tests over seeds with the test set's sampling, looks, Holm, seeds needed.

A claim is one or more *parts*; a part is a paired difference ``arm_a - arm_b`` of one value
per seed (and, where the runs' evaluation records allow, per problem), with a predicted sign
and a smallest effect of interest (SESOI, ``Design.sesoi_points`` accuracy points unless the
claim states its own). The rules (docs/study.md):

- **standard error**: ``SE^2 = s^2 / n + V_problems``: ``s`` the standard deviation over seeds of
  the per-seed differences and ``V_problems`` the test set's problem main effect
  ``sigma_b^2 / P`` (`stats.problem_variance`: two-way analysis of variance of the seed x problem
  differences when every seed scored the same problems; 0 when seeds scored different problems,
  where s^2 / n already holds them). ``s^2 / n`` already holds the seed x problem residual, so it
  is counted once;
- **tests** (Student t, n - 1 degrees of freedom): ``diff``, two-sided, H0: no difference;
  ``tost``, H0: |difference| >= SESOI (Schuirmann's two one-sided tests);
- **looks** (`part_looks`): the tests are made on the first n paired seeds (by seed number)
  at every n from ``first_look`` to the part's cap: its arms' own (``PartData.cap``, the seeds
  the sweep plans for them), at most ``Design.cap``; the information fraction is n / that cap, so
  a part's last planned look spends all of alpha. Each hypothesis's p-values over the looks
  become one sequential p-value (`sequential.sequential_p`, Lan-DeMets spending,
  O'Brien-Fleming type by default). With one look at the cap it is a fixed design and the
  p-value is the test's;
- **Holm over the parts** at ``alpha`` (`stats.holm_parts`): the family is every part of every
  claim whose arms were run, each with its two hypotheses (diff and tost). The two cannot both be
  true (delta = 0 and |delta| >= SESOI exclude each other), so at most one true null per part:
  the step-down divides alpha by the number of parts that still hold an unrejected hypothesis,
  not by the number of hypotheses (partitioning principle; Shaffer 1986). The family-wise rate
  of declaring an effect or an equivalence that is not there is at most alpha (approximately:
  the t test is exact for normal per-seed differences; a wrong sign is covered for independent
  tests, Shaffer 1980);
- **verdict** of a part: ``reproduced`` / ``contradicted`` when its diff hypothesis is rejected,
  by the sign of the mean at the look that decided it; else ``equivalent`` when its tost
  hypothesis is rejected; else ``underpowered``, with the seeds a fixed design would need
  (`seeds_needed`) at the observed mean and spread.

The intervals shown beside (`analyse_part`): the hierarchical bootstrap's percentile interval
(``Design.n_boot`` resamples from a seeded generator: the same data give the same bytes) and the
t interval over seeds; the per-seed values.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from scipy.stats import t as student_t

from harness.report.limits import DESIGN_FIRST_LOOK
from harness.report.sequential import SPENDING, nominal_levels, sequential_p
from harness.report.stats import (hierarchical_bootstrap, holm_parts, mean_ci, percentile_interval, problem_variance,
                                  t_pvalues)

VERDICTS = ("reproduced", "contradicted", "equivalent", "underpowered")
N_MAX = 1000
"""Largest seed count `seeds_needed` searches."""


@dataclass(frozen=True)
class Design:
    """The pre-stated decision rules of a study report (docs/study.md)."""
    alpha: float = 0.05
    """Family-wise error rate over every verdict of the report (Holm)."""
    sesoi_points: float = 2.0
    """Smallest effect of interest of an accuracy part, in accuracy points."""
    sesoi: tuple = ()
    """Per-claim overrides: ``(("1", 3.0), ...)``, claim id -> SESOI in the part's unit."""
    first_look: int = DESIGN_FIRST_LOOK
    """Seeds at the first look (the tests are made at every seed count from here to ``cap``)."""
    cap: int = 10
    """Seeds at the last look: a claim still undecided there stays underpowered."""
    spending: str = "obrien_fleming"
    """Alpha spending over the looks: obrien_fleming or pocock (Lan-DeMets types)."""
    power: float = 0.8
    """Power at which `seeds_needed` counts seeds."""
    n_boot: int = 10_000
    """Hierarchical bootstrap resamples for the percentile intervals."""
    seed: int = 0
    """Seed of the bootstrap's generator (with the claim and part: one stream each)."""
    level: float = 0.95
    """Level of the intervals shown."""

    def __post_init__(self):
        if self.spending not in SPENDING:
            raise ValueError(f"spending must be one of {SPENDING}, got {self.spending!r}")
        if not 2 <= self.first_look <= self.cap:
            raise ValueError(f"need 2 <= first_look <= cap, got {self.first_look}, {self.cap}")

    @property
    def looks(self) -> tuple:
        return tuple(range(self.first_look, self.cap + 1))

    @property
    def sequential(self) -> bool:
        return self.first_look < self.cap

    def sesoi_for(self, claim_id: str, default: Optional[float] = None) -> float:
        return float(dict(self.sesoi).get(claim_id, self.sesoi_points if default is None else default))


@dataclass
class PartData:
    """One paired difference of a claim, per seed (and per problem when records allow)."""
    what: str
    unit: str
    expected: int                     # +1: a - b > 0 predicted; -1: a - b < 0; 0: no difference (equivalent)
    sesoi: float
    seeds: list                       # paired seeds, ascending
    values: list                      # per-seed difference a - b (summary values, in the unit)
    problems: Optional[list] = None   # per seed: the aligned per-problem differences (in the unit)
    crossed: bool = False             # every seed scored the same problems, in the same order
    cap: Optional[int] = None         # the seeds the sweep plans for the part's arms (None: Design.cap)
    note: str = ""                    # why problems are not resampled, when they are not
    key: str = ""                     # "<claim id>/<part index>": the bootstrap's stream


def part_cap(part: PartData, design: Design) -> int:
    """The part's last look: its arms' own cap (the seeds the sweep plans for them), at most the
    design's."""
    return min(design.cap, int(part.cap)) if part.cap else design.cap


def part_looks(part: PartData, design: Design) -> tuple:
    """The seed counts at which the part is looked at: ``first_look`` .. its cap."""
    return tuple(range(design.first_look, part_cap(part, design) + 1))


def _var_problems(part: PartData, n: int) -> tuple:
    """(the test set's problem main effect's variance on the first n seeds, scheme)."""
    if not part.problems:
        return 0.0, "seeds"
    v = problem_variance(part.problems[:n], crossed=part.crossed)
    return v["var"], v["scheme"]


def look_stats(part: PartData, n: int) -> dict:
    """Mean, seed SD, SE and the two p-values on the first ``n`` paired seeds."""
    vals = np.asarray(part.values[:n], float)
    mean = float(vals.mean())
    sd = float(vals.std(ddof=1)) if n > 1 else float("nan")
    vp, scheme = _var_problems(part, n)
    se = math.sqrt(sd * sd / n + vp) if n > 1 else float("nan")
    p = t_pvalues(mean, se, n - 1, part.sesoi)
    return {"n": n, "mean": mean, "sd": sd, "var_problems": vp, "se": se, "scheme": scheme,
            "p_diff": p["diff"], "p_tost": p["tost"]}


def seeds_needed(mean: float, sd: float, var_problems: float, sesoi: float, a: float, power: float = 0.8,
                 n_max: int = N_MAX) -> Optional[int]:
    """Seeds a fixed design would need for power ``power`` at two-sided level ``a`` (difference
    test, true effect = ``mean``) or at level ``a`` per side (TOST within ``sesoi``, when
    |mean| < sesoi), whichever needs fewer: the smallest n in [2, n_max] with
    ``1 - F_{n-1}(q_{n-1} - d / SE(n)) >= power``, ``SE(n)^2 = sd^2 / n + var_problems`` (the test
    set's part does not shrink with seeds), ``d`` = |mean| (q the 1 - a/2 quantile) or
    sesoi - |mean| (q the 1 - a quantile). None when neither is reached by n_max."""
    if not (np.isfinite(mean) and np.isfinite(sd)):
        return None
    n = np.arange(2, n_max + 1)
    se = np.sqrt(sd * sd / n + max(var_problems, 0.0))
    best = None
    for d, q in ((abs(mean), 1 - a / 2), (sesoi - abs(mean), 1 - a)):
        if d <= 0:
            continue
        with np.errstate(divide="ignore"):
            z = np.where(se > 0, d / np.where(se > 0, se, 1.0), np.inf)
        pw = student_t.sf(student_t.ppf(q, n - 1) - z, n - 1)
        ok = np.nonzero(pw >= power)[0]
        if ok.size:
            best = int(n[ok[0]]) if best is None else min(best, int(n[ok[0]]))
    return best


def analyse_part(part: PartData, design: Design, seq_p=sequential_p) -> dict:
    """Everything the report shows of one part: per-seed values, mean, the t interval (the
    decision's: mean +- t_{n-1} SE, SE with the test set's term), the hierarchical bootstrap's
    percentile interval, the looks' p-values and the sequential p-values (before Holm).
    ``seq_p``: how a hypothesis's looks become one p-value (`sequential.sequential_p`; the error
    simulation passes a tabulated one, `error_sim.TabulatedSequentialP`)."""
    n = len(part.values)
    mean, half, _ = mean_ci(part.values, design.level)
    out = {"n": n, "mean": mean, "t_lo": mean - half, "t_hi": mean + half, "boot_lo": float("nan"),
           "boot_hi": float("nan"), "scheme": "seeds" if not part.problems else ("crossed" if part.crossed else "nested"),
           "n_problems": len(part.problems[0]) if part.problems else 0, "looks": [], "seq_p_diff": float("nan"),
           "seq_p_tost": float("nan"), "last": None}
    if n == 0:
        return out
    rng = np.random.default_rng([design.seed, zlib.crc32(part.key.encode())])
    draws = hierarchical_bootstrap(part.problems if part.problems else part.values, design.n_boot, rng,
                                   crossed=part.crossed if part.problems else None)
    out["boot_lo"], out["boot_hi"] = percentile_interval(draws, design.level)
    out["last"] = look_stats(part, n)
    if n > 1 and np.isfinite(out["last"]["se"]):
        half = student_t.ppf(0.5 + design.level / 2.0, n - 1) * out["last"]["se"]
        out["t_lo"], out["t_hi"] = mean - half, mean + half
    cap = part_cap(part, design)
    looks = [look_stats(part, k) for k in part_looks(part, design) if k <= n]
    out["looks"] = looks
    out["cap"] = cap
    if looks:
        fr = [lk["n"] / cap for lk in looks]
        out["seq_p_diff"] = seq_p([lk["p_diff"] for lk in looks], fr, design.spending, True)
        out["seq_p_tost"] = seq_p([lk["p_tost"] for lk in looks], fr, design.spending, False)
    return out


def _decided_at(looks: list, key: str, level: float, design: Design, two_sided: bool, cap: int) -> Optional[dict]:
    """The first look whose p-value is below its nominal level for overall ``level``."""
    fr = [lk["n"] / cap for lk in looks]
    lv = nominal_levels(fr, level, design.spending, two_sided)
    return next((lk for lk, v in zip(looks, lv) if lk[key] <= v), None)


def decide(parts: list, design: Design, needed: bool = True) -> list:
    """Holm over the parts (`stats.holm_parts`: each part's two hypotheses exclude each other, so
    the step-down divides alpha by the parts still open); each part's result gets
    ``holm_p_diff``, ``holm_p_tost``, ``verdict``, ``decided_at`` (seeds), ``note`` and
    ``seeds_needed`` (None throughout with ``needed=False``: the error simulation's shortcut).
    ``parts``: ``(PartData, analyse_part result)`` pairs; returns the results."""
    adj, steps = holm_parts([(r["seq_p_diff"], r["seq_p_tost"]) for _, r in parts])
    m = len(parts)
    out = []
    for k, (part, r) in enumerate(parts):
        r = dict(r)
        cap = r.get("cap") or part_cap(part, design)
        (r["holm_p_diff"], r["holm_p_tost"]), (t_diff, t_tost) = adj[k], steps[k]
        r["verdict"], r["decided_at"], r["note"] = "underpowered", None, part.note
        diff = r["holm_p_diff"] <= design.alpha and r["looks"]
        tost = r["holm_p_tost"] <= design.alpha and r["looks"]
        if diff:
            lk = _decided_at(r["looks"], "p_diff", design.alpha / t_diff, design, True, cap)
            lk = lk or r["looks"][-1]
            r["verdict"] = "reproduced" if np.sign(lk["mean"]) == part.expected else "contradicted"
            r["decided_at"] = lk["n"]
            if tost:
                r["note"] = "; ".join(x for x in (r["note"], f"also within ±{part.sesoi:g} {part.unit}") if x)
        elif tost:
            lk = _decided_at(r["looks"], "p_tost", design.alpha / t_tost, design, False, cap) or r["looks"][-1]
            r["verdict"], r["decided_at"] = "equivalent", lk["n"]
        if r["n"] > cap:
            beyond = " ".join(str(x) for x in part.seeds[cap:])
            r["note"] = "; ".join(x for x in (r["note"], f"seeds beyond the cap ({beyond}) are shown, not used to decide") if x)
        last = r["last"]
        r["seeds_needed"] = None
        if needed and r["verdict"] == "underpowered" and last is not None and last["n"] > 1:
            r["seeds_needed"] = seeds_needed(last["mean"], last["sd"], last["var_problems"], part.sesoi,
                                             design.alpha / max(m, 1), design.power)
        out.append(r)
    return out


def claim_verdict(rule: str, verdicts: list) -> str:
    """A claim's verdict from its parts' (in order). ``simple``: the one part's. ``maj_pass``
    ("RL lifts Maj@K but not Pass@K": part 1 maj@K gain, predicted > 0; part 2 pass@K gain,
    predicted < 0): reproduced when maj is reproduced and pass is reproduced (below 0) or
    equivalent; contradicted when pass is contradicted (a lift), or maj is contradicted or
    equivalent (no lift); otherwise underpowered; further parts (claim 3's valid-step metrics) are
    tested and shown beside, not decisive. ``first_part`` (claim 6 with its valid-step
    part): the first part's; the others are reported beside it. ``equivalence`` (one part predicted 0):
    reproduced when the part is equivalent, contradicted when its difference test rejects, else underpowered."""
    if rule in ("simple", "first_part"):   # first_part: later parts are tested and shown, not decisive
        return verdicts[0]
    if rule == "equivalence":   # the one part predicts no difference: its "equivalent" reproduces the claim
        return {"equivalent": "reproduced", "contradicted": "contradicted", "reproduced": "contradicted"}.get(
            verdicts[0], "underpowered")
    if rule == "maj_pass":   # parts beyond the first two (the valid-step ones) are shown beside, not decisive
        maj, pas = verdicts[:2]
        if pas == "contradicted" or maj in ("contradicted", "equivalent"):
            return "contradicted"
        if maj == "reproduced" and pas in ("reproduced", "equivalent"):
            return "reproduced"
        return "underpowered"
    raise ValueError(f"unknown rule {rule!r}")


@dataclass
class Status:
    """Where a claim stands in the sequential design."""
    decided: bool
    text: str
    arms: list = field(default_factory=list)   # arms that need more seeds


def sequential_status(verdict: str, n_pairs: int, arms: list, design: Design, cap: Optional[int] = None) -> Status:
    """Decided (a verdict other than underpowered: stop adding seeds for this claim), or
    continue (the arms need a seed more: the next look is at ``n_pairs + 1`` seeds, or the first
    look), or the cap is reached (the claim's own ``cap``, else the design's: it stays
    underpowered)."""
    cap = design.cap if cap is None else min(design.cap, cap)
    if verdict != "underpowered":
        return Status(True, "decided: stop")
    if n_pairs >= cap:
        return Status(False, f"cap of {cap} seeds reached: stays underpowered")
    nxt = max(n_pairs + 1, design.first_look)
    return Status(False, f"continue: next look at {nxt} seeds (cap {cap})", list(arms))


def sequential_plan(claims: list, design: Design) -> dict:
    """Given the claims' current data (``{"id", "verdict", "n_pairs", "arms"}`` each), which
    are decided and which need more seeds: ``{"status": {id: Status}, "arms": {arm: next seed
    count}}`` (an arm listed under several undecided claims needs the most any of them asks)."""
    status, arms = {}, {}
    for c in claims:
        st = sequential_status(c["verdict"], c["n_pairs"], c["arms"], design, c.get("cap"))
        status[c["id"]] = st
        for a in st.arms:
            arms[a] = max(arms.get(a, 0), max(c["n_pairs"] + 1, design.first_look))
    return {"status": status, "arms": dict(sorted(arms.items()))}
