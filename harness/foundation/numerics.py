"""Numerics mode: kernels whose summation order no CPU kind chooses (portable), or this CPU's fastest (native).

Three libraries inside torch choose a code path by the CPU they find, and each path sums in
its own order, so the same run gives other weights on another CPU kind:

- ATen's vectorised kernels (softmax, norms, exp/log, reductions) dispatch on the widest ISA
  the CPU has (AVX-512 or AVX2); ``ATEN_CPU_CAPABILITY`` fixes it. Read at the first kernel.
- MKL's sgemm (every linear layer) dispatches on the CPU *and its vendor*. Its conditional
  numerical reproducibility (``MKL_CBWR``) pins a branch, and ``COMPATIBLE,STRICT`` is documented
  to give the same bits on Intel and AMD; measured, it did not (the quickstart's warm-up trained
  other weights on an Intel Xeon than on an AMD EPYC with that branch read back in force, and
  sgemm is the only MKL function a run calls). Portable mode therefore takes MKL out of the path:
  every CPU matrix product runs in OpenBLAS's Haswell kernels, called single-threaded in blocks
  fixed by the shape, and attention in torch's math path (`harness.foundation.portable_blas`, installed
  by `enter`). The MKL pin stays, for anything that still reaches MKL.
- oneDNN's JIT picks its ISA; ``ONEDNN_MAX_CPU_ISA`` caps it.
- numpy (the reports' statistics, maj@k) does the same twice over: its own kernels (float64 ``exp`` and ``log``
  among them) dispatch on the CPU's ISA group, X86_V4 (AVX-512) or X86_V3 (AVX2), read once at numpy's import
  (``NPY_DISABLE_CPU_FEATURES`` caps it); and the OpenBLAS it ships (``dot``, ``@``, ``convolve``) picks its kernels by
  CPU model (Haswell, SkylakeX, Zen, ...) at load (``OPENBLAS_CORETYPE`` fixes them; scipy's OpenBLAS reads the same
  variable). Measured on one AMD EPYC (Zen 4): float64 ``exp`` over a million points differs between X86_V4 and
  X86_V3, and a 17-element ``dot`` between the SkylakeX and Haswell kernels, in the last bit.
- Thread counts split some of ATen's kernels (softmax's backward among them) and OpenBLAS's own
  threading: results depend on them, so a run's thread count is a fixed number from its config, never
  the machine's core count, and OpenBLAS runs on one thread (portable_blas parallelises by the shape).

``portable`` (the default) fixes all of these before torch runs a kernel, in every process the
harness starts (CLI, sweep workers, Ray tasks, torchrun ranks, bench workers); ``native``
lets each library pick its fastest path. Which one a run used, and whether the pins took
effect, is part of its provenance (`harness.rundir.provenance`). Portability cannot hold on
another architecture, on a CPU without AVX2, or for CUDA kernels: the record says so.

This module imports no torch at import time: the CLI imports it first.
"""
from __future__ import annotations

import importlib
import json
import os
import platform
import sys
from typing import Optional

from harness.foundation.errors import NumericsError  # raised by `enter`; callers may catch it here too

MODES = ("portable", "native")
DEFAULT_MODE = "portable"
ENV_MODE = "GRPO_HARNESS_NUMERICS"  # the mode a process starts in (set by the harness for its children)
ENV_INHERITED = "GRPO_HARNESS_INHERITED_PINS"  # the pinned variables as they were before the harness set them
DEFAULT_THREADS = 2  # portable mode, train.threads = 0 and no launcher's count: a fixed count, not the cores
# (harness.admission.gate.decide_threads decides a run's count)

# what portable mode sets, before torch runs a kernel (children inherit it)
PINS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",  # oneDNN's older name for the same cap
    "MKL_DYNAMIC": "FALSE",      # MKL may not lower its thread count on its own
    "OMP_DYNAMIC": "FALSE",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",  # numpy's kernels at X86_V3 (AVX2) at most
    "OPENBLAS_CORETYPE": "Haswell",  # numpy's and scipy's OpenBLAS: the AVX2 kernels on every CPU
    "OPENBLAS_NUM_THREADS": "1",  # ... on one thread (`thread_env`): not the machine's core count
    # not numerics but speed: the matrix products run on threads of portable_blas's own, and OpenMP's idle threads
    # spinning between ATen's parallel regions took their cores (a warm-up step 0.39 s spinning, 0.30 s passive)
    "OMP_WAIT_POLICY": "PASSIVE",
}
# pins that name code a CPU must be able to run: set only where it has AVX2 and FMA (elsewhere OpenBLAS would be
# forced onto instructions the CPU lacks; portability does not hold there anyway: `state` says so)
NEEDS_AVX2 = ("OPENBLAS_CORETYPE",)
NUMPY_PINNED = "X86_V3"  # the highest ISA group numpy dispatches to in portable mode
MKL_CBWR_COMPATIBLE_STRICT = 3 | 0x10000  # mkl_cbwr.h: MKL_CBWR_COMPATIBLE | MKL_CBWR_STRICT
_MKL_BRANCHES = {0: "OFF", 1: "BRANCH_OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 8: "SSE4_2", 9: "AVX",
                 10: "AVX2", 12: "AVX512", 14: "AVX512_E1", 15: "AVX512_E2", 16: "AVX512_E3",
                 17: "AVX512_E4", 18: "AVX2_E1", 19: "AVX512_E5"}
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl",
             "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "avx_vnni")




def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"numerics must be one of {', '.join(MODES)} (got {mode!r})")
    return mode


def process_mode() -> str:
    """The mode this process was started in: ``GRPO_HARNESS_NUMERICS`` or the default."""
    m = os.environ.get(ENV_MODE, "").strip().lower() or DEFAULT_MODE
    return m if m in MODES else DEFAULT_MODE


def run_mode(configured: Optional[str]) -> str:
    """The one rule for which mode work runs in: a run's config decides (``numerics:`` of the run being trained,
    resumed or evaluated); work with no run config (``harness eval --model DIR`` of a bare model folder, a bench)
    takes the process's (`process_mode`: ``GRPO_HARNESS_NUMERICS``, else the default)."""
    return check_mode(configured) if configured else process_mode()


def _inherited(env) -> dict:
    """The pinned variables as the user (or the machine's setup) had them before the harness
    pinned anything: recorded once, in ``GRPO_HARNESS_INHERITED_PINS``, so that a native run
    restores them instead of a portable parent's values."""
    raw = env.get(ENV_INHERITED)
    if raw is not None:
        try:
            return {k: str(v) for k, v in json.loads(raw).items() if k in PINS}
        except (ValueError, AttributeError):
            return {}
    return {k: env[k] for k in PINS if k in env}


def env_for(mode: str, threads: Optional[int] = None, base: Optional[dict] = None) -> dict:
    """The environment of a child process in ``mode`` (``base``: a copy of os.environ by
    default): portable sets the pins; native puts back what was there before the harness
    pinned anything (`_inherited`). ``threads`` also sets the thread variables."""
    env = dict(os.environ if base is None else base)
    inherited = _inherited(env)
    env[ENV_INHERITED] = json.dumps(inherited, sort_keys=True)
    env[ENV_MODE] = check_mode(mode)
    avx2 = _has_avx2_fma()
    for k, v in PINS.items():
        if mode == "portable" and (avx2 or k not in NEEDS_AVX2):
            env[k] = v
        elif mode == "portable":
            env.pop(k, None)
        elif k in inherited:
            env[k] = inherited[k]
        else:
            env.pop(k, None)
    if threads:
        env.update(thread_env(mode, threads))
    return env


def thread_env(mode: str, threads: int) -> dict:
    """The thread variables of a child running ``threads`` threads in ``mode``. In portable mode OpenBLAS runs
    on one thread whatever the count: its multi-threaded products partition the output by the thread count and
    sum the edges in another order, so numpy's ``@`` would follow the machine's cores (OpenBLAS's default) or the
    count; the harness's own products parallelise by the shape (`harness.foundation.portable_blas`)."""
    t = str(int(threads))
    return {"OMP_NUM_THREADS": t, "MKL_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": "1" if mode == "portable" else t}


def _has_avx2_fma(cpu: Optional[dict] = None) -> bool:
    """Whether the CPU (``cpu``: a :func:`cpu_info` already read) has AVX2 and FMA."""
    isa = (cpu or cpu_info())["isa"]
    return "avx2" in isa and "fma" in isa


def numpy_state() -> dict:
    """What numpy runs here: the ISA groups its kernels dispatch to (``simd``: numpy's "found" list, after
    ``NPY_DISABLE_CPU_FEATURES``) and the kernels of the OpenBLAS builds numpy and scipy load (``openblas``:
    library -> core name, as each reports it); empty where a library is absent or says nothing."""
    import ctypes
    import glob

    import numpy as np

    try:
        simd = list(np.__config__.CONFIG["SIMD Extensions"]["found"])
    except (AttributeError, KeyError, TypeError):
        simd = []
    cores = {}
    for pkg in ("numpy", "scipy"):
        try:
            mod = __import__(pkg)
        except ImportError:
            continue
        libs = os.path.join(os.path.dirname(os.path.dirname(mod.__file__)), f"{pkg}.libs")
        for path in sorted(glob.glob(os.path.join(libs, "*openblas*.so*"))):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                         "openblas_get_corename"):
                fn = getattr(lib, name, None)
                if fn is not None:
                    fn.restype = ctypes.c_char_p
                    cores[f"{pkg}: {os.path.basename(path)}"] = (fn() or b"").decode(errors="replace")
                    break
    return {"simd": simd, "openblas": cores}


def pin_process(mode: Optional[str] = None) -> str:
    """Set this process's environment for ``mode`` (default: `process_mode`). Call it before
    torch runs a kernel: the CLI does it before importing torch. Returns the mode."""
    mode = check_mode(mode or process_mode())
    new = env_for(mode)
    for k in set(PINS) - set(new):
        os.environ.pop(k, None)
    os.environ.update({k: v for k, v in new.items() if os.environ.get(k) != v})
    if "torch" in sys.modules and mode == "portable":  # MKL's branch can still be set before its first call
        _mkl_set(MKL_CBWR_COMPATIBLE_STRICT)
    return mode


def enter(mode: str, threads: int, device: str = "cpu") -> dict:
    """Apply ``mode`` and ``threads`` to this process and return what took effect (see
    `state`). A run comes here through the admission gate (`harness.admission.gate.Admitted.enter`), which decided
    both. Raises `NumericsError` when portable numerics were asked for and torch already
    runs other kernels here (it ran one before the pins were set): the run would not be
    portable, and saying so after the fact is worse than refusing before any work."""
    import torch

    check_mode(mode)
    pin_process(mode)
    if mode == "portable" and not str(device).startswith("cuda"):
        _portable_blas().install()  # every CPU matrix product in OpenBLAS's pinned kernels
    if threads:
        torch.set_num_threads(int(threads))
        for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # for children (DeepSpeed, verifier pools)
            os.environ[k] = str(int(threads))
    st = state(mode, device)
    if mode == "portable" and st["pinned"] is False:
        raise NumericsError(
            f"numerics: portable was asked for, but this process already runs {st['why']}. Start Python with "
            f"{ENV_MODE}=portable (the harness CLI does), call harness.foundation.numerics.pin_process() before "
            f"torch runs any kernel, or set numerics: native")
    return st


def _portable_blas():
    """harness.foundation.portable_blas, loaded when first needed (it imports torch; this module must not)."""
    return importlib.import_module("harness.foundation.portable_blas")


def _torch_lib():
    import ctypes
    import torch

    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def _mkl_fn(name: str):
    lib = _torch_lib()
    fn = getattr(lib, name, None) if lib is not None else None
    return fn


def _mkl_set(setting: Optional[int]) -> Optional[int]:
    """mkl_cbwr_set before MKL's first call (returns MKL's status; None without MKL)."""
    if setting is None:
        return None
    fn = _mkl_fn("mkl_serv_cbwr_set")
    return None if fn is None else int(fn(setting))


def mkl_branch() -> Optional[str]:
    """MKL's CNR setting in force, e.g. ``COMPATIBLE,STRICT``, ``OFF``; None without MKL."""
    import ctypes

    fn = _mkl_fn("mkl_serv_cbwr_get")
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
    v = int(fn(-1))  # MKL_CBWR_ALL
    if v < 0:
        return f"error {v}"
    name = _MKL_BRANCHES.get(v & 0xFFFF, str(v & 0xFFFF))
    return name + (",STRICT" if v & 0x10000 else "")


def mkl_version() -> Optional[str]:
    import ctypes

    fn = _mkl_fn("MKL_Get_Version_String")
    if fn is None:
        return None
    buf = ctypes.create_string_buffer(256)
    fn(buf, 256)
    return buf.value.decode(errors="replace").strip()


def cpu_info() -> dict:
    """CPU model, vendor, architecture and the vector-ISA flags that matter here."""
    model, vendor, flags = platform.processor() or "", "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k == "model name" and not model.strip():
                    model = v.strip()
                elif k == "model name":
                    model = v.strip()
                elif k == "vendor_id":
                    vendor = v.strip()
                elif k == "flags" and not flags:
                    flags = set(v.split())
                if k == "processor" and v.strip() == "1":
                    break
    except OSError:
        pass
    return {"model": model or platform.machine(), "vendor": vendor, "arch": platform.machine(),
            "isa": [f for f in ISA_FLAGS if f in flags], "cores": os.cpu_count()}


def _late_numpy(npy: dict) -> list[str]:
    """numpy's kernels and OpenBLAS's core when they are not the pinned ones. numpy reads its pins once, when it is
    imported (torch imports it): a process that imported either before pin_process keeps the CPU's own numpy
    kernels. Its training numbers do not depend on them (torch's kernels are pinned), its evaluation statistics and
    reports can, in the last bits: recorded as not portable, not refused."""
    late = []
    above = [g for g in npy["simd"] if g not in ("X86_V2", NUMPY_PINNED)]
    if above:
        late.append(f"numpy's kernels at {', '.join(above)} (pinned: {NUMPY_PINNED})")
    off = {lib: core for lib, core in npy["openblas"].items()
           if core and core.lower() != PINS["OPENBLAS_CORETYPE"].lower()}
    if off:
        late.append("OpenBLAS kernels " + ", ".join(f"{core} ({lib})" for lib, core in off.items())
                    + f" (pinned: {PINS['OPENBLAS_CORETYPE']})")
    return late


def state(mode: str, device: str = "cpu") -> dict:
    """What is in force in this process: the mode asked for, the pins in the environment, the ISA ATen uses, what
    runs the matrix products (``matmul``), MKL's branch, numpy's kernels and OpenBLAS's core, thread counts, and
    ``portable``: whether every pin took effect (with ``why`` when not). ``pinned`` is False when portable pins were
    asked for but did not take effect."""
    import torch

    cpu = cpu_info()
    avx2 = _has_avx2_fma(cpu)
    aten = torch.backends.cpu.get_cpu_capability()
    mkl = mkl_branch()
    npy = numpy_state()
    blas = _portable_blas().describe()
    st = {"mode": mode, "pins": {k: os.environ.get(k) for k in PINS},
          "aten_capability": aten, "mkl_cbwr": mkl, "numpy_simd": npy["simd"], "openblas": npy["openblas"],
          "matmul": (f"OpenBLAS {blas.get('core', '?')} ({blas.get('library', '?')})" if blas.get("installed")
                     else "torch's own (MKL)"),
          "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
          "device": str(device), "pinned": None, "portable": False, "why": ""}
    if mode != "portable":
        st["why"] = "numerics: native (each library picks this CPU's fastest path)"
        return st
    wrong = []
    if aten != "AVX2":
        wrong.append(f"ATen kernels at {aten} (pinned: AVX2)")
    if mkl is not None and mkl != "COMPATIBLE,STRICT":
        wrong.append(f"MKL at CNR {mkl} (pinned: COMPATIBLE,STRICT)")
    if not blas.get("installed") and not str(device).startswith("cuda"):
        wrong.append("matrix products in MKL (harness.foundation.portable_blas is not installed: enter() installs it)")
    late = _late_numpy(npy) if avx2 else []
    if cpu["arch"] not in ("x86_64", "AMD64"):
        st["why"] = f"architecture {cpu['arch']}: portable numerics cover x86-64 only"
    elif not avx2:
        st["why"] = "this CPU has no AVX2/FMA: ATen falls back to its default kernels"
    elif wrong:
        st["pinned"] = False
        st["why"] = "; ".join(wrong)
    elif str(device).startswith("cuda"):
        st["pinned"] = True
        st["why"] = "CUDA kernels are not covered by the CPU pins"
    elif late:
        st["pinned"] = True
        st["why"] = ("; ".join(late) + ": numpy was imported before the pins (start the process through the harness "
                     "CLI, or call harness.foundation.numerics.pin_process() before importing numpy or torch)")
    else:
        st["pinned"] = True
        st["portable"] = True
    return st
