"""Verdicts with known error rates for the study's claims: SESOI, t and TOST tests over seeds with the test set's sampling, looks, Holm, seeds needed.

A claim is one or more *parts*; a part is a paired difference ``arm_a - arm_b`` of one value
per seed (and, where the runs' evaluation records allow, per problem), with a predicted sign
and a smallest effect of interest (SESOI, ``Design.sesoi_points`` accuracy points unless the
claim states its own). The rules (docs/study.md):

- **standard error**: ``SE^2 = s^2 / n + V_problems``: ``s`` the standard deviation over seeds of
  the per-seed differences (the t interval's) and ``V_problems`` the problem part of the
  hierarchical bootstrap's variance (`stats.bootstrap_variance`: seeds, then problems; crossed
  when every seed scored the same problems), so the finite test set counts;
- **tests** (Student t, n - 1 degrees of freedom): ``diff``, two-sided, H0: no difference;
  ``tost``, H0: |difference| >= SESOI (Schuirmann's two one-sided tests);
- **looks** (`Design.looks`): the tests are made on the first n paired seeds (by seed number)
  at every n from ``first_look`` to ``cap``; each hypothesis's p-values over the looks become
  one sequential p-value (`sequential.sequential_p`, Lan-DeMets spending, O'Brien-Fleming type
  by default). With ``first_look == cap`` it is a fixed design and the p-value is the test's;
- **Holm** at ``alpha`` over the family: both hypotheses (diff and tost) of every part of every
  claim whose arms were run. At most one of a part's two hypotheses is true, and Holm controls
  the family-wise error rate under any dependence, so the chance that the report declares an
  effect or an equivalence that is not there is at most alpha (approximately: the t test is
  exact for normal per-seed differences, the problem part is a bootstrap estimate; a wrong sign
  is covered for independent tests, Shaffer 1980);
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

from harness.report.sequential import SPENDING, nominal_levels, sequential_p
from harness.report.stats import (bootstrap_variance, hierarchical_bootstrap, holm, mean_ci, percentile_interval,
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
    first_look: int = 3
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
    expected: int                     # +1: a - b > 0 predicted; -1: a - b < 0
    sesoi: float
    seeds: list                       # paired seeds, ascending
    values: list                      # per-seed difference a - b (summary values, in the unit)
    problems: Optional[list] = None   # per seed: the aligned per-problem differences (in the unit)
    crossed: bool = False             # every seed scored the same problems, in the same order
    note: str = ""                    # why problems are not resampled, when they are not
    key: str = ""                     # "<claim id>/<part index>": the bootstrap's stream


def _var_problems(part: PartData, n: int) -> tuple:
    """(problem part of the bootstrap variance on the first n seeds, scheme)."""
    if not part.problems:
        return 0.0, "seeds"
    v = bootstrap_variance(part.problems[:n], crossed=part.crossed)
    return v["problems"], v["scheme"]


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


def analyse_part(part: PartData, design: Design) -> dict:
    """Everything the report shows of one part: per-seed values, mean, the t interval, the
    hierarchical bootstrap's percentile interval, the looks' p-values and the sequential
    p-values (before Holm)."""
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
    looks = [look_stats(part, k) for k in design.looks if k <= n]
    out["looks"] = looks
    if looks:
        fr = [lk["n"] / design.cap for lk in looks]
        out["seq_p_diff"] = sequential_p([lk["p_diff"] for lk in looks], fr, design.spending, True)
        out["seq_p_tost"] = sequential_p([lk["p_tost"] for lk in looks], fr, design.spending, False)
    return out


def _decided_at(looks: list, key: str, level: float, design: Design, two_sided: bool) -> Optional[dict]:
    """The first look whose p-value is below its nominal level for overall ``level``."""
    fr = [lk["n"] / design.cap for lk in looks]
    lv = nominal_levels(fr, level, design.spending, two_sided) if design.sequential else [level] * len(looks)
    return next((lk for lk, v in zip(looks, lv) if lk[key] <= v), None)


def decide(parts: list, design: Design) -> list:
    """Holm over the family of every part's two hypotheses; each part's result gets
    ``holm_p_diff``, ``holm_p_tost``, ``verdict``, ``decided_at`` (seeds), ``note`` and
    ``seeds_needed``. ``parts``: ``(PartData, analyse_part result)`` pairs; returns the results."""
    ps = [p for _, r in parts for p in (r["seq_p_diff"], r["seq_p_tost"])]
    adj = holm(ps)
    m = len(ps)
    order = sorted(range(m), key=lambda i: (1.0 if not np.isfinite(ps[i]) else ps[i], i))
    step_level = {i: design.alpha / (m - j) for j, i in enumerate(order)}
    out = []
    for k, (part, r) in enumerate(parts):
        r = dict(r)
        r["holm_p_diff"], r["holm_p_tost"] = adj[2 * k], adj[2 * k + 1]
        r["verdict"], r["decided_at"], r["note"] = "underpowered", None, part.note
        diff = r["holm_p_diff"] <= design.alpha and r["looks"]
        tost = r["holm_p_tost"] <= design.alpha and r["looks"]
        if diff:
            lk = _decided_at(r["looks"], "p_diff", step_level[2 * k], design, True)
            lk = lk or r["looks"][-1]
            r["verdict"] = "reproduced" if np.sign(lk["mean"]) == part.expected else "contradicted"
            r["decided_at"] = lk["n"]
            if tost:
                r["note"] = "; ".join(x for x in (r["note"], f"also within ±{part.sesoi:g} {part.unit}") if x)
        elif tost:
            lk = _decided_at(r["looks"], "p_tost", step_level[2 * k + 1], design, False) or r["looks"][-1]
            r["verdict"], r["decided_at"] = "equivalent", lk["n"]
        if r["n"] > design.cap:
            beyond = " ".join(str(x) for x in part.seeds[design.cap:])
            r["note"] = "; ".join(x for x in (r["note"], f"seeds beyond the cap ({beyond}) are shown, not used to decide") if x)
        last = r["last"]
        r["seeds_needed"] = None
        if r["verdict"] == "underpowered" and last is not None and last["n"] > 1:
            r["seeds_needed"] = seeds_needed(last["mean"], last["sd"], last["var_problems"], part.sesoi,
                                             design.alpha / max(m, 1), design.power)
        out.append(r)
    return out


def claim_verdict(rule: str, verdicts: list) -> str:
    """A claim's verdict from its parts' (in order). ``simple``: the one part's. ``maj_pass``
    ("RL lifts Maj@K but not Pass@K": part 1 maj@K gain, predicted > 0; part 2 pass@K gain,
    predicted < 0): reproduced when maj is reproduced and pass is reproduced (below 0) or
    equivalent; contradicted when pass is contradicted (a lift), or maj is contradicted or
    equivalent (no lift); otherwise underpowered. ``first_part`` (claim 6 with its valid-step
    part): the first part's; the others are reported beside it."""
    if rule in ("simple", "first_part"):   # first_part: later parts are tested and shown, not decisive
        return verdicts[0]
    if rule == "maj_pass":
        maj, pas = verdicts
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


def sequential_status(verdict: str, n_pairs: int, arms: list, design: Design) -> Status:
    """Decided (a verdict other than underpowered: stop adding seeds for this claim), or
    continue (the arms need a seed more: the next look is at ``n_pairs + 1`` seeds, or the first
    look), or the cap is reached (the claim stays underpowered)."""
    if verdict != "underpowered":
        return Status(True, "decided: stop")
    if n_pairs >= design.cap:
        return Status(False, f"cap of {design.cap} seeds reached: stays underpowered")
    nxt = max(n_pairs + 1, design.first_look)
    return Status(False, f"continue: next look at {nxt} seeds (cap {design.cap})", list(arms))


def sequential_plan(claims: list, design: Design) -> dict:
    """Given the claims' current data (``{"id", "verdict", "n_pairs", "arms"}`` each), which
    are decided and which need more seeds: ``{"status": {id: Status}, "arms": {arm: next seed
    count}}`` (an arm listed under several undecided claims needs the most any of them asks)."""
    status, arms = {}, {}
    for c in claims:
        st = sequential_status(c["verdict"], c["n_pairs"], c["arms"], design)
        status[c["id"]] = st
        for a in st.arms:
            arms[a] = max(arms.get(a, 0), max(c["n_pairs"] + 1, design.first_look))
    return {"status": status, "arms": dict(sorted(arms.items()))}
