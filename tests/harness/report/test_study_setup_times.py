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



def test_the_machines_time_is_the_union_of_run_and_setup_intervals_in_parts(tmp_path):
    """A study run in parts: the report's machine time is the union of the runs' [started, ended] and
    the setup jobs' [started, started + setup seconds], split where the machine sat idle over 5 min."""
    from _fake_results import make_study_run
    from harness.report.study import DESIGN, busy_parts, header, time_summary
    from harness.report.study_data import load_study, setup_spans

    assert busy_parts([]) == []
    assert busy_parts([(10.0, 20.0), (0.0, 5.0), (15.0, 30.0), (330.0, 400.0), (701.0, 710.0)]) == \
        [(0.0, 400.0), (701.0, 710.0)]     # gaps 5 -> 10 and 30 -> 330 (300 s) count in the part; 400 -> 701 splits
    sweep = tmp_path / "study"
    t0 = 1_800_000_000.0   # 2027-01-15 08:00 UTC
    acc = {"acc": 0.6, "ood": 0.2, "pass": [0.6], "maj": [0.6]}
    # part 1: seed 0's setup (1,000 s), then its two runs side by side; part 2 (a day later): seed 1
    _summary(sweep / SETUP_DIR / "seed0", status="interrupted", started=t0, ended=t0 + 5000.0,
             setup_seconds={"warmup_build": 600.0, "warmup_wait": 0.0, "initial_eval": 400.0})
    make_study_run(sweep, "grpo", 0, start=acc, final=acc, rss=700.0, started=t0 + 1001.0, wall=900.0)
    make_study_run(sweep, "ppo", 0, start=acc, final=acc, rss=700.0, started=t0 + 1002.0, wall=1200.0)
    _summary(sweep / SETUP_DIR / "seed1", status="interrupted", started=t0 + 86400.0,
             setup_seconds={"warmup_build": 500.0, "warmup_wait": 0.0, "initial_eval": 300.0})
    make_study_run(sweep, "grpo", 1, start=acc, final=acc, rss=700.0, started=t0 + 86400.0 + 900.0, wall=800.0)
    assert setup_spans(sweep) == [(t0, t0 + 1000.0), (t0 + 86400.0, t0 + 86400.0 + 800.0)]
    t = time_summary(load_study(sweep))
    # part 1: t0 .. t0 + 2202 (the PPO run's end); part 2: setup end at +800, run from +900 (a 100 s gap) to +1700
    assert t["parts"] == [(t0, t0 + 2202.0), (t0 + 86400.0, t0 + 86400.0 + 1700.0)]
    assert t["busy"] == 2202.0 + 1700.0
    text = "\n".join(header(load_study(sweep), DESIGN))
    assert ("the union of the runs' and setup jobs' intervals): 3902 s in 2 parts (a part ends at an idle gap over "
            "5 min): 2027-01-15 08:00-08:36 UTC (2202 s); 2027-01-16 08:00-08:28 UTC (1700 s). Timed on") in text
    # a part across midnight names both dates
    from harness.report.study import _parts_text
    assert _parts_text([(t0 + 15.5 * 3600, t0 + 16.5 * 3600)]) == "2027-01-15 23:30-2027-01-16 00:30 UTC (3600 s)"
