"""Equivalence-checking worker process for :mod:`evals.grading` (not imported by it).

Run as a script (``python evals/_verify_worker.py``); it reads one JSON request per line
on stdin, ``{"pred": str, "gold": str}``, and writes one JSON reply per line on stdout,
``{"ok": bool, "how": str}``. It prints ``{"ready": true}`` once its imports are done.

It is deliberately self-contained (imports nothing from the project) and runs
``math_verify`` with its own signal-based timeouts switched off: the parent process
enforces the per-answer time limit by killing this process when a reply is late, so a
hung sympy computation costs one restart, never a hung trainer. Without math_verify (or
when math_verify cannot parse one side) a small sympy fallback is used.
"""
import json
import os
import sys

# This file lives in evals/, which also holds datasets.py etc.: keep that folder off the
# import path so nothing here can shadow a real package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def _limit_resources():
    try:  # die with the parent, even while stuck in C code that holds the GIL
        import ctypes
        import signal
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    mb = int(os.environ.get("GRPO_HARNESS_VERIFY_MEM_MB", "3072") or 0)
    if mb > 0:
        try:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            lim = mb * 1024 * 1024
            if hard == resource.RLIM_INFINITY or hard > lim:
                resource.setrlimit(resource.RLIMIT_AS, (lim, hard))
        except Exception:
            pass


_CACHE: dict = {}
_CACHE_MAX = 20000


def _mv_parse(s):
    from math_verify import parse
    key = ("mv", s)
    if key in _CACHE:
        return _CACHE[key]
    out = []
    for text in ("\\boxed{" + s + "}", "$" + s + "$", s):
        try:
            out = parse(text, parsing_timeout=None)
        except Exception:
            out = []
        if out:
            break
    if len(_CACHE) > _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = out
    return out


# -- sympy fallback ----------------------------------------------------------------------
def _latex_to_sympy_text(s: str) -> str:
    import re
    s = s.replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\[dt]?frac\s*\{", r"\\frac{", s)
    for _ in range(20):  # innermost \frac{a}{b} / \sqrt{a} first
        new = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        new = re.sub(r"\\sqrt\[([^{}\]]*)\]\{([^{}]*)\}", r"((\2)**(1/(\1)))", new)
        new = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", new)
        if new == s:
            break
        s = new
    s = re.sub(r"\\sqrt\s*(\d+|[a-zA-Z])", r"sqrt(\1)", s)
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"((\1)/(\2))", s)
    s = (s.replace("\\cdot", "*").replace("\\times", "*").replace("\\pi", "pi").replace("^", "**")
         .replace("{", "(").replace("}", ")").replace("\\", ""))
    return s


def _sympy_parse(s: str):
    from sympy.parsing.sympy_parser import (convert_xor, implicit_multiplication_application, parse_expr,
                                            standard_transformations)
    tr = standard_transformations + (implicit_multiplication_application, convert_xor)
    return parse_expr(_latex_to_sympy_text(s), transformations=tr, evaluate=True)


def _split_top(s: str):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]


def _sympy_equal(pred: str, gold: str) -> bool:
    import sympy
    p, g = pred.strip(), gold.strip()
    if p[:1] + p[-1:] in ("()", "[]") and g[:1] + g[-1:] == p[:1] + p[-1:]:  # tuples: order matters
        ps, gs = _split_top(p[1:-1]), _split_top(g[1:-1])
        return len(ps) == len(gs) and all(_sympy_equal(a, b) for a, b in zip(ps, gs))
    a, b = _sympy_parse(p), _sympy_parse(g)
    try:
        if sympy.simplify(a - b) == 0:
            return True
    except Exception:
        pass
    try:
        return bool(abs(complex(sympy.N(a - b))) < 1e-9)
    except Exception:
        return False


def check(pred: str, gold: str):
    """(equal, how) for two extracted answers; never raises."""
    try:
        import math_verify  # noqa: F401
        have_mv = True
    except Exception:
        have_mv = False
    if have_mv:
        try:
            from math_verify import verify
            g, p = _mv_parse(gold), _mv_parse(pred)
            if g and p:
                return bool(verify(g, p, timeout_seconds=None)), "math_verify"
        except Exception:
            pass
    try:
        return _sympy_equal(pred, gold), "sympy"
    except Exception:
        return False, "error"


def main():
    _limit_resources()
    if os.environ.get("GRPO_HARNESS_VERIFY_PRELOAD", "1") != "0":
        try:
            import math_verify  # noqa: F401  (pay the import before the first timed request)
            import sympy  # noqa: F401
        except Exception:
            pass
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            ok, how = check(str(req["pred"]), str(req["gold"]))
        except BaseException as e:  # noqa: BLE001 (MemoryError, RecursionError, ...)
            ok, how = False, f"error: {type(e).__name__}"
        out.write(json.dumps({"ok": bool(ok), "how": how}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
