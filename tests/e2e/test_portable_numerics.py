"""Portable numerics, proven on one machine: the same warm-up + GRPO run, started with the CPU
dispatch variables a machine of another kind (or a user) would leave behind, gives the same
bits: warm-up checkpoint, final weights (sha256) and every metric row.

Each run is a real `harness train` process (warm-up of 80 steps, 2 GRPO steps with a reward
signal, evaluation at both ends). The inherited values are what another CPU kind selects on
its own: ATen's AVX-512 / AVX2 / scalar kernels, MKL's AUTO or AVX2 code branches, oneDNN's
ISA cap, another OMP thread count. The control shows the comparison has power: in native
numerics the same two ATen settings give other weights.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.foundation import numerics

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "harness" / "configs" / "quickstart.yaml"
SETS = ["warmup.steps=80", "warmup.examples_per_step=32", "train.prompts_per_step=4", "sampling.samples_per_prompt=4",
        "budget.amount=32", "budget.eval_points=1", "task.eval_size=20", "eval.n=2", "train.threads=1",
        "warmup.threads=1"]  # one thread each: two runs at a time on two cores
HAS_AVX512 = "avx512f" in numerics.cpu_info()["isa"]

# name -> (numerics mode, inherited environment)
VARIANTS = {
    "aten_avx2": ("portable", {"ATEN_CPU_CAPABILITY": "avx2"}),
    "aten_default": ("portable", {"ATEN_CPU_CAPABILITY": "default"}),
    "aten_avx512": ("portable", {"ATEN_CPU_CAPABILITY": "avx512"}),
    "mkl_onednn_preset": ("portable", {"MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
                                       "MKL_ENABLE_INSTRUCTIONS": "AVX512", "OMP_NUM_THREADS": "2",
                                       "OPENBLAS_CORETYPE": "SkylakeX", "NPY_DISABLE_CPU_FEATURES": ""}),
    "native_avx2": ("native", {"ATEN_CPU_CAPABILITY": "avx2"}),
    "native_default": ("native", {"ATEN_CPU_CAPABILITY": "default"}),
}
NOT_BITS = ("perf/", "time", "seconds")  # wall-clock figures: the only values allowed to differ


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _run(name: str, tmp: Path) -> dict:
    mode, inherited = VARIANTS[name]
    env = {k: v for k, v in os.environ.items()
           if k not in numerics.PINS and k not in (numerics.ENV_MODE, numerics.ENV_INHERITED)}
    env.update(inherited)
    out = tmp / name
    cmd = [sys.executable, "-m", "harness.cli.main", "train", str(CONFIG), "--output-dir", str(out), "--no-progress",
           "--set", f"numerics={mode}"] + [a for s in SETS for a in ("--set", s)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp)
    assert p.returncode == 0, f"{name}: {p.stderr[-3000:]}"
    (warm,) = list((out / "_cache" / "warmup").glob("*/model.safetensors"))
    (run,) = list((out / "quickstart").glob("*/summary.json"))
    rows = [json.loads(line) for line in (run.parent / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if not any(k.startswith(t) or k.endswith(t) for t in NOT_BITS)} for r in rows]
    summary = json.loads(run.read_text())
    return {"warmup": _sha(warm), "final": _sha(run.parent / "final_model" / "model.safetensors"), "rows": rows,
            "numerics": summary["provenance"]["numerics"], "run_id": summary["run_id"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("numerics")
    names = [n for n in VARIANTS if n != "aten_avx512" or HAS_AVX512]
    with ThreadPoolExecutor(2) as ex:  # two processes at a time on two cores
        return dict(zip(names, ex.map(lambda n: _run(n, tmp), names)))


def _same(a: dict, b: dict) -> bool:
    return a["warmup"] == b["warmup"] and a["final"] == b["final"] and a["rows"] == b["rows"]


def test_inherited_aten_capability_does_not_change_a_bit(runs):
    base = runs["aten_avx2"]
    assert any(r.get("train/grad_norm", 0) > 0 for r in base["rows"]), "the GRPO steps must have a signal"
    for name in ("aten_default", "aten_avx512"):
        if name not in runs:
            continue  # this CPU has no AVX-512: ATen could not have picked it
        assert _same(runs[name], base), f"{name} differs from aten_avx2"
        assert runs[name]["numerics"]["aten_capability"] == "AVX2"
        assert runs[name]["numerics"]["portable"] is True


def test_preset_mkl_and_onednn_variables_are_overridden(runs):
    base = runs["aten_avx2"]
    for name in ("mkl_onednn_preset",):
        r = runs[name]
        assert _same(r, base), f"{name} differs from aten_avx2"
        assert r["numerics"]["mkl_cbwr"] == "COMPATIBLE,STRICT"
        assert r["numerics"]["pins"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
        # numpy's kernels and its and scipy's OpenBLAS: the pinned ones, whatever the environment preset
        assert r["numerics"]["numpy_simd"] == ["X86_V3"]
        assert r["numerics"]["openblas"] and set(r["numerics"]["openblas"].values()) == {"Haswell"}
        assert r["numerics"]["threads"] == 1  # the config's train.threads, not the inherited OMP_NUM_THREADS=2
        assert r["run_id"] == base["run_id"]


def test_control_native_numerics_follow_the_cpu_dispatch(runs):
    """Without the pins, the two ATen settings give other weights: the comparison above can see
    a difference, so its equalities are evidence."""
    a, b = runs["native_avx2"], runs["native_default"]
    assert a["numerics"]["aten_capability"] == "AVX2" and b["numerics"]["aten_capability"] == "DEFAULT"
    assert a["warmup"] != b["warmup"]
    assert a["numerics"]["portable"] is False and "native" in a["numerics"]["why"]
    assert a["run_id"] != runs["aten_avx2"]["run_id"]  # the mode is part of what a run is
