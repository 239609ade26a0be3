"""The floor plan holds: imports point algorithms <- evals <- harness with no cycles and no
imports of our own modules inside functions; every module says its job in its first docstring
line; docs/architecture.md lists every module; core-path functions stay under 80 lines."""
import ast
import subprocess
import sys

import pytest

import import_graph  # tests/support/import_graph.py
from support_paths import REPO

CORE = ["harness/train/loop.py", "harness/engine/learner.py", "harness/sweep/plan.py", "harness/sweep/spec.py",
        "harness/sweep/run.py", "algorithms/objective.py"]
MAX_LINES = 80


def test_import_graph_has_no_violation_cycle_or_local_import():
    out = subprocess.run([sys.executable, str(REPO / "tests" / "support" / "import_graph.py")], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout
    assert "layer violations (algorithms <- evals <- harness): 0" in out.stdout
    assert "back arrows: 0" in out.stdout
    assert "import cycles: 0" in out.stdout
    assert "function-level imports of our own modules: 0" in out.stdout
    assert "function-level imports of our own modules in bench/: 0" in out.stdout


def test_the_checker_sees_a_violation_and_a_cycle(tmp_path, monkeypatch):
    for pkg, body in {"algorithms": "import evals.b\n", "evals": "import algorithms.a\n", "harness": ""}.items():
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text('"""x"""\n')
    (tmp_path / "algorithms" / "a.py").write_text('"""a"""\nimport evals.b\n')
    (tmp_path / "evals" / "b.py").write_text('"""b"""\nimport algorithms.a\n\ndef f():\n    import harness\n')
    monkeypatch.setattr(import_graph, "ROOT", tmp_path)
    assert import_graph.main([]) == 1


def _floors(root, modules: dict) -> None:
    """A tree of the three packages with harness's floors and ``modules`` ({dotted name: source})."""
    for pkg in ["algorithms", "evals", "harness"] + [f"harness/{p}" for floor in import_graph.FLOORS for p in floor]:
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").write_text('"""x"""\n')
    for name, body in modules.items():
        path = root / (name.replace(".", "/") + ".py")
        if not path.parent.is_dir():
            path.parent.mkdir()
            (path.parent / "__init__.py").write_text('"""x"""\n')
        path.write_text(f'"""{name}"""\n{body}')


CLEAN = {"harness.foundation.files": "import os\n", "harness.config.schema": "import harness.foundation.files\n",
         "harness.engine.models": "from harness.config import schema\n", "harness.report.tables": "",
         "harness.tracking.sync": "import importlib\nimportlib.import_module('harness.rundir')\n",
         "harness.cli.main": "import importlib\nimportlib.import_module('harness.engine.models')\n"}


ALONE = "foundation imports nothing of the project outside itself"


@pytest.mark.parametrize("name, body, arrow", [
    ("harness.config.paths", "import harness.engine.models\n",
     "harness.config.paths -> harness.engine.models (config is below engine)"),
    ("harness.config.paths", "import importlib\nmodels = importlib.import_module('harness.engine.models')\n",
     "harness.config.paths -> harness.engine.models (config is below engine)"),
    ("harness.config.paths", "import importlib\n\ndef f():\n    return importlib.import_module('harness.engine')\n",
     "harness.config.paths -> harness.engine (config is below engine)"),
    ("harness.train.loop", "from harness.cli.polish import lazy\nrun = lazy('harness.sweep.run')\n",
     "harness.train.loop -> harness.sweep (train is below sweep)"),
    ("harness.report.build", "from harness.tracking import sync\n",
     "harness.report.build -> harness.tracking.sync (report and tracking share a floor)"),
    ("harness.foundation.numerics", "import importlib\nimportlib.import_module('evals')\n",
     f"harness.foundation.numerics -> evals ({ALONE})"),
    ("harness.foundation.numerics", "from harness.config.schema import x\n",
     f"harness.foundation.numerics -> harness.config.schema ({ALONE})"),
    ("harness.newpkg.x", "import harness.config.schema\n",
     "harness.newpkg.x -> harness.config.schema (harness.newpkg is on no floor"),
])
def test_the_checker_sees_a_back_arrow(tmp_path, monkeypatch, capsys, name, body, arrow):
    """A planted import against the floors, at module level or through importlib, is a back arrow
    (exit 1); the same tree without it passes."""
    monkeypatch.setattr(import_graph, "ROOT", tmp_path)
    _floors(tmp_path, CLEAN)
    assert import_graph.main([]) == 0, capsys.readouterr().out
    assert "back arrows: 0" in capsys.readouterr().out
    _floors(tmp_path, {name: body})
    assert import_graph.main([]) == 1
    out = capsys.readouterr().out
    assert "back arrows: 0" not in out and f"  {arrow}" in out, out


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for pkg in ("algorithms", "evals", "harness")
                                        for p in (REPO / pkg).rglob("*.py")))
def test_every_module_says_its_job_and_is_on_the_map(path):
    assert import_graph.first_line(REPO / path), f"{path} has no docstring"
    assert f"`{path}`" in (REPO / "docs" / "architecture.md").read_text() or path.endswith("__init__.py"), \
        f"{path} is missing from docs/architecture.md (regenerate with tests/support/import_graph.py --map)"


@pytest.mark.parametrize("path", CORE)
def test_core_path_functions_are_short(path):
    tree = ast.parse((REPO / path).read_text())
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_LINES]
    assert not long, f"{path}: functions over {MAX_LINES} lines: {long}"


TOP_LEVEL = {"pyproject.toml", "README.md", "harness", "algorithms", "evals", "sweeps", "results", "tests", "bench",
             "docs", ".ci", ".gitignore", "Makefile"}


def test_top_level_holds_only_the_floor_plan():
    """Everything tracked sits in the top-level entries of the floor plan (configs live in harness/configs/)."""
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    top = {line.split("/", 1)[0] for line in out.stdout.splitlines() if line and (REPO / line).exists()}
    assert top <= TOP_LEVEL, f"unexpected top-level entries: {sorted(top - TOP_LEVEL)}"
    assert (REPO / "harness" / "configs" / "deepspeed" / "zero3.json").is_file()
