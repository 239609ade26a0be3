"""Shared helpers of the benchmark scripts (timing statistics, memory, subprocess workers).

A bench script imports it first, as ``from _common import ...`` (run as ``python bench/x.py``, the
script's folder is on ``sys.path``), and reaches the harness as the installed package
(``pip install -e .``): no script edits ``sys.path``.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from harness.foundation import numerics

# bench processes and their workers run in the harness's numerics mode (portable unless
# GRPO_HARNESS_NUMERICS=native), pinned before torch runs a kernel
NUMERICS = numerics.pin_process()

import torch  # noqa: E402
from torch.utils import flop_counter  # noqa: E402

numerics.enter(NUMERICS, 0)  # portable: matrix products in harness.foundation.portable_blas (threads: each bench's own)

ROOT = Path(__file__).resolve().parents[1]


def numerics_line() -> str:
    """One line naming the numerics mode, what ATen and MKL use and the CPU, for every bench's header."""
    st, cpu = numerics.state(NUMERICS), numerics.cpu_info()
    return (f"numerics: {NUMERICS} (ATen {st['aten_capability']}, matmul {st['matmul']}); CPU: {cpu['model']}; "
            f"set {numerics.ENV_MODE}=native for each library's fastest path")


def thread_env(threads: int, mode: Optional[str] = None) -> dict:
    """Environment for a worker process pinned to ``threads`` intra-op threads, in numerics ``mode``
    (default: this process's)."""
    env = numerics.env_for(mode or NUMERICS, threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("WANDB_DISABLED", "true")
    env.setdefault("WANDB_MODE", "disabled")
    env.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")
    return env


def run_worker(script: str, args: list[str], threads: int, timeout: float, label: str,
               extra_env: Optional[dict] = None, mode: Optional[str] = None) -> dict:
    """Run ``python script --worker ... --out F`` in a fresh process (environment: :func:`thread_env`
    in numerics ``mode``, default this process's, plus ``extra_env``); return the JSON it wrote."""
    with tempfile.TemporaryDirectory(prefix="bench-") as td:
        out = Path(td) / "result.json"
        cmd = [sys.executable, script, *args, "--worker-out", str(out)]
        env = {**thread_env(threads, mode), **(extra_env or {})}
        proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stdout[-2000:] + "\n" + proc.stderr[-4000:]).strip()
            return {"error": f"{label}: worker exited with {proc.returncode}\n{tail}"}
        return json.loads(out.read_text())


def run_rounds(script: str, order, common: list[str], a, describe, errors: list, loads: list,
               threads: Optional[int] = None, extra_env: Optional[dict] = None, tag: str = "",
               mode_of=None) -> dict:
    """``a.rounds`` rounds; round ``r`` runs one fresh worker per contender in ``order(r)``
    (``script --worker NAME *common``, ``threads`` (default ``a.threads``) threads, ``a.timeout`` s,
    environment plus ``extra_env``, numerics mode ``mode_of(NAME)`` if given, else this process's).
    Returns {name: [worker result, with its "round"]}; failures go to ``errors``, load averages to
    ``loads``. Prints a line per worker: ``tag``, ``describe(name, result)``, wall time and load."""
    threads = a.threads if threads is None else threads
    results: dict[str, list[dict]] = {n: [] for n in order(0)}
    for r in range(a.rounds):
        for n in order(r):
            t0 = time.time()
            res = run_worker(script, ["--worker", n, *common], threads, a.timeout, n, extra_env,
                             mode_of(n) if mode_of else None)
            la = loadavg()
            loads.append(la)
            if "error" in res:
                errors.append(f"{tag}{res['error']}")
                print(f"  {tag}round {r + 1} {n}: FAILED ({res['error'].splitlines()[0]})", flush=True)
                continue
            res["round"] = r
            results[n].append(res)
            print(f"  {tag}round {r + 1} {describe(n, res)}, process wall {time.time() - t0:.0f} s, loadavg {la}",
                  flush=True)
    return results


def register_cpu_sdpa_flops() -> None:
    """Give torch's FLOP counter formulas for CPU SDPA (``aten._scaled_dot_product_flash_attention_for_cpu``
    and its backward), which it counts as zero in torch 2.13: the same formulas it uses for the CUDA
    flash kernel (``sdpa_flop_count`` / ``sdpa_backward_flop_count``: 4·B·H·S_q·S_k·D forward, 2.5×
    that backward, masks and causality not discounted). Idempotent."""
    fc = flop_counter
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    if fwd in fc.flop_registry or fwd.default in fc.flop_registry:  # registered as the packet
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
        register_cpu_sdpa_flops()
        self.mode = flop_counter.FlopCounterMode(display=False)
        self.mode.__enter__()

    def so_far(self) -> int:
        """FLOPs counted since ``start`` (the counter keeps running)."""
        return int(self.mode.get_total_flops())

    def stop(self) -> Optional[int]:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.total = self.so_far()
            self.mode = None
        return self.total


def median(xs) -> float:
    xs = [x for x in xs if x is not None]
    return float(statistics.median(xs)) if xs else float("nan")


def spread(xs) -> tuple[float, float, float]:
    """(median, min, max) of the values that are not None (NaNs when there are none)."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return (float("nan"),) * 3
    return float(statistics.median(xs)), float(min(xs)), float(max(xs))


def fmt_spread(xs, spec=".3f") -> str:
    """``median [min-max]`` of ``xs`` (only the median when there is one value)."""
    m, lo, hi = spread(xs)
    if m != m:
        return "-"
    if len([x for x in xs if x is not None]) < 2:
        return format(m, spec)
    return f"{format(m, spec)} [{format(lo, spec)}-{format(hi, spec)}]"


def parse_threads(text: str) -> list[int]:
    """``"1,2"`` -> [1, 2]: the thread counts a bench runs, each one a separate set of workers."""
    out = [int(t) for t in str(text).split(",") if t.strip()]
    if not out or min(out) < 1:
        raise SystemExit(f"--threads: expected positive integers separated by commas, got {text!r}")
    return out


def sgemm_roof(threads: int, n: int = 1024, reps: int = 7, cpu_time: bool = False) -> float:
    """Measured float32 matmul roof of this machine at ``threads`` torch threads, GFLOP/s: the best of
    ``reps`` timed ``torch.mm`` of two [n, n] matrices (2·n³ FLOPs each), after one untimed call.
    The best, not the median: the floor is what the machine can do, and load only slows it down.
    ``cpu_time``: timed in process CPU seconds per thread instead of wall seconds (on a shared machine
    a timed op also counts the time others held the core; its CPU time does not)."""
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    clock = time.process_time if cpu_time else time.perf_counter
    per = threads if cpu_time else 1
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(reps):
            t0 = clock()
            torch.mm(a, b)
            best = min(best, (clock() - t0) / per)
        return 2 * n ** 3 / max(best, 1e-9) / 1e9
    finally:
        torch.set_num_threads(prev)


def x_floor(seconds, gflop, roof_gflops) -> float:
    """``seconds`` as a multiple of the compute floor: the time ``gflop`` takes at the sgemm roof."""
    if not seconds or not gflop or not roof_gflops or gflop != gflop or seconds != seconds:
        return float("nan")
    return seconds / (gflop / roof_gflops)


class NoStopTokenizer:
    """A tokenizer whose ``eos_token_id`` is -1, an id no token has: the harness sampler then never
    ends a row, so every row decodes exactly ``max_new_tokens`` tokens (a sampled EOS stays an
    ordinary token, as TRL's ``min_new_tokens`` forbids EOS there). Everything else is delegated."""

    eos_token_id = -1

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def __call__(self, *args, **kw):
        return self._tok(*args, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_MMAP_THRESHOLD_": "65536"}
"""glibc allocator settings of a memory worker: blocks of 64 KiB and more are mmap'ed (returned to the
system on ``free``, and a fixed threshold: glibc's dynamic threshold is switched off by setting it),
and the heap top is trimmed on every ``free``, so RSS follows live memory instead of keeping freed
blocks."""


def print_floor(roofs: dict) -> None:
    """Header lines: the numerics mode, and the measured sgemm roof per thread count (in that mode: portable
    numerics run OpenBLAS's AVX2 Haswell kernels, so on an AVX-512 CPU the roof is lower than native's MKL)."""
    print(f"# {numerics_line()}", flush=True)
    print("# compute floor: sgemm roof (best of 7 float32 torch.mm 1024x1024, measured now) "
          + ", ".join(f"{t} thread{'s' if t > 1 else ''}: {r:.1f} GFLOP/s" for t, r in roofs.items()), flush=True)


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
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


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
