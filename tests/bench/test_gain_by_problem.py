"""bench/gain_by_problem.py against a hand computation: a run's final minus its start per held-out problem, the
paired t-interval over the problems, the gained / lost counts."""
import json
import sys

import numpy as np
import pytest
from scipy import stats

from harness.rundir.read import load_run
from support_paths import REPO

sys.path.insert(0, str(REPO / "bench"))
import gain_by_problem as gbp  # noqa: E402


def _records(path, correct, ids=None):
    ids = ids or [f"p{i}" for i in range(len(correct))]
    path.write_text("".join(json.dumps({"id": i, "greedy": {"correct": bool(c)}}) + "\n" for i, c in zip(ids, correct)))


def _run(root, name, start, final, last_step=96):
    """A run folder as the trainer leaves it, as far as the reader looks: per-problem records at the start, a
    middle point and the end (and the validation half), the evaluation rows, the summary's start and end."""
    d = root / name
    (d / "eval").mkdir(parents=True)
    acc = {0: float(np.mean(start)), 32: 0.0, last_step: float(np.mean(final))}
    (d / "summary.json").write_text(json.dumps({
        "run_id": name, "status": "finished", "config": {"task": {"name": "wordarith"}},
        "initial_eval": {"eval/wordarith/acc": acc[0]}, "final_eval": {"eval/wordarith/acc": acc[last_step]}}))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "eval/wordarith/acc": v}) + "\n"
                                             for k, v in acc.items()))
    _records(d / "eval" / "wordarith_0.jsonl", start)
    _records(d / "eval" / "wordarith_32.jsonl", [0] * len(start))  # a middle point: not the final one
    _records(d / "eval" / "wordarith_validation.jsonl", [1] * len(start))
    _records(d / "eval" / f"wordarith_{last_step}.jsonl", final)
    return d


def test_the_gain_and_its_interval_equal_a_hand_computation(tmp_path, capsys):
    rng = np.random.default_rng(1)
    start = rng.integers(0, 2, 500)
    final = np.where(rng.random(500) < 0.2, 1, start)        # some problems go right, none go wrong
    final[:7] = 1 - start[:7]                                   # ... but a few flip either way
    _run(tmp_path, "grpo-s0-a", start, final)
    assert gbp.main([str(tmp_path)]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    d = (final - start).astype(float)
    half = stats.t.ppf(0.975, 499) * d.std(ddof=1) / np.sqrt(500)
    assert row[0] == "grpo-s0-a" and row[2] == "500"
    assert float(row[3]) == pytest.approx(100 * start.mean(), abs=0.05)
    assert float(row[4]) == pytest.approx(100 * final.mean(), abs=0.05)
    assert float(row[5]) == pytest.approx(100 * d.mean(), abs=0.05)
    lo, hi = (float(x) for x in " ".join(row[6:8]).strip("[]").split(","))
    assert lo == pytest.approx(100 * (d.mean() - half), abs=0.05)
    assert hi == pytest.approx(100 * (d.mean() + half), abs=0.05)
    assert int(row[8]) == int((d > 0).sum()) and int(row[9]) == int((d < 0).sum())
    assert row[10] == ("yes" if d.mean() - half > 0 else "no")


def test_problems_are_paired_by_id_not_by_line(tmp_path):
    d = _run(tmp_path, "r", [1, 0, 0], [0, 0, 1])
    _records(d / "eval" / "wordarith_96.jsonl", [0, 0, 1], ids=["p2", "p1", "p0"])   # p0 right in both
    g = gbp.gain(load_run(d), "wordarith")
    assert g["gain"] == 0.0 and g["gained"] == 0 and g["lost"] == 0


def test_a_run_scored_on_other_problems_is_named(tmp_path):
    d = _run(tmp_path, "r", [1, 0], [1, 0])
    _records(d / "eval" / "wordarith_96.jsonl", [1, 0], ids=["p0", "q9"])
    assert gbp.gain(load_run(d), "wordarith") == {"why": "the start and the final evaluation scored other problems"}


def test_records_that_disagree_with_the_summary_are_not_used(tmp_path):
    d = _run(tmp_path, "r", [1, 0], [1, 1])
    _records(d / "eval" / "wordarith_96.jsonl", [0, 0])               # the summary says 100% at the end
    assert "differs from the summary" in gbp.gain(load_run(d), "wordarith")["why"]
