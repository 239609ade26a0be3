"""Paths the tests share: the repository root and this folder of test helpers (on sys.path through pyproject's pytest ``pythonpath``)."""
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
