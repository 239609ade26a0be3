"""Seconds from `harness ...` to its answer, per command: the command line loads torch,
transformers, pandas and MLflow only when a command's work starts, so `--help`, `config` and
argument errors answer at once.

    python bench/cli_startup.py [--runs 7]

Each command runs ``--runs`` times as a fresh process (`python -m harness.cli.main ...`, the
console script's work without its wrapper), alternating commands run by run; the table gives the
median and the range, beside `python -c pass` (the interpreter's own start, the floor).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [
    ["--help"], ["train", "--help"], ["eval", "--help"], ["sweep", "--help"], ["config"],
    ["config", "--show", "harness/configs/quickstart.yaml"], ["report", "--help"], ["report", "/no/such/dir"],
    ["sync", "--help"], ["sync", "/no/such/dir", "--to", "mlflow"], ["ui", "--help"], ["ui", "/no/such/dir"],
]


def _once(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args(argv)
    cases = [("python -c pass", [sys.executable, "-c", "pass"])]
    cases += [("harness " + " ".join(c), [sys.executable, "-m", "harness.cli.main", *c]) for c in COMMANDS]
    times: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(args.runs):
        for name, cmd in cases:
            times[name].append(_once(cmd))
    load = os.getloadavg()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  cpus {os.cpu_count()}  load {load[0]:.2f} {load[1]:.2f}  runs {args.runs}")
    width = max(map(len, times))
    print(f"{'command':{width}}  median s  min-max s")
    for name, ts in times.items():
        print(f"{name:{width}}  {statistics.median(ts):8.3f}  {min(ts):.3f}-{max(ts):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
