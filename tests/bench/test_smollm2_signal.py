"""bench/smollm2_signal.py's GSM8K slices (the model is not loaded here): the counts that
docs/results.md and the script's docstring quote."""
import types

import pytest

from smollm2_signal import calc_steps, parse, select

from evals.catalog import get_task
from evals.tasks import TaskSpec


def test_calculator_step_slices_of_gsm8k_train(data_dir):
    task = get_task(TaskSpec(name="gsm8k", data_path=str(data_dir / "gsm8k"), eval_size=5))
    train = task.train_problems()
    assert len(train) == 7473
    assert sum(calc_steps(p) <= 1 for p in train) == 499
    assert sum(calc_steps(p) <= 2 for p in train) == 2674
    a = types.SimpleNamespace(split="train", max_calc=1, problems=16)
    easy = select(task, a)
    assert len(easy) == 16 and all(calc_steps(p) <= 1 for p in easy)
    assert easy[0] == next(p for p in train if calc_steps(p) <= 1)  # file order
    assert [p.id for p in select(task, types.SimpleNamespace(split="test", max_calc=None, problems=3))] == \
        ["test/0", "test/1", "test/2"]


@pytest.mark.parametrize("argv,message", [
    (["--problems", "0"], "--problems must be at least 1, not 0"),
    (["--group", "-1", "--greedy"], "--group must be at least 0 (0: greedy only, with --greedy), not -1"),
    (["--group", "0"], "--group 0 samples nothing: add --greedy"),
    (["--split", "test", "--max-calc", "1"], "--max-calc slices the training split"),
])
def test_bad_arguments_are_named_before_the_model_loads(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
