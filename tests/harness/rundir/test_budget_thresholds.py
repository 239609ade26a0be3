"""Evaluation thresholds land on stage boundaries shared by every algorithm; overshoot is bounded and recorded."""
from harness.config.schema import BudgetConfig
from harness.foundation.budget import (eval_thresholds, new_counters, overshoot, stage_samples, threshold_warning,
                                       thresholds_passed)


def test_samples_thresholds_are_multiples_of_the_stage():
    b = BudgetConfig(unit="samples", amount=32000, eval_points=4)
    per = stage_samples(32, 8)
    assert per == 256
    # 8000/256 = 31.25 -> 31 stages; 62.5 -> 63; 93.75 -> 94; the last stage is cut to 32000
    assert eval_thresholds(b, per) == [7936.0, 16128.0, 24064.0, 32000]
    w = threshold_warning(b, per)
    assert w is not None and "8000 samples is not a multiple of the 256" in w and "7936, 16128, 24064, 32000" in w
    # without the stage size: the even quarters
    assert eval_thresholds(b) == [8000.0, 16000.0, 24000.0, 32000.0]


def test_samples_thresholds_exact_quarters_when_divisible():
    b = BudgetConfig(unit="samples", amount=32768, eval_points=4)
    assert eval_thresholds(b, 256) == [8192.0, 16384.0, 24576.0, 32768]
    assert threshold_warning(b, 256) is None
    b = BudgetConfig(unit="samples", amount=6144, eval_points=4)
    assert eval_thresholds(b, 256) == [1536.0, 3072.0, 4608.0, 6144]
    assert threshold_warning(b, 256) is None


def test_samples_thresholds_at_least_one_stage_and_increasing():
    b = BudgetConfig(unit="samples", amount=600, eval_points=4)  # 150 a point, 256 a stage
    assert eval_thresholds(b, 256) == [256.0, 512.0, 600.0, 600]
    # every algorithm with the same batch shape passes them at the same sample counts
    consumed = [256, 512, 600]
    passed = [thresholds_passed(eval_thresholds(b, 256), 0, c) for c in consumed]
    assert passed == [1, 2, 4]


def test_steps_thresholds_are_whole_steps():
    b = BudgetConfig(unit="steps", amount=10, eval_points=4)
    assert eval_thresholds(b) == [3.0, 5.0, 8.0, 10]
    assert "2.5 steps is not whole" in threshold_warning(b)
    assert threshold_warning(BudgetConfig(unit="steps", amount=8, eval_points=4)) is None


def test_tokens_and_seconds_keep_even_thresholds():
    b = BudgetConfig(unit="tokens", amount=1000, eval_points=4)
    assert eval_thresholds(b, 256) == [250.0, 500.0, 750.0, 1000.0]
    assert threshold_warning(b, 256) is None


def test_overshoot_recorded_and_bounded():
    c = new_counters()
    c.update({"step": 5, "samples": 1280, "tokens": 1130, "seconds": 12.5})
    assert overshoot(BudgetConfig(unit="tokens", amount=1000, eval_points=2), c, 256 * 40) == {
        "amount": 130, "fraction": 0.13, "bound": 10240}
    assert overshoot(BudgetConfig(unit="seconds", amount=10.0, eval_points=2), c, 3.0) == {
        "amount": 2.5, "fraction": 0.25, "bound": 3.0}
    assert overshoot(BudgetConfig(unit="samples", amount=1280, eval_points=2), c) == {
        "amount": 0, "fraction": 0.0, "bound": 0}
    assert overshoot(BudgetConfig(unit="steps", amount=5, eval_points=2), c) == {
        "amount": 0, "fraction": 0.0, "bound": 0}
