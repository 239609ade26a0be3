"""`harness sync` streams metrics.jsonl (issue 48, item 4): a 1 GB sparse metrics.jsonl (one line of NUL bytes)
took 2.34 GB to sync, because the MLflow attempt key read the first line whole. Every reader sync uses reads at
most `MAX_ROW_BYTES` of a line at a time; measured here with tracemalloc on a 256 MiB line: the
peak stays a few times `MAX_ROW_BYTES` (64 MiB), whatever the line's size."""
from __future__ import annotations

import tracemalloc

import pytest

from _fake_results import make_run  # tests/support
from harness.rundir.layout import MAX_ROW_BYTES
from harness.rundir.read import load_run
from harness.tracking.base import metrics_time_span
from harness.tracking.mlflow_tracker import first_row_time

HOLE = 256 * 2**20


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("where", ["first", "last"])
def test_the_sync_readers_never_load_a_line_of_unbounded_size(where, tmp_path):
    d = make_run(tmp_path, "sw", "grpo", 0, 8)
    f = d / "metrics.jsonl"
    rows = f.read_bytes()
    first_time = first_row_time(d)
    assert first_time is not None
    with open(f, "wb") as fh:  # a sparse line of NUL bytes (no disk used), before or after the rows
        if where == "first":
            fh.truncate(HOLE)
            fh.seek(HOLE)
            fh.write(b"\n" + rows)
        else:
            fh.write(rows)
            fh.truncate(len(rows) + HOLE)
    budget = 4 * MAX_ROW_BYTES + 8 * 2**20  # the strict reader skips a long line in MAX_ROW_BYTES pieces
    assert _peak(lambda: first_row_time(d)) < budget
    assert first_row_time(d) == (None if where == "first" else first_time)
    assert _peak(lambda: metrics_time_span(d)) < budget
    assert _peak(lambda: load_run(d)) < budget  # the over-long line skipped (logged)
