"""Each arm of a sweep minus a baseline arm, paired by seed, with the test set's own variance term.

`harness report` pairs arms by seed with a t-interval over the per-seed differences (the seed spread only). The study
report adds the term of the fixed test set, sigma_b^2 / P (the problem main effect of the seed x problem
differences, `harness.report.stats.problem_variance`). This script gives a plain sweep's arms that interval: for
every arm and seed the final evaluation's per-problem greedy correctness (eval/<task>_<step>.jsonl, the test split,
the same problems in every run) minus the baseline's on the same seed, then the study's own standard error
(`harness.report.decisions.look_stats`)

    SE^2 = s^2 / n (per-seed mean differences) + sigma_b^2 / P,  half-width = t_{0.975, n-1} * SE,

and the same with the level split over the arms compared (Bonferroni). Prints one row per arm, in points.

    python bench/paired_vs_baseline.py results/reference/objectives --baseline grpo
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.report.decisions import PartData, look_stats  # noqa: E402
from harness.report.stats import t_quantile  # noqa: E402


def final_records(run: Path, task: str) -> dict[str, float]:
    """{problem id: greedy correct (0/1)} of the run's last test-split evaluation."""
    files = [f for f in (run / "eval").glob(f"{task}_*.jsonl") if f.stem.split("_")[-1].isdigit()]
    last = max(files, key=lambda f: int(f.stem.split("_")[-1]))
    return {r["id"]: float(r["greedy"]["correct"]) for r in map(json.loads, last.read_text().splitlines())}


def runs_by_arm(root: Path) -> dict[str, dict[int, Path]]:
    out: dict[str, dict[int, Path]] = {}
    for d in sorted(root.iterdir()):
        s = d / "summary.json"
        if d.is_dir() and s.is_file():
            doc = json.loads(s.read_text())
            if doc.get("status") == "finished":
                out.setdefault(doc["algorithm"], {})[int(doc["seed"])] = d
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", help="a folder of run folders (a sweep's, or its export)")
    p.add_argument("--baseline", required=True, help="the arm (algorithm) every other arm is compared with")
    p.add_argument("--task", default="arith")
    p.add_argument("--level", type=float, default=0.95)
    a = p.parse_args(argv)
    arms = runs_by_arm(Path(a.runs))
    if a.baseline not in arms:
        p.error(f"--baseline {a.baseline!r}: no finished run of it in {a.runs} (arms: {', '.join(arms)})")
    base = {s: final_records(d, a.task) for s, d in arms[a.baseline].items()}
    others = [k for k in arms if k != a.baseline]
    alpha = 1 - a.level
    print(f"{'arm':<16} {'seeds':>5} {'per-seed (points)':<26} {'mean':>6} {'seed SE':>8} {'test-set SE':>11} "
          f"{f'{a.level:.0%} CI':>14} {f'Bonferroni x{len(others)}':>16}")
    for arm in others:
        seeds = sorted(set(arms[arm]) & set(base))
        diffs = []
        for s in seeds:
            rec = final_records(arms[arm][s], a.task)
            ids = sorted(base[s])
            if sorted(rec) != ids:
                p.error(f"{arm} seed {s} was scored on other problems than {a.baseline} seed {s}")
            diffs.append(np.array([100 * (rec[i] - base[s][i]) for i in ids]))
        n = len(diffs)
        means = [float(d.mean()) for d in diffs]
        st = look_stats(PartData(what=f"{arm} - {a.baseline}", unit="points", expected=0, sesoi=0.0, seeds=seeds,
                                 values=means, problems=diffs, crossed=True), n)
        se = st["se"]
        half = t_quantile(1 - alpha / 2, n - 1) * se if n > 1 else float("nan")
        half_b = t_quantile(1 - alpha / (2 * len(others)), n - 1) * se if n > 1 else float("nan")
        per = ", ".join(f"{m:+.1f}" for m in means)
        print(f"{arm:<16} {n:>5} {per:<26} {st['mean']:>+6.2f} {st['sd'] / np.sqrt(n):>8.2f} "
              f"{np.sqrt(st['var_problems']):>11.2f} "
              f"{f'± {half:.2f}':>14} {f'± {half_b:.2f}':>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
