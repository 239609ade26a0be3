"""Paths the tests share: the repository root, this folder of test helpers (on sys.path through pyproject's pytest ``pythonpath``), and the command-line tools of the Python that runs the tests."""
import os
import shutil
import sys
from pathlib import Path
from typing import Optional

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]


def python_tool(name: str) -> Optional[str]:
    """The command-line tool ``name`` a package installed with this Python (``wandb``, ``ray``): the one next
    to ``sys.executable`` (a virtual environment's ``bin/``, found whether or not the environment is activated:
    `make test PYTHON=.venv/bin/python` puts nothing on PATH), else the one on PATH, else None. ``sys.executable``
    is not resolved: a venv's python is a link to the base interpreter, whose folder lacks the venv's tools."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)
