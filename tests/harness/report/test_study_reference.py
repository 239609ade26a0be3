"""The committed DeepSeekMath study report is recomputable: `harness report
results/reference/deepseekmath_small/runs --study --output-dir OUT`, run on a copy of the committed
raw data (every study run and the learning-rate selection in its `selection/` subfolder), writes
report.md, claims.csv and table5.csv byte for byte as committed (issue 30, item 1).

The copy lives at another path than the committed folder, so the report cannot depend on where the
runs are. Until the study v2 report is committed (its report.md has the learning-rate selection
table), the committed report is the 2026-11-23 one, built from runs that were never committed, and
the test says so as a skip."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.cli.main import main as harness_main

REF = Path(__file__).resolve().parents[3] / "results" / "reference" / "deepseekmath_small"
COMPARED = ("report.md", "claims.csv", "table5.csv")


def _is_v2() -> bool:
    md = REF / "report.md"
    return (REF / "runs").is_dir() and md.is_file() and "## Learning-rate selection" in md.read_text()


@pytest.mark.skipif(not _is_v2(), reason="the committed study report is the 2026-11-23 one (no committed runs "
                                          "behind it); study v2's report is not committed yet")
def test_committed_study_report_recomputes_byte_identical(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(REF / "runs", runs)
    out = tmp_path / "out"
    assert harness_main(["report", str(runs), "--study", "--output-dir", str(out)]) == 0
    for name in COMPARED:
        assert (out / name).read_bytes() == (REF / name).read_bytes(), f"{name} differs from the committed one"
