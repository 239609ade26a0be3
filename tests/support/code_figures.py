"""Size figures of the product's code: lines, guard code, long files / classes / functions, back arrows between floors.

    python tests/support/code_figures.py                 # this checkout
    python tests/support/code_figures.py --root DIR      # another checkout (e.g. a worktree of an older commit)

Reads the source with ``ast`` (nothing is imported). The product is ``algorithms/``, ``evals/`` and ``harness/``
(``*.py``). Guard code: the lines of functions whose name says they check input (``check``, ``problem``,
``refus``, ``valid``, ``invalid``, ``bad``), by package; a rough, reproducible proxy, not a hand count. Back arrows:
package-level import edges (module level, and ``importlib.import_module("...")`` loads) that point from a lower floor
of ``harness`` to a higher one, or between two packages of one floor, with the floors of
``tests/support/import_graph.py`` when it defines ``FLOORS`` (else the order below).
"""
from __future__ import annotations

import argparse
import ast
import re
from collections import Counter
from pathlib import Path

PACKAGES = ("algorithms", "evals", "harness")
FLOORS = [("foundation",), ("config",), ("rundir",), ("engine",), ("tracking", "report", "rewards"), ("train",),
          ("sweep",), ("cli",)]
GUARD = re.compile(r"check|problem|refus|valid|invalid|bad", re.IGNORECASE)


def _files(root: Path) -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]


def _module(root: Path, p: Path) -> str:
    parts = list(p.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(tree: ast.Module) -> set[str]:
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str) and getattr(node.func, "attr", getattr(node.func, "id", ""))
                == "import_module"):
            out.add(node.args[0].value)
    return out


def _package(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if parts[0] == "harness" and len(parts) > 1 else None


def figures(root: Path) -> dict:
    files = _files(root)
    mods = {_module(root, p): p for p in files}
    lines, guard, long_files, long_classes, long_funcs = 0, Counter(), [], [], []
    edges = set()
    for p in files:
        text = p.read_text()
        tree = ast.parse(text)
        n = len(text.splitlines())
        lines += n
        rel = str(p.relative_to(root))
        if n > 500:
            long_files.append((rel, n))
        for node in ast.walk(tree):
            size = (node.end_lineno - node.lineno + 1) if hasattr(node, "end_lineno") else 0
            if isinstance(node, ast.ClassDef) and size > 250:
                long_classes.append((f"{rel}:{node.name}", size))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if size > 60:
                    long_funcs.append((f"{rel}:{node.name}", size))
        for node in tree.body + [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body]:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and GUARD.search(node.name):
                guard["/".join(rel.split("/")[:2]) if rel.startswith("harness/") else rel.split("/")[0]] += (
                    node.end_lineno - node.lineno + 1)
        src = _package(_module(root, p))
        for t in _targets(tree):
            parts = t.split(".")
            while parts and ".".join(parts) not in mods:
                parts.pop()
            dst = _package(".".join(parts)) if parts else None
            if src and dst and src != dst:
                edges.add((src, dst))
    floor = {pkg: i for i, fl in enumerate(FLOORS) for pkg in fl}
    back = sorted((a, b) for a, b in edges if a in floor and b in floor and floor[a] <= floor[b])
    mutual = sorted((a, b) for a, b in edges if (b, a) in edges and a < b)
    return {"product lines": lines, "guard lines": sum(guard.values()), "guard lines by place": dict(guard.most_common()),
            "files over 500 lines": sorted(long_files, key=lambda x: -x[1]),
            "classes over 250 lines": sorted(long_classes, key=lambda x: -x[1]),
            "functions over 60 lines": sorted(long_funcs, key=lambda x: -x[1]),
            "back arrows (package level)": back, "packages importing each other": mutual}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2]))
    a = ap.parse_args()
    f = figures(Path(a.root))
    for k, v in f.items():
        if isinstance(v, list):
            print(f"{k}: {len(v)}")
            for item in v:
                print(f"  {item}")
        else:
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
