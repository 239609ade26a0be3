"""What portable numerics cost: the quickstart's work, shortened, in portable and native mode.

Each round runs, in fresh processes and alternating the order, one `harness train` of the
quickstart config per mode from an empty warm-up cache: the supervised warm-up (its own
figure: mostly matrix products) and then GRPO (sampling, scoring, update, evaluation). Prints
the median [min-max] seconds per phase per mode and the ratio portable / native.

    python bench/numerics.py                       # 3 rounds, 150 warm-up steps, 16 GRPO steps
    python bench/numerics.py --rounds 5 --warmup-steps 700 --json results/bench/numerics.json

The equal-work condition: both modes run the same config (same steps, samples, evaluation set
and thread counts); only the numerics differ, so their numbers differ too (that is the point).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, loadavg, numerics

CONFIG = ROOT / "harness" / "configs" / "quickstart.yaml"


def one(mode: str, a, tmp: Path) -> dict:
    out = Path(tempfile.mkdtemp(dir=tmp))
    sets = [f"numerics={mode}", f"warmup.steps={a.warmup_steps}", f"budget.amount={a.steps * 256}",
            "budget.eval_points=1", f"train.threads={a.threads}", f"warmup.threads={a.threads}"]
    cmd = [sys.executable, "-m", "harness.cli.main", "train", str(CONFIG), "--output-dir", str(out), "--no-progress"]
    cmd += [x for s in sets for x in ("--set", s)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=numerics.env_for(mode, a.threads), capture_output=True, text=True, cwd=str(ROOT))
    total = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{p.stderr[-2000:]}")
    (summ,) = list(out.glob("quickstart/*/summary.json"))
    s = json.loads(summ.read_text())
    (warm,) = list(out.glob("_cache/warmup/*/warmup.json"))
    return {"mode": mode, "total": total, "warmup": json.loads(warm.read_text())["seconds"],
            "rl": s["wall_seconds"], "acc": s["final_eval"].get("eval/arith/acc"),
            "aten": s["provenance"]["numerics"]["aten_capability"], "matmul": s["provenance"]["numerics"].get("matmul")}


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.1f} [{min(xs):.1f}-{max(xs):.1f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup-steps", type=int, default=150)
    ap.add_argument("--steps", type=int, default=16, help="GRPO steps of 256 samples")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cpu = numerics.cpu_info()
    print(f"# CPU: {cpu['model']} ({' '.join(cpu['isa'])}); {a.threads} thread(s); load {loadavg()}")
    print(f"# work: quickstart config, {a.warmup_steps} warm-up steps, {a.steps} GRPO steps of 32 prompts x 8, "
          f"{a.rounds} rounds, alternating order, fresh processes", flush=True)
    res = []
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            for mode in (("portable", "native") if r % 2 == 0 else ("native", "portable")):
                x = one(mode, a, Path(d))
                x["round"] = r
                res.append(x)
                print(f"round {r} {mode:>8}: total {x['total']:.1f} s, warm-up {x['warmup']:.1f} s, GRPO {x['rl']:.1f} s "
                      f"(ATen {x['aten']}, matmul {x['matmul']})", flush=True)
    print(f"\n{'phase':>8} | {'portable s':>20} | {'native s':>20} | portable/native (median of rounds)")
    for ph in ("warmup", "rl", "total"):
        p = [x[ph] for x in res if x["mode"] == "portable"]
        n = [x[ph] for x in res if x["mode"] == "native"]
        ratios = [x / y for x, y in zip(p, n)]
        print(f"{ph:>8} | {fmt(p):>20} | {fmt(n):>20} | {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}-{max(ratios):.3f}]")
    print(f"# load after: {loadavg()}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"args": vars(a), "cpu": cpu, "runs": res}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
