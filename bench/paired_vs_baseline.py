"""Each arm of a sweep minus a baseline arm, paired by seed, with the test set's own variance term.

`harness report` pairs arms by seed with a t-interval over the per-seed differences (the seed spread only). The study
report adds the term of the fixed test set, sigma_b^2 / P (the problem main effect of the seed x problem
differences, `harness.report.stats.problem_variance`). This script gives a plain sweep's arms that interval: for
every arm and seed the final evaluation's per-problem greedy correctness (the report's own reader,
`harness.report.problems.problem_values`: the last evaluation row's records on the test split, checked against the
run's summary) minus the baseline's on the same seed, then the study's own standard error
(`harness.report.decisions.look_stats`)

    SE^2 = s^2 / n (per-seed mean differences) + sigma_b^2 / P,  half-width = t_{0.975, n-1} * SE,

and the same with the level split over the arms compared (Bonferroni). Prints one row per arm, in points.

An arm is the algorithm by default; ``--arm KEY`` (repeatable: a config path, read with the defaults filled in) makes
it the values of those keys instead, written ``key=value,key=value`` as ``--baseline`` must name it; ``--where
KEY=VALUE`` (repeatable) keeps only the runs with that value (the corrections at one staleness, say).

    python bench/paired_vs_baseline.py results/reference/objectives --baseline grpo
    python bench/paired_vs_baseline.py results/reference/offpolicy --arm train.staleness --arm algorithm.correction \
        --baseline train.staleness=0,algorithm.correction=none
    python bench/paired_vs_baseline.py results/reference/offpolicy --where train.staleness=8 \
        --arm algorithm.correction --baseline algorithm.correction=none
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.config.schema import settings  # noqa: E402
from harness.report.decisions import PartData, look_stats  # noqa: E402
from harness.report.problems import problem_values  # noqa: E402
from harness.report.stats import t_quantile  # noqa: E402
from harness.rundir.read import find_run_dirs, load_run  # noqa: E402


def arm_of(run, keys: list[str]) -> str:
    """The run's arm: its algorithm, or ``key=value,...`` of ``keys`` in its config with the defaults filled in."""
    if not keys:
        return run.algorithm
    return ",".join(f"{k}={config_value(run.config, k)}" for k in keys)


def config_value(config: dict, key: str):
    """``key`` (``train.staleness``) of a run's config (a mapping, as config.yaml), read as the report reads it
    (`harness.config.schema.settings`): its default where the file left it out, ``algorithm.*`` with the preset's
    values filled in."""
    flat = settings(config)
    if key not in flat:
        raise SystemExit(f"paired_vs_baseline: {key}: a run config has no field {key.split('.')[-1]!r} there")
    return flat[key]


def runs_by_arm(root: Path, task: str, keys: list[str], where: tuple = ()) -> tuple[dict[str, dict[int, dict]],
                                                                                    list[str]]:
    """{arm: {seed: {problem id: final greedy correctness}}} of the finished runs under ``root`` whose config has
    every ``(key, value text)`` of ``where``, and why any other finished-or-not run was left out."""
    out: dict[str, dict[int, dict]] = {}
    skipped = []
    for d in find_run_dirs(root):
        run = load_run(d)
        if run.status != "finished" or run.seed is None:
            skipped.append(f"{run.run_id}: {run.status}" + (f" ({run.error})" if run.error else ""))
            continue
        if where:
            if any(str(config_value(run.config, k)) != v for k, v in where):
                continue
        values, why = problem_values(run, task, "acc", "final")
        if values is None:
            skipped.append(why)
            continue
        arm = arm_of(run, keys)
        if run.seed in out.setdefault(arm, {}):
            raise SystemExit(f"paired_vs_baseline: two finished runs of arm {arm} seed {run.seed} under {root}")
        out[arm][run.seed] = values
    return out, skipped


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", help="a folder of run folders (a sweep's, or its export)")
    p.add_argument("--baseline", required=True, help="the arm every other arm is compared with")
    p.add_argument("--arm", action="append", default=[], metavar="KEY",
                   help="a config key whose value tells the arms apart (repeatable; default: the algorithm)")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="keep only runs whose config has this value (repeatable), e.g. train.staleness=8")
    p.add_argument("--task", default="arith")
    p.add_argument("--level", type=float, default=0.95)
    a = p.parse_args(argv)
    if not Path(a.runs).is_dir():
        p.error(f"no such directory: {a.runs}")
    bad = [w for w in a.where if "=" not in w]
    if bad:
        p.error(f"--where {bad[0]!r}: give KEY=VALUE")
    where = tuple(tuple(w.split("=", 1)) for w in a.where)
    arms, skipped = runs_by_arm(Path(a.runs), a.task, a.arm, where)
    for why in skipped:
        print(f"paired_vs_baseline: left out: {why}", file=sys.stderr)
    if a.baseline not in arms:
        p.error(f"--baseline {a.baseline!r}: no finished run of it in {a.runs} (arms: {', '.join(sorted(arms))})")
    base = arms[a.baseline]
    others = [k for k in sorted(arms) if k != a.baseline]
    width = max([16] + [len(k) for k in others])
    alpha = 1 - a.level
    print(f"{'arm':<{width}} {'seeds':>5} {'per-seed (points)':<26} {'mean':>6} {'seed SE':>8} {'test-set SE':>11} "
          f"{f'{a.level:.0%} CI':>14} {f'Bonferroni x{len(others)}':>16}")
    for arm in others:
        seeds = sorted(set(arms[arm]) & set(base))
        diffs = []
        for s in seeds:
            rec = arms[arm][s]
            ids = sorted(base[s])
            if sorted(rec) != ids:
                p.error(f"{arm} seed {s} was scored on other problems than {a.baseline} seed {s}")
            diffs.append(np.array([100 * (rec[i] - base[s][i]) for i in ids]))
        n = len(diffs)
        if not n:
            print(f"{arm:<{width}} {0:>5} no seed in common with the baseline")
            continue
        means = [float(d.mean()) for d in diffs]
        st = look_stats(PartData(what=f"{arm} - {a.baseline}", unit="points", expected=0, sesoi=0.0, seeds=seeds,
                                 values=means, problems=diffs, crossed=True), n)
        se = st["se"]
        half = t_quantile(1 - alpha / 2, n - 1) * se if n > 1 else float("nan")
        half_b = t_quantile(1 - alpha / (2 * len(others)), n - 1) * se if n > 1 else float("nan")
        per = ", ".join(f"{m:+.1f}" for m in means)
        print(f"{arm:<{width}} {n:>5} {per:<26} {st['mean']:>+6.2f} {st['sd'] / np.sqrt(n):>8.2f} "
              f"{np.sqrt(st['var_problems']):>11.2f} "
              f"{f'± {half:.2f}':>14} {f'± {half_b:.2f}':>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
