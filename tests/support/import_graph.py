"""Import graph of this project's own packages: layer violations, cycles, function-level imports.

    python tests/support/import_graph.py            # summary
    python tests/support/import_graph.py --edges    # every module-level edge too
    python tests/support/import_graph.py --map      # the module map (first docstring line of each module)

Reads the source with ``ast`` (nothing is imported). Layers, lowest first: ``algorithms`` <-
``evals`` <- ``harness``; an import from a lower layer into a higher one is a violation. Inside
``harness`` its packages stand on floors (:data:`FLOORS`, lowest first): a module may import a
package of a lower floor, never one of a higher floor nor another package of its own floor; such an
edge (an import at module level or in a function, or a load by name: ``importlib.import_module("m")``,
``lazy("m")``) is a back arrow, and ``harness.foundation``, the ground floor, imports nothing of the project outside
itself (not even ``algorithms`` or ``evals``). A cycle is
a strongly connected set of modules through module-level imports. A function-level import is an
``import`` of one of our modules inside a function or method body (it hides the real graph); the
bench scripts' are counted too (they import the harness at the top).
Exit status 1 if there is any violation, back arrow or cycle, so CI can run it.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("algorithms", "evals", "harness")
LAYER = {p: i for i, p in enumerate(PACKAGES)}
FLOORS = (("foundation",), ("config",), ("rundir",), ("admission",), ("engine",), ("tracking", "report", "rewards"),
          ("train",), ("sweep",), ("cli",))
"""The floors of harness's packages, lowest first; the packages of one floor do not import each other."""
FLOOR = {pkg: i for i, floor in enumerate(FLOORS) for pkg in floor}
GROUND = "foundation"
"""The ground floor: imports nothing of the project but itself."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            out[module_name(p)] = p
    return out


def resolve(name: str, known: dict) -> str | None:
    """The longest known module that ``name`` (a dotted import target) lies in."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in known:
            return cand
        parts.pop()
    return None


DEFERRED_CALLS = {"import_module", "lazy"}  # importlib.import_module("m"), harness.cli.polish.lazy("m")


def deferred(path: Path, known: dict) -> set[str]:
    """Our modules loaded by name at run time (``importlib.import_module("m")``, ``lazy("m")``):
    not import statements, but edges all the same, so the layer check covers them."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) in DEFERRED_CALLS):
            if r := resolve(node.args[0].value, known):
                out.add(r)
    return out


def imports(path: Path, mod: str, known: dict) -> tuple[set[str], list[tuple[int, str]]]:
    """(module-level targets, [(line, target)] of function-level imports) among our modules."""
    tree = ast.parse(path.read_text(), str(path))
    top: set[str] = set()
    local: list[tuple[int, str]] = []
    is_pkg = path.name == "__init__.py"

    def targets(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:
            pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        return [f"{base}.{a.name}" for a in node.names] + [base]

    def visit(node, in_func: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found = {r for t in targets(child) if (r := resolve(t, known)) and r != mod}
                for r in found:
                    (local.append((child.lineno, r)) if in_func else top.add(r))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True)
            else:
                visit(child, in_func)

    visit(tree, False)
    return top, local


def harness_package(mod: str) -> str | None:
    """``config`` for ``harness.config.schema``; None for a module outside harness's packages."""
    parts = mod.split(".")
    return parts[1] if parts[0] == "harness" and len(parts) > 1 else None


def floors_text() -> str:
    return " < ".join(" = ".join(floor) for floor in FLOORS)


def back_arrow(mod: str, target: str) -> str | None:
    """Why the edge ``mod -> target`` goes against the floors (None when it does not)."""
    a, b = harness_package(mod), harness_package(target)
    if a == GROUND and b != GROUND:
        return f"{GROUND} imports nothing of the project outside itself"
    if a is None or b is None or a == b:
        return None
    if a not in FLOOR or b not in FLOOR:
        return f"harness.{b if a in FLOOR else a} is on no floor (tests/support/import_graph.py FLOORS)"
    if FLOOR[b] > FLOOR[a]:
        return f"{a} is below {b}"
    if FLOOR[b] == FLOOR[a]:
        return f"{a} and {b} share a floor"
    return None


def first_line(path: Path) -> str:
    """The first line of a module's docstring ('' when it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    return doc.strip().split("\n")[0].strip()


def module_map(known: dict) -> str:
    """Markdown: one section per package, one line per module with its first docstring line."""
    out, section = [], None
    for mod in sorted(known, key=lambda m: (LAYER[m.split(".")[0]], m)):
        pkg = ".".join(mod.split(".")[:2]) if mod.count(".") >= 2 or known[mod].name == "__init__.py" else mod.split(".")[0]
        if pkg != section:
            section = pkg
            out.append(f"\n**`{pkg.replace('.', '/')}/`**\n")
        if known[mod].name == "__init__.py" and mod == pkg:
            out.append(f"{first_line(known[mod])}\n")
            continue
        out.append(f"- `{known[mod].relative_to(ROOT)}`: {first_line(known[mod])}")
    return "\n".join(out).strip() + "\n"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--edges", action="store_true", help="print every module-level edge")
    ap.add_argument("--map", action="store_true", help="print the module map as Markdown and exit")
    args = ap.parse_args(argv)
    known = modules()
    if args.map:
        print(module_map(known))
        return 0
    graph, local_imports, violations, back = {}, [], [], []
    for mod, path in known.items():
        top, local = imports(path, mod, known)
        graph[mod] = top
        local_imports += [(mod, line, t) for line, t in local]
        for t in top | {t for _, t in local} | deferred(path, known):
            if LAYER[t.split(".")[0]] > LAYER[mod.split(".")[0]]:
                violations.append((mod, t))
            if why := back_arrow(mod, t):
                back.append((mod, t, why))
    cyc = cycles(graph)
    full = {m: graph[m] | {t for mm, _, t in local_imports if mm == m} for m in graph}
    cyc_full = [c for c in cycles(full) if c not in cyc]
    print(f"modules: {len(known)}  module-level edges: {sum(map(len, graph.values()))}")
    print(f"layer violations (algorithms <- evals <- harness): {len(violations)}")
    for a, b in sorted(set(violations)):
        print(f"  {a} -> {b}")
    print(f"floors of harness's packages, lowest first: {floors_text()}")
    print(f"back arrows: {len(back)}")
    for a, b, why in sorted(set(back)):
        print(f"  {a} -> {b} ({why})")
    print(f"import cycles: {len(cyc)}")
    for c in cyc:
        print("  " + " <-> ".join(c))
    print(f"further cycles through function-level imports: {len(cyc_full)}")
    for c in cyc_full:
        print("  " + " <-> ".join(c))
    print(f"function-level imports of our own modules: {len(local_imports)}")
    for mod, line, t in local_imports:
        print(f"  {known[mod].relative_to(ROOT)}:{line} -> {t}")
    bench = [(p, line, t) for p in sorted((ROOT / "bench").glob("*.py"))
             for line, t in imports(p, module_name(p), known)[1]]
    print(f"function-level imports of our own modules in bench/: {len(bench)}")
    for p, line, t in bench:
        print(f"  {p.relative_to(ROOT)}:{line} -> {t}")
    if args.edges:
        for mod in sorted(graph):
            for t in sorted(graph[mod]):
                print(f"edge {mod} -> {t}")
    return 1 if violations or back or cyc or cyc_full else 0


if __name__ == "__main__":
    sys.exit(main())
