"""The declared dependencies say what the code needs: every third-party module that product code
imports is declared (core when imported at module level, core or an extra when imported inside a
function), every declared lower bound is a version CI installs (.ci/constraints.txt; torch: the Makefile), and no core
dependency is unused."""
import ast
import importlib.metadata as md
import re
import sys
import tomllib

import pytest

from support_paths import REPO

PACKAGES = ("algorithms", "evals", "harness")
OURS = set(PACKAGES)
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _declared(reqs) -> dict:
    out = {}
    for r in reqs:
        name = _name(r)
        if name != "grpo-harness":
            m = re.search(r">=\s*([0-9][0-9.]*)|==\s*([0-9][0-9.]*)", r)
            out[name] = (m.group(1) or m.group(2)) if m else None
    return out


CORE = _declared(PYPROJECT["dependencies"])
EXTRAS = {k: _declared(v) for k, v in PYPROJECT["optional-dependencies"].items()}
ANY = {**{n: v for e in EXTRAS.values() for n, v in e.items()}, **CORE}
PINNED = {_name(line): line.split("==", 1)[1].strip()
          for line in (REPO / ".ci" / "constraints.txt").read_text().splitlines()
          if line.strip() and not line.startswith("#")}
# torch is installed by the Makefile on its own (a CUDA build installed first is kept)
PINNED["torch"] = re.search(r"torch==([0-9.]+)", (REPO / "Makefile").read_text()).group(1)


def _imports():
    """(top-level module name, at module level?) for every import in product code."""
    seen = set()
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            tree = ast.parse(path.read_text())
            top = {id(n) for n in tree.body}
            guarded = {id(c) for n in tree.body if isinstance(n, ast.Try) for c in ast.walk(n)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for n in names:
                    seen.add((n.split(".")[0], id(node) in top and id(node) not in guarded, str(path.relative_to(REPO))))
    return seen


_DISTS = md.packages_distributions()


def _distributions(module: str) -> set:
    """The installed distributions that provide ``module`` (mlflow: mlflow, mlflow-skinny, ...)."""
    return {d.lower().replace("_", "-") for d in _DISTS.get(module, [])}


IMPORTS = _imports()
THIRD_PARTY = sorted({(m, top, p) for m, top, p in IMPORTS
                      if m not in OURS and m not in sys.stdlib_module_names and m != "__future__"})


@pytest.mark.parametrize("module,top,path", THIRD_PARTY, ids=[f"{p}:{m}" for m, _, p in THIRD_PARTY])
def test_every_third_party_import_is_declared(module, top, path):
    dists = _distributions(module)
    if not dists:
        pytest.skip(f"{module} is not installed here (an optional backend such as vllm)")
    if top:
        assert dists & set(CORE), f"{path} imports {module} ({dists}) at module level, but it is not a core dependency"
    else:
        assert dists & set(ANY), f"{path} imports {module} ({dists}), which no dependency list of pyproject.toml declares"


def test_every_core_dependency_is_used():
    used = set().union(*(_distributions(m) for m, _, _ in IMPORTS))
    unused = sorted(d for d in CORE if d not in used)
    assert not unused, f"core dependencies no product code imports: {unused}"


UNTESTED = {"vllm": "needs CUDA, which CI lacks: its bound is the API harness/engine/vllm_sampler.py calls"}


@pytest.mark.parametrize("name", sorted(n for n, v in ANY.items() if v is not None and n not in UNTESTED))
def test_every_declared_bound_is_the_tested_version(name):
    """A lower bound in pyproject.toml is the version CI installs (its prefix: >=2.4 for 2.4.6)."""
    assert name in PINNED, f"{name} has a bound in pyproject.toml but no tested version in .ci/constraints.txt"
    bound = ANY[name]
    assert PINNED[name] == bound or PINNED[name].startswith(bound + "."), \
        f"{name}: pyproject.toml says {bound}, CI installs {PINNED[name]}"
