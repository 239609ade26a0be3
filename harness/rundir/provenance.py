"""Provenance: what produced a result, so a reader can tell a bug from a machine difference.

One dict, recorded in ``summary.json`` (``provenance``), mirrored to the trackers as tags and
printed in the report's header:

- ``numerics``  the mode, the pins, what ATen, the matrix products, MKL, numpy and OpenBLAS actually use,
  thread counts and whether the run's kernels are the portable ones (`harness.foundation.numerics.state`)
- ``cpu``       model name, vendor, architecture, the vector-ISA flags present, cores
- ``versions``  Python, torch, transformers, numpy, MKL, oneDNN, grpo-harness
- ``code``      the project's git commit and whether the tree was dirty (None outside a checkout), and ``source``: a
  digest of the product's own source (algorithms/, evals/, harness/), in a checkout or not
- ``earlier``   a resumed run's provenance of each earlier attempt that differed in code (``resumes``), when the
  user let it resume with new code (`ENV_RESUME_NEW_CODE`); a run resumes only with the numerics mode and thread
  count it started with (:func:`resume_problem`)
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


PRODUCT_PACKAGES = ("algorithms", "evals", "harness")
ENV_RESUME_NEW_CODE = "GRPO_HARNESS_RESUME_NEW_CODE"
"""Set to 1: a run resumes under code other than the one it started with (each attempt's code is recorded)."""


@lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 (16 hex digits) of the product's Python source as imported (every ``.py`` file of
    `PRODUCT_PACKAGES`, by relative path and content): the code a result came from, dirty tree or not."""
    import hashlib

    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for pkg in PRODUCT_PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def code_version() -> Optional[dict]:
    """{"commit", "dirty", "source"} of the checkout the harness is imported from (outside git: only ``source``,
    :func:`source_digest`)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return {"commit": None, "dirty": None, "source": source_digest()}
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", ""
    return {"commit": commit or None, "dirty": bool(dirty) if commit else None, "source": source_digest()}


def _code_name(code: Optional[dict]) -> str:
    if not code:
        return "unrecorded code"
    c = code.get("commit")
    return (f"commit {c[:12]}{' (dirty tree)' if code.get('dirty') else ''}" if c else "code outside git") + \
        (f", source {code['source']}" if code.get("source") else "")


def resume_problem(before: Optional[dict], now: dict, allow_new_code: bool = False) -> Optional[str]:
    """Why a run whose last attempt recorded provenance ``before`` cannot resume bit for bit under ``now`` (this
    attempt's): another numerics mode, another torch thread count (kernels split work by it), or other product
    source (unless ``allow_new_code``); one line ending in what to do, or None. A run from before provenance was
    recorded (``before`` None) resumes as it always did."""
    if not before:
        return None
    b, n = before.get("numerics") or {}, now.get("numerics") or {}
    if b.get("mode") and n.get("mode") and b["mode"] != n["mode"]:
        return (f"it ran in {b['mode']} numerics and this process runs {n['mode']} (a GRPO_HARNESS_NUMERICS in the "
                f"environment?): resume it in {b['mode']} numerics")
    if b.get("threads") and n.get("threads") and b["threads"] != n["threads"]:
        return (f"it ran on {b['threads']} torch thread(s) and this process runs {n['threads']} (results depend on "
                f"the count): resume it with train.threads={b['threads']} (a sweep: launcher.cpus per run)")
    bc, nc = before.get("code") or {}, now.get("code") or {}
    if not allow_new_code and bc.get("source") and nc.get("source") and bc["source"] != nc["source"]:
        return (f"it ran on {_code_name(bc)} and this is {_code_name(nc)}: resume it with the code it started with, "
                f"or set {ENV_RESUME_NEW_CODE}=1 to go on with this code (each attempt's code is recorded)")
    return None


def carry_earlier(before: Optional[dict], now: dict) -> dict:
    """``now`` with the earlier attempts' provenance that differed in code (``earlier``: oldest first), so a run
    resumed with new code records every code it ran on, not only the last."""
    if not before:
        return now
    earlier = list(before.get("earlier") or [])
    if (before.get("code") or {}).get("source") != (now.get("code") or {}).get("source"):
        earlier.append({k: v for k, v in before.items() if k != "earlier"})
    return {**now, "earlier": earlier} if earlier else now


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
    commit = ("not a git checkout" if not code or not code.get("commit")
              else f"{code.get('commit')}{' (dirty tree)' if code.get('dirty') else ''}")
    if code and code.get("source"):
        commit += f", source {code['source']}"
    for e in prov.get("earlier") or []:
        commit += f"; resumed from an attempt on {_code_name(e.get('code'))}"
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
