"""Provenance: what produced a result, so a reader can tell a bug from a machine difference.

One dict, recorded in ``summary.json`` (``provenance``), mirrored to the trackers as tags and
printed in the report's header:

- ``numerics``  the mode, the pins, what ATen, the matrix products, MKL, numpy and OpenBLAS actually use,
  thread counts and whether the run's kernels are the portable ones (`harness.foundation.numerics.state`)
- ``cpu``       model name, vendor, architecture, the vector-ISA flags present, cores
- ``versions``  Python, torch, transformers, numpy, MKL, oneDNN, grpo-harness
- ``code``      the project's git commit and whether the tree was dirty (None outside a checkout)
- ``command``   the command line, with absolute paths made relative (``<results>/...`` under
  the results root, ``~/...`` under the home folder): committed reports carry no machine paths
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Optional

from harness.foundation.numerics import cpu_info, mkl_version, state

# what a portable result claims: its kernels take no path by CPU kind; which kinds it was verified identical on is
# evidence, kept in the README (bench/fingerprint.py checks a machine), not assumed here
PORTABLE_CLAIM = ("portable: no kernel picks its summation order by CPU kind (verified identical on the CPU kinds the "
                  "README lists under 'Same numbers on Intel and AMD')")
# runs from before portable_blas (no ``matmul`` in their record): MKL's COMPATIBLE branch did the products
MKL_ERA_CLAIM = ("portable mode of its commit: matrix products in MKL's COMPATIBLE branch, which gave other bits on an "
                 "Intel Xeon than on an AMD EPYC (issue 43); bit-identical on the CPU kind that made it")


def _version(mod: str) -> Optional[str]:
    try:
        from importlib.metadata import version
        return version(mod)
    except Exception:
        return None


def versions() -> dict:
    import torch

    onednn = None
    m = re.search(r"MKL-DNN v([\w.]+)", torch.__config__.show())
    if m:
        onednn = m.group(1)
    return {"python": platform_python(), "torch": torch.__version__, "transformers": _version("transformers"),
            "numpy": _version("numpy"), "scipy": _version("scipy"), "mkl": mkl_version(), "onednn": onednn,
            "grpo-harness": _version("grpo-harness")}


def platform_python() -> str:
    return ".".join(map(str, sys.version_info[:3]))


@lru_cache(maxsize=1)
def code_version() -> Optional[dict]:
    """{"commit", "dirty"} of the checkout the harness is imported from (None outside git)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit or None, "dirty": bool(dirty)} if commit else None


def portable_path(p: str, results_root: Optional[str | Path] = None) -> str:
    """An absolute path as a reader on another machine can use it: relative to the results
    root (``<results>/x``), the working folder (``./x``) or the home folder (``~/x``); other
    absolute paths keep only their last part (``<abs>/name``)."""
    if not p or not os.path.isabs(p):
        return p
    q = os.path.normpath(p)
    for base, label in ((results_root, "<results>"), (os.getcwd(), "."), (os.path.expanduser("~"), "~")):
        if not base:
            continue
        b = os.path.normpath(os.path.abspath(str(base)))
        if q == b:
            return label
        if q.startswith(b.rstrip(os.sep) + os.sep):
            return f"{label}/{os.path.relpath(q, b)}"
    return f"<abs>/{os.path.basename(q)}"


_ABS = re.compile(r"(?<![\w.~<>-])(/[^\s=:,'\"]+)")


def portable_text(s: str, results_root: Optional[str | Path] = None) -> str:
    """Every absolute path inside ``s`` through `portable_path`."""
    return _ABS.sub(lambda m: portable_path(m.group(1), results_root), s)


def command_line(argv: Optional[list[str]] = None, results_root: Optional[str | Path] = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    if argv:
        argv[0] = os.path.basename(argv[0])
    return portable_text(shlex.join(argv), results_root)


def collect(mode: str, device: str = "cpu", results_root: Optional[str | Path] = None,
            numerics_state: Optional[dict] = None) -> dict:
    """The provenance of a result produced in this process now (see the module doc)."""
    return {"numerics": numerics_state or state(mode, device), "cpu": cpu_info(), "versions": versions(),
            "code": code_version(), "command": command_line(results_root=results_root)}


def tags(prov: dict) -> dict:
    """Flat string tags for MLflow / wandb (``provenance.*``)."""
    if not prov:
        return {}
    n, c, v, code = prov.get("numerics") or {}, prov.get("cpu") or {}, prov.get("versions") or {}, prov.get("code") or {}
    out = {"provenance.numerics": n.get("mode"), "provenance.portable": n.get("portable"),
           "provenance.aten_capability": n.get("aten_capability"), "provenance.mkl_cbwr": n.get("mkl_cbwr"),
           "provenance.threads": n.get("threads"), "provenance.cpu": c.get("model"),
           "provenance.cpu_isa": " ".join(c.get("isa") or []), "provenance.commit": code.get("commit"),
           "provenance.dirty": code.get("dirty"), "provenance.command": prov.get("command")}
    for k, val in v.items():
        out[f"provenance.version.{k}"] = val
    return {k: str(val) for k, val in out.items() if val is not None and val != ""}


def describe(prov: dict) -> list[str]:
    """Human-readable lines for a report header."""
    if not prov:
        return ["provenance: not recorded (a run from before provenance was recorded)"]
    n, c, v, code = prov.get("numerics") or {}, prov.get("cpu") or {}, prov.get("versions") or {}, prov.get("code")
    commit = "not a git checkout" if not code else f"{code.get('commit')}{' (dirty tree)' if code.get('dirty') else ''}"
    matmul = n.get("matmul")
    if not n.get("portable"):
        port = f"not portable: {n.get('why') or 'unknown'}"
    else:
        port = PORTABLE_CLAIM if matmul else MKL_ERA_CLAIM
    products = f"matmul {matmul}" if matmul else f"MKL CNR {n.get('mkl_cbwr')}"
    vers = ", ".join(f"{k} {val}" for k, val in v.items() if val)
    return [f"code: {commit}",
            f"CPU: {c.get('model')} ({c.get('arch')}; {' '.join(c.get('isa') or [])})",
            f"numerics: {n.get('mode')} (ATen {n.get('aten_capability')}, {products}, "
            f"{n.get('threads')} thread{'' if n.get('threads') == 1 else 's'}): {port}",
            f"versions: {vers}",
            f"command: {prov.get('command')}"]
