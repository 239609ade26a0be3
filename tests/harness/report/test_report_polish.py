"""Report cells people read: an accuracy interval never leaves 0-100%, a start every seed shares
says so instead of "± 0.0", budgets print as integers, and wide tables scroll."""
import numpy as np
import pandas as pd

from harness.report.tables import _cell, format_cell


def test_an_accuracy_interval_is_cut_to_its_range():
    assert format_cell("arith/acc", 0.72, 0.05) == "72.0 ± 5.0"             # inside: symmetric
    assert format_cell("arith/acc", 0.98, 0.04) == "98.0 [94.0, 100.0]"     # 102% cut to 100
    assert format_cell("arith/pass@8", 0.01, 0.03) == "1.0 [0.0, 4.0]"      # -2% cut to 0
    assert format_cell("wall_seconds", 5.0, 7.0) == "5.0 ± 7.0"             # not a share: as is


def test_a_start_shared_by_every_seed_says_so():
    cols = pd.MultiIndex.from_tuples([("arith/acc", "mean"), ("arith/acc", "ci95"), ("arith/acc", "n")])
    df = pd.DataFrame([[0.56, 0.0, 2], [0.70, 0.0, 2], [0.60, np.nan, 1]], index=["start", "grpo", "ppo"],
                      columns=cols)
    assert _cell(df, "start", "arith/acc") == "56.0 (same start in all 2 seeds)"
    assert _cell(df, "grpo", "arith/acc") == "70.0 ± 0.0"   # two seeds that agree: the interval is real
    assert _cell(df, "ppo", "arith/acc") == "60.0"
