"""Shared helpers of the benchmark scripts (timing statistics, memory, subprocess workers)."""
from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[1]


def thread_env(threads: int) -> dict:
    """Environment for a worker process pinned to ``threads`` intra-op threads."""
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("WANDB_DISABLED", "true")
    env.setdefault("WANDB_MODE", "disabled")
    env.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_worker(script: str, args: list[str], threads: int, timeout: float, label: str) -> dict:
    """Run ``python script --worker ... --out F`` in a fresh process; return the JSON it wrote."""
    with tempfile.TemporaryDirectory(prefix="bench-") as td:
        out = Path(td) / "result.json"
        cmd = [sys.executable, script, *args, "--worker-out", str(out)]
        proc = subprocess.run(cmd, cwd=str(ROOT), env=thread_env(threads), capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stdout[-2000:] + "\n" + proc.stderr[-4000:]).strip()
            return {"error": f"{label}: worker exited with {proc.returncode}\n{tail}"}
        return json.loads(out.read_text())


def run_rounds(script: str, order, common: list[str], a, describe, errors: list, loads: list) -> dict:
    """``a.rounds`` rounds; round ``r`` runs one fresh worker per contender in ``order(r)``
    (``script --worker NAME *common``, ``a.threads`` threads, ``a.timeout`` s). Returns
    {name: [worker result, with its "round"]}; failures go to ``errors``, load averages to
    ``loads``. Prints a line per worker: ``describe(name, result)`` then wall time and load."""
    results: dict[str, list[dict]] = {n: [] for n in order(0)}
    for r in range(a.rounds):
        for n in order(r):
            t0 = time.time()
            res = run_worker(script, ["--worker", n, *common], a.threads, a.timeout, n)
            la = loadavg()
            loads.append(la)
            if "error" in res:
                errors.append(res["error"])
                print(f"  round {r + 1} {n}: FAILED ({res['error'].splitlines()[0]})", flush=True)
                continue
            res["round"] = r
            results[n].append(res)
            print(f"  round {r + 1} {describe(n, res)}, process wall {time.time() - t0:.0f} s, loadavg {la}",
                  flush=True)
    return results


def register_cpu_sdpa_flops() -> None:
    """Give torch's FLOP counter formulas for CPU SDPA (``aten._scaled_dot_product_flash_attention_for_cpu``
    and its backward), which it counts as zero in torch 2.13: the same formulas it uses for the CUDA
    flash kernel (``sdpa_flop_count`` / ``sdpa_backward_flop_count``: 4·B·H·S_q·S_k·D forward, 2.5×
    that backward, masks and causality not discounted). Idempotent."""
    from torch.utils import flop_counter as fc
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    if fwd.default in fc.flop_registry:
        return

    @fc.register_flop_formula(fwd)
    def _fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    @fc.register_flop_formula(bwd)
    def _bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


class FlopCount:
    """Matmul / attention FLOPs (forward and backward) of what runs between ``start`` and
    ``stop``, counted by ``torch.utils.flop_counter.FlopCounterMode`` (mm, addmm, bmm, baddbmm,
    SDPA, ...; elementwise ops are not counted). Counting slows the ops down, so the counted step
    is an extra, untimed one."""

    def __init__(self):
        self.mode = None
        self.total: Optional[int] = None

    def start(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode
        register_cpu_sdpa_flops()
        self.mode = FlopCounterMode(display=False)
        self.mode.__enter__()

    def stop(self) -> Optional[int]:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.total = int(self.mode.get_total_flops())
            self.mode = None
        return self.total


def median(xs) -> float:
    xs = [x for x in xs if x is not None]
    return float(statistics.median(xs)) if xs else float("nan")


def loadavg() -> tuple[float, float, float]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return (float("nan"),) * 3


def vm_hwm_mb() -> Optional[float]:
    """Lifetime peak RSS (VmHWM) of this process, when nothing reset it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def step_problems(task, seed: int, step: int, n: int):
    """The prompts of step ``step`` (same for every contender; the trainer's own draw)."""
    from harness.train.loop import stage_seed
    return task.sample_train(random.Random(stage_seed(seed, step)), n)


def outcome_rewards(task, problems_rep, rollouts):
    """[B] float rewards, scored by the trainer's own scorer."""
    from harness.train.loop import score
    return score(task, problems_rep, rollouts)[0]


def finish(out: dict, errors: list, loads: list, json_path: Optional[str]) -> int:
    """Common end of a benchmark: load average, errors, optional JSON; the exit code."""
    print(f"loadavg at end {loadavg()} (all samples: {loads})")
    for e in errors:
        print("\nERROR:", e)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {json_path}")
    return 0 if not errors else 1


def fmt(x, spec=".3f") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return format(x, spec)


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
