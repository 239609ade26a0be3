"""Simulated error rates of the study's decision rules (issue 49, item 1), with more repetitions
than tests/harness/report/test_study_error_rates.py: prints each rate with its 95% Wilson
interval and the seconds taken.

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/study_error_rates.py [--reps 300] [--single 4000]

- whole procedure (`harness.report.error_sim.STUDY_PARTS`: the study's 11 parts, 10 seeds or 5 for
  the learned-PRM arms, 1,000 problems or 300 for maj@K / pass@K; looks from 3 seeds to each
  part's own cap with O'Brien-Fleming spending; Holm over the parts): the family-wise rate of a
  false reproduced / contradicted with every true difference 0, and of a false equivalent with
  every true difference at +-SESOI, and per part;
- one part, one look, no Holm: the two-sided t test's rejection rate at 0.05 under the null and
  the TOST's at the boundary, between arms (claim 2's regime) and for gains (claims 3 and 6),
  with the SE the rules use and with the old one (s^2/n plus the crossed bootstrap's problem part).

No torch: this script needs only numpy and scipy (it does not import bench/_common).
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

from harness.report.decisions import Design, look_stats
from harness.report.error_sim import BETWEEN, GAIN, STUDY_PARTS, SimPart, binomial_interval, draw_part, error_rates
from harness.report.stats import bootstrap_variance, t_pvalues

ALPHA = 0.05


def _fmt(rate: float, reps: int) -> str:
    lo, hi = binomial_interval(rate, reps)
    return f"{rate:.4f} [{lo:.4f}, {hi:.4f}]"


def single(spec: SimPart, reps: int, rng) -> dict:
    new_null = old_null = new_eq = 0
    for _ in range(reps):
        part = draw_part(spec, 0.0, rng)
        lk = look_stats(part, spec.seeds)
        new_null += lk["p_diff"] <= ALPHA
        old_vp = bootstrap_variance(part.problems, crossed=True)["problems"]
        old_se = math.sqrt(lk["sd"] ** 2 / spec.seeds + old_vp)
        old_null += t_pvalues(lk["mean"], old_se, spec.seeds - 1, spec.sesoi)["diff"] <= ALPHA
        part = draw_part(spec, spec.sesoi, rng)
        new_eq += look_stats(part, spec.seeds)["p_tost"] <= ALPHA
    return {"null": new_null / reps, "old_null": old_null / reps, "boundary": new_eq / reps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=300, help="simulated studies per scenario (whole procedure)")
    ap.add_argument("--single", type=int, default=4000, help="simulated parts per setting (one look, no Holm)")
    ap.add_argument("--seed", type=int, default=2049)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    print(f"one part, one look, no Holm, alpha = {ALPHA} ({args.single} reps each; 95% Wilson intervals)")
    for spec in (SimPart("between arms, 10 seeds x 1000", 10, 1000, **BETWEEN),
                 SimPart("between arms, 5 seeds x 1000", 5, 1000, **BETWEEN),
                 SimPart("gain, 10 seeds x 300", 10, 300, **GAIN),
                 SimPart("gain, 10 seeds x 1000", 10, 1000, **GAIN)):
        t = time.perf_counter()
        r = single(spec, args.single, rng)
        print(f"  {spec.name}: diff test under the null {_fmt(r['null'], args.single)} "
              f"(old SE: {_fmt(r['old_null'], args.single)}); TOST at +SESOI {_fmt(r['boundary'], args.single)} "
              f"[{time.perf_counter() - t:.0f} s, loaded machine]")

    t = time.perf_counter()
    rates = error_rates(STUDY_PARTS, args.reps, seed=args.seed, design=Design(n_boot=2))
    took = time.perf_counter() - t
    print(f"\nwhole procedure at the study's design ({args.reps} simulated studies per scenario; "
          f"{took:.0f} s, loaded machine)")
    for scen, what in (("null", "false reproduced/contradicted, every difference 0"),
                       ("boundary", "false equivalent, every difference at +-SESOI")):
        r = rates[scen]
        print(f"  {what}: family-wise {_fmt(r['family'], args.reps)}")
        print("    per part: " + ", ".join(f"{sp.name} {x:.3f}" for sp, x in zip(STUDY_PARTS, r["parts"])))


if __name__ == "__main__":
    main()
