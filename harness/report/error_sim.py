"""Simulated error rates of the study's whole decision procedure (`decisions.analyse_part` +
`decisions.decide`: the SE with the test set's term, the looks and their spending, Holm over the
parts), on data drawn from the model the rules assume (docs/study.md, "Error rates").

Per part, S seeds x P problems, two arms a and b (or a run after RL and its start), each problem
a binary correct / wrong per seed: problem p has a level for each arm, ``L_ap, L_bp`` in
{``LO``, ``HI``} (the same level for both on most problems; on a share ``q`` of them one arm
solves it and the other does not, half each way: the problem main effect of the difference), the
arms' probabilities are ``L_ap + delta / 2 + u_as`` and ``L_bp - delta / 2 + u_bs`` with seed
effects ``u`` (normal, clipped symmetrically at ``U_CLIP``), and each seed scores each problem
once. The difference ``d_sp = y_asp - y_bsp`` has population mean ``delta`` exactly (every
effect is symmetric about 0), a seed effect, a problem effect and a residual: the crossed model
``d_sp = mu + a_s + b_p + e_sp`` of `stats.problem_variance`, with binary data. The memory part
(no problems) is normal per seed.

`STUDY_PARTS` mirrors the committed study (results/reference/deepseekmath_small): 10 seeds for
the core arms, 5 for the learned-PRM arms (their own cap), 1,000 problems, 300 for the pass@K /
maj@K parts; the spreads are of the study's size (per-seed SD about 1 point between arms; the
test set's term about 0.1-0.15 point between arms and about 0.5 for gains).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.report.decisions import Design, PartData, analyse_part, decide
from harness.report.sequential import nominal_levels

LO, HI = 0.03, 0.97
U_CLIP = 0.01


@dataclass(frozen=True)
class SimPart:
    name: str
    seeds: int            # seeds run (= the part's cap)
    problems: int         # 0: one normal value per seed (no problem level)
    q: float = 0.002      # share of problems one arm solves and the other not (the problem effect)
    sd_seed: float = 0.004  # seed effect per arm (probability scale); for problems = 0: the per-seed SD
    sesoi: float = 2.0    # points (or the unit of a problem-less part)


BETWEEN = dict(q=0.0025, sd_seed=0.004)
GAIN = dict(q=0.03, sd_seed=0.004)
STUDY_PARTS = (
    SimPart("1 acc", 10, 1000, **BETWEEN),
    SimPart("2 acc", 10, 1000, **BETWEEN),
    SimPart("3 maj@n", 10, 300, **GAIN),
    SimPart("3 pass@n", 10, 300, **GAIN),
    SimPart("3 valid_maj@n", 10, 300, **GAIN),
    SimPart("3 valid_pass@n", 10, 300, **GAIN),
    SimPart("4 acc", 5, 1000, **BETWEEN),
    SimPart("5 memory", 10, 0, sd_seed=20.0, sesoi=32.0),
    SimPart("6 ood acc", 10, 1000, **GAIN),
    SimPart("6 ood valid_acc", 10, 1000, **GAIN),
    SimPart("8 acc", 5, 1000, **BETWEEN),
)


def draw_part(spec: SimPart, delta: float, rng: np.random.Generator, key: str = "sim/0") -> PartData:
    """One part's data with true difference ``delta`` (points; the part's unit without problems)."""
    s, p = spec.seeds, spec.problems
    if p == 0:
        vals = delta + spec.sd_seed * rng.standard_normal(s)
        return PartData(spec.name, "MiB", 1, spec.sesoi, list(range(s)), [float(v) for v in vals], key=key, cap=s)
    cat = rng.random(p)
    same_hi = rng.random(p) < 0.5
    la = np.where(same_hi, HI, LO)
    lb = la.copy()
    a_better = cat < spec.q / 2
    b_better = (cat >= spec.q / 2) & (cat < spec.q)
    la[a_better], lb[a_better] = HI, LO
    la[b_better], lb[b_better] = LO, HI
    ua = np.clip(spec.sd_seed * rng.standard_normal(s), -U_CLIP, U_CLIP)
    ub = np.clip(spec.sd_seed * rng.standard_normal(s), -U_CLIP, U_CLIP)
    h = delta / 200.0
    ya = rng.random((s, p)) < (la[None, :] + h + ua[:, None])
    yb = rng.random((s, p)) < (lb[None, :] - h + ub[:, None])
    d = 100.0 * (ya.astype(np.int8) - yb.astype(np.int8)).astype(float)
    return PartData(spec.name, "points", 1, spec.sesoi, list(range(s)), [float(v) for v in d.mean(axis=1)],
                    problems=list(d), crossed=True, key=key, cap=s)


class TabulatedSequentialP:
    """`sequential.sequential_p` from a table: the looks' nominal levels at ``GRID`` overall levels
    (log-spaced, 1e-5 .. 1) per set of looks, computed once; the smallest rejecting level is found
    on the grid and interpolated in log-log between its two neighbours (the exact bisection costs
    about 0.5 s a hypothesis; a verdict can differ from the exact one only for a sequential p-value
    within that interpolation's error, about 1e-3 relative, of a Holm threshold). Below 1e-5: 1e-5
    (rejected at every Holm step of the study's families)."""
    GRID = np.geomspace(1e-5, 1.0, 81)

    def __init__(self):
        self.tables = {}

    def __call__(self, pvalues, fracs, kind="obrien_fleming", two_sided=True):
        key = (tuple(float(f) for f in fracs), kind, bool(two_sided))
        if key not in self.tables:
            lv = np.array([nominal_levels(key[0], a, kind, two_sided) for a in self.GRID])
            self.tables[key] = np.log(np.maximum(lv, 1e-300))
        tab = self.tables[key]
        ps = np.array([1.0 if (p is None or not np.isfinite(p)) else float(p) for p in pvalues])
        lp = np.log(np.maximum(ps, 1e-300))
        rej = (lp[None, :] <= tab).any(axis=1)
        if not rej.any():
            return 1.0
        i = int(np.argmax(rej))
        if i == 0:
            return float(self.GRID[0])
        g0, g1 = np.log(self.GRID[i - 1]), np.log(self.GRID[i])
        best = g1
        for k in np.nonzero(lp <= tab[i])[0]:
            lo, hi = tab[i - 1, k], tab[i, k]
            f = 0.0 if hi <= lo else min(1.0, max(0.0, (lp[k] - lo) / (hi - lo)))
            best = min(best, g0 + f * (g1 - g0))
        return float(np.exp(best))


SEQ_P = TabulatedSequentialP()


def run_once(specs, deltas, rng: np.random.Generator, design: Design, seq_p=None) -> list:
    """The verdicts of one simulated study (one per part, in order)."""
    parts = [draw_part(sp, dl, rng, key=f"sim/{i}") for i, (sp, dl) in enumerate(zip(specs, deltas))]
    res = decide([(pt, analyse_part(pt, design, seq_p or SEQ_P)) for pt in parts], design, needed=False)
    return [r["verdict"] for r in res]


def error_rates(specs, reps: int, seed: int = 0, design: Design | None = None) -> dict:
    """Family-wise and per-part error rates over ``reps`` simulated studies in two scenarios:

    - ``null`` (every true difference 0): a reproduced / contradicted verdict is a false positive;
    - ``boundary`` (every true difference at +SESOI or -SESOI, alternating by part): an equivalent
      verdict is a false equivalence.

    Returns ``{scenario: {"family": rate, "parts": [rate per part], "reps": reps}}``."""
    design = design or Design(n_boot=2)
    rng = np.random.default_rng(seed)
    out = {}
    for scen in ("null", "boundary"):
        deltas = [0.0] * len(specs) if scen == "null" else [sp.sesoi * (1 if i % 2 == 0 else -1)
                                                              for i, sp in enumerate(specs)]
        bad = ("reproduced", "contradicted") if scen == "null" else ("equivalent",)
        hits = np.zeros((reps, len(specs)), bool)
        for r in range(reps):
            hits[r] = [v in bad for v in run_once(specs, deltas, rng, design)]
        out[scen] = {"family": float(hits.any(axis=1).mean()), "parts": [float(x) for x in hits.mean(axis=0)],
                     "reps": reps}
    return out


def binomial_interval(rate: float, reps: int, z: float = 1.96) -> tuple:
    """Wilson score interval of a simulated rate."""
    den = 1 + z * z / reps
    mid = (rate + z * z / (2 * reps)) / den
    half = z * np.sqrt(rate * (1 - rate) / reps + z * z / (4 * reps * reps)) / den
    return float(mid - half), float(mid + half)
