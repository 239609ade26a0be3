"""Rewrites of run files are atomic (temp + fsync + os.replace): a failure mid-rewrite leaves
the old contents; non-object JSON lines are skipped with a warning by every reader."""
from __future__ import annotations

import errno
import json
import logging

import pytest

from harness.foundation import files
from harness.foundation.files import write_json_atomic
from harness.rundir.layout import METRICS, MetricsWriter, read_jsonl
from harness.rundir.read import load_run


def _rows(n):
    return [{"step": i, "samples": 4 * i, "train/loss": 0.5 + i} for i in range(1, n + 1)]


def _enospc_after_first_line(monkeypatch):
    """Make the temp file of a rewrite fail with ENOSPC after its first line."""
    real_fdopen = files.os.fdopen

    class Failing:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, s):
            if self.n >= 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.n += 1
            return self.f.write(s)

        def writelines(self, lines):
            for line in lines:
                self.write(line)

        def __getattr__(self, k):
            return getattr(self.f, k)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    monkeypatch.setattr(files.os, "fdopen", lambda *a, **k: Failing(real_fdopen(*a, **k)))


def test_truncate_after_keeps_old_rows_when_rewrite_fails(tmp_path, monkeypatch):
    w = MetricsWriter(tmp_path / METRICS)
    for r in _rows(5):
        w.write(r)
    before = (tmp_path / METRICS).read_text()
    _enospc_after_first_line(monkeypatch)
    with pytest.raises(OSError) as ei:
        w.truncate_after(2)
    assert ei.value.errno == errno.ENOSPC
    assert (tmp_path / METRICS).read_text() == before
    assert [r["step"] for r in read_jsonl(tmp_path / METRICS)] == [1, 2, 3, 4, 5]
    assert [p.name for p in tmp_path.iterdir()] == [METRICS]  # no temp file left behind
    monkeypatch.undo()
    w.write({"step": 6})  # the writer is still usable (appends)
    w.close()
    assert [r["step"] for r in read_jsonl(tmp_path / METRICS)] == [1, 2, 3, 4, 5, 6]


def test_truncate_after_drops_later_rows_and_keeps_lines_verbatim(tmp_path):
    w = MetricsWriter(tmp_path / METRICS)
    for r in _rows(4):
        w.write(r)
    lines = (tmp_path / METRICS).read_text().splitlines()
    w.truncate_after(2)
    w.write({"step": 3, "train/loss": 9.0})
    w.close()
    out = (tmp_path / METRICS).read_text().splitlines()
    assert out[:2] == lines[:2]
    assert json.loads(out[2])["train/loss"] == 9.0 and len(out) == 3


def test_write_json_atomic_failure_keeps_old_file(tmp_path, monkeypatch):
    p = tmp_path / "summary.json"
    write_json_atomic(p, {"status": "running", "a": [1, 2, 3]})
    before = p.read_text()
    _enospc_after_first_line(monkeypatch)
    with pytest.raises(OSError):
        files.rewrite_atomic(p, lambda f: (f.write("{\n"), f.write("}")))
    assert p.read_text() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["summary.json"]


def test_non_object_lines_skipped_with_warning(tmp_path, caplog):
    p = tmp_path / METRICS
    p.write_text('{"step": 1, "samples": 4}\n123\n[1, 2]\nnull\n"s"\n{"step": 2, "samples": 8}\n{"step": 3, "sam')
    with caplog.at_level(logging.WARNING, logger="harness.rundir.layout"):
        rows = read_jsonl(p)
    assert [r["step"] for r in rows] == [1, 2]
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "skipped 5 line(s)" in msg and "line 2, 3, 4, 5, 7" in msg
    run = load_run(tmp_path)  # report / sync read through here
    assert [r["step"] for r in run.rows] == [1, 2]
    assert run.budget_consumed == 2.0
    w = MetricsWriter(p)  # resume
    w.truncate_after(1)
    w.close()
    assert p.read_text() == '{"step": 1, "samples": 4}\n'
