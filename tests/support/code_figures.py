"""Size figures of the product's code: lines, guard code, long files / classes / functions, back arrows between floors.

    python tests/support/code_figures.py                 # this checkout
    python tests/support/code_figures.py --root DIR      # another checkout (e.g. a worktree of an older commit)

Reads the source with ``ast`` (nothing is imported). The product is ``algorithms/``, ``evals/`` and ``harness/``
(``*.py``). Guard code: the lines of functions whose name says they check input (``check``, ``problem``,
``refus``, ``valid``, ``invalid``, ``bad``), by package; a rough, reproducible proxy, not a hand count. Back arrows:
package-level import edges (module level, and ``importlib.import_module`` / ``lazy`` loads) against the floors, as
``tests/support/import_graph.py`` (whose walk, resolution and floor rule this script uses) judges them.
"""
from __future__ import annotations

import argparse
import ast
import re
from collections import Counter
from pathlib import Path

import import_graph  # tests/support/import_graph.py: module walk, import resolution, floors

GUARD = re.compile(r"check|problem|refus|valid|invalid|bad", re.IGNORECASE)


def figures(root: Path) -> dict:
    import_graph.ROOT = root  # the checker's own module walk, resolution and floors, over this checkout
    known = import_graph.modules()
    lines, guard, long_files, long_classes, long_funcs = 0, Counter(), [], [], []
    edges = set()
    for mod, p in known.items():
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
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > 60:
                long_funcs.append((f"{rel}:{node.name}", size))
        for node in tree.body + [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body]:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and GUARD.search(node.name):
                guard["/".join(rel.split("/")[:2]) if rel.startswith("harness/") else rel.split("/")[0]] += (
                    node.end_lineno - node.lineno + 1)
        top, _ = import_graph.imports(p, mod, known)
        for t in top | import_graph.deferred(p, known):
            a, b = import_graph.harness_package(mod), import_graph.harness_package(t)
            if a and b and a != b:
                edges.add((a, b, import_graph.back_arrow(mod, t) is not None))
    pairs = {(a, b) for a, b, _ in edges}
    return {"product lines": lines, "guard lines": sum(guard.values()), "guard lines by place": dict(guard.most_common()),
            "files over 500 lines": sorted(long_files, key=lambda x: -x[1]),
            "classes over 250 lines": sorted(long_classes, key=lambda x: -x[1]),
            "functions over 60 lines": sorted(long_funcs, key=lambda x: -x[1]),
            "back arrows (package level)": sorted({(a, b) for a, b, back in edges if back}),
            "packages importing each other": sorted((a, b) for a, b in pairs if (b, a) in pairs and a < b)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2]))
    a = ap.parse_args()
    if not (Path(a.root) / "harness").is_dir():
        ap.error(f"--root {a.root}: not a checkout of this project (no harness/ folder)")
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
