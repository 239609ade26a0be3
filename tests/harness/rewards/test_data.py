"""Labelled examples and the replay of earlier rounds: exact counts."""
import json
import random

import pytest

from evals.arith import ArithTask
from harness.rewards.data import Example, heldout, label_exact, load_examples, replay_count, replay_draw


@pytest.mark.parametrize("n,fraction,want", [(0, 0.1, 0), (9, 0.1, 1), (10, 0.1, 1), (14, 0.1, 1), (15, 0.1, 2),
                                            (25, 0.1, 3), (1024, 0.1, 102), (2048, 0.1, 205), (7, 1.0, 7),
                                            (7, 0.0, 0), (3, 0.5, 2)])
def test_replay_count_is_the_fraction_rounded_half_up(n, fraction, want):
    assert replay_count(n, fraction) == want


def test_replay_draw_takes_that_many_distinct_earlier_examples():
    history = [Example(question=f"q{i}", completion="", finished=True, outcome=0.0, problem_id=str(i)) for i in range(25)]
    got = replay_draw(history, 0.1, random.Random(0))
    assert len(got) == 3 and len({e.problem_id for e in got}) == 3 and all(e in history for e in got)
    assert replay_draw(history, 0.1, random.Random(0)) == got  # seeded


def test_label_exact_and_round_trip(tmp_path):
    task = ArithTask()
    p = task.make_problem("3+4*2-5")
    ex = label_exact(task, [p, p], ["4*2=8;3+8=11;11-5=6;#6", "#6"], [True, True], with_steps=True, round_=2)
    assert [e.outcome for e in ex] == [1.0, 0.0]
    assert ex[0].steps == [[1.0, 6], [1.0, 13], [1.0, 20], [1.0, 22]] and ex[1].steps == [[0.0, 2]] * 4
    assert ex[0].round == 2 and ex[0].problem_id == "3+4*2-5"
    assert label_exact(task, [p], ["#6"], [True], with_steps=False)[0].steps == []
    assert Example.from_dict(ex[0].to_dict()) == ex[0]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({**e.to_dict(), "split": s}) + "\n"
                                                 for e, s in zip(ex, ["train", "heldout"])))
    assert load_examples(tmp_path) == [ex[0]] and load_examples(tmp_path, "heldout") == [ex[1]]
    assert load_examples(tmp_path / "missing") == []


def test_heldout_split_is_by_problem_and_near_the_fraction():
    ids = [str(i) for i in range(4000)]
    share = sum(heldout(i, 0.2) for i in ids) / len(ids)
    assert 0.17 < share < 0.23
    assert all(heldout(i, 0.2) == heldout(i, 0.2) for i in ids[:50])
