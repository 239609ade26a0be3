"""Did each run learn? Its final evaluation minus its start, paired by held-out problem.

Every run scores the same held-out problems at its start (step 0, the RL start: the warm-up's checkpoint) and at its
last evaluation. Per problem i the difference d_i = final_i - start_i of the greedy correctness (0/1) is -1, 0 or +1;
the run's gain is their mean and its interval the paired t-interval over the P problems

    half-width = t_{1-alpha/2, P-1} * sd(d) / sqrt(P),

the test set's sampling term for this run: it says whether this run's policy is better than its start on problems
like these, not whether another seed would gain as much (the seed spread is what `harness report` and
`bench/paired_vs_baseline.py` add). Also printed: how many problems went right (gained) and wrong (lost), the two
counts McNemar's test reads.

    python bench/gain_by_problem.py results/wordarith_lora              # every run under the folder
    python bench/gain_by_problem.py RUN_DIR [RUN_DIR ...] --task wordarith
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.report.problems import problem_values  # noqa: E402
from harness.report.stats import paired_diff_ci  # noqa: E402
from harness.rundir.read import RunData, find_run_dirs, load_run  # noqa: E402


def gain(run: RunData, task: str, level: float = 0.95) -> dict:
    """The run's start, final and paired gain (fractions), or {"why": reason} when it cannot be read. The
    per-problem values are the report's (`harness.report.problems.problem_values`: the start's records and the
    last evaluation row's, checked against the run's summary)."""
    start, why = problem_values(run, task, "acc", "initial")
    final, why_final = problem_values(run, task, "acc", "final") if start is not None else (None, "")
    if start is None or final is None:
        return {"why": why or why_final}
    if sorted(start) != sorted(final):
        return {"why": "the start and the final evaluation scored other problems"}
    d = paired_diff_ci(final, start, level)
    ids = sorted(start)
    return {"problems": len(ids), "start": float(np.mean([start[i] for i in ids])),
            "final": float(np.mean([final[i] for i in ids])), "gain": d["mean"], "lo": d["lo"], "hi": d["hi"],
            "gained": sum(final[i] > start[i] for i in ids), "lost": sum(final[i] < start[i] for i in ids)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run folders, or folders of run folders (a sweep's, or its export)")
    p.add_argument("--task", default="wordarith")
    p.add_argument("--level", type=float, default=0.95)
    p.add_argument("--json", default=None, help="also write the rows here")
    a = p.parse_args(argv)
    missing = [r for r in a.runs if not Path(r).is_dir()]
    if missing:
        p.error(f"no such directory: {', '.join(missing)}")
    runs = [load_run(d) for r in a.runs for d in find_run_dirs(r)]
    if not runs:
        p.error(f"no run folder (one with a metrics.jsonl) in {', '.join(a.runs)}")
    rows = []
    print(f"{'run':<28} {'status':<11} {'P':>5} {'start':>6} {'final':>6} {'gain':>6} {f'{a.level:.0%} CI':>16} "
          f"{'gained':>6} {'lost':>5}  excludes 0")
    for run in runs:
        name, status = run.run_dir.name, run.status
        g = gain(run, a.task, a.level)
        rows.append({"run": name, "status": status, **g})
        if "why" in g:
            print(f"{name:<28} {status:<11} {g['why']}")
            continue
        excl = "yes" if g["lo"] > 0 or g["hi"] < 0 else "no"
        ci = f"[{100 * g['lo']:+.1f}, {100 * g['hi']:+.1f}]" if math.isfinite(g["lo"]) else "-"
        print(f"{name:<28} {status:<11} {g['problems']:>5} {100 * g['start']:>6.1f} {100 * g['final']:>6.1f} "
              f"{100 * g['gain']:>+6.1f} {ci:>16} {g['gained']:>6} {g['lost']:>5}  {excl}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
