"""The study report's setup time (harness.report.study_data.setup_times, study.time_summary): each
seed's warm-up and start evaluation, built once in a setup job before the runs, counted once."""
from __future__ import annotations

import json

from harness.report.study_data import setup_times
from harness.rundir.layout import SETUP_DIR
from harness.rundir.read import setup_records


def _summary(d, **kw):
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(kw))


def test_setup_records_are_summaries_whose_setup_reached_the_start_evaluation(tmp_path):
    root = tmp_path / SETUP_DIR
    _summary(root / "a", status="finished", setup_seconds={"warmup_build": 500.5, "warmup_wait": 0.0,
                                                            "initial_eval": 400.25})
    # stopped after its setup (the study's throwaway runs): its setup is recorded all the same
    _summary(root / "b", status="interrupted", setup_seconds={"warmup_build": 0.0, "warmup_wait": 12.0,
                                                               "initial_eval": 300.0})
    _summary(root / "c", status="failed", setup_seconds={"warmup_build": 90.0})   # never reached the evaluation
    _summary(root / "d", status="finished")                                         # no setup recorded
    (root / "e").mkdir()                                                            # no summary
    assert setup_times(tmp_path) == [{"warmup_build": 500.5, "warmup_wait": 0.0, "initial_eval": 400.25},
                                     {"warmup_build": 0.0, "warmup_wait": 12.0, "initial_eval": 300.0}]
    assert [d.name for d, _ in setup_records(tmp_path)] == ["a", "b"]                # what `harness export` copies
    assert setup_times(tmp_path / "nowhere") == []
