"""Run folders read from bad places: a path through a file reads as absent (ENOTDIR), not a traceback;
every reader of run folders (find_run_dirs for sync, report and ui; export) skips the same non-run
folders, a sweep's setup jobs included; and `harness report` / `harness export` say in one line when no
run is usable, when the folder given is a run folder itself, and when sweep.json is unusable."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from _fake_results import make_run, make_sweep
from harness.cli.main import main
from harness.cli.polish import LINE_LIMIT
from harness.rundir.export import choose_runs
from harness.rundir.layout import (NON_RUN_DIRS, SETUP_DIR, SWEEP_JSON, SWEEP_NON_RUN_DIRS, load_json, open_regular,
                                   read_json)
from harness.rundir.read import find_run_dirs, is_run_dir

ONE = [("grpo", 0, 8, "finished")]


def _one_line(capsys, argv: list[str], rc: int, must: str) -> tuple[str, str]:
    """``harness *argv`` exits ``rc`` with one stderr line holding ``must`` and no traceback."""
    got = main(argv)
    out, err = capsys.readouterr()
    assert got == rc, (argv, out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and must in lines[0], (must, err)
    assert len(err) <= LINE_LIMIT + 100
    return out, lines[0]


# --------------------------------------------------------------------------- ENOTDIR is absent


def test_a_path_through_a_file_reads_as_absent(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    p = afile / "run" / "summary.json"
    assert read_json(p) is None and read_json(p, {}) == {}
    with pytest.raises(FileNotFoundError, match="a folder on its path is a file"):
        open_regular(p)
    with pytest.raises(FileNotFoundError):
        load_json(p)
    assert not is_run_dir(afile / "run")


# --------------------------------------------------------------------------- one list of non-run folders


def _fake_run_in(folder: Path, rid: str = "grpo-s0-deadbeef") -> Path:
    d = folder / rid
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"run_id": rid, "status": "finished",
                                                "setup_seconds": {"initial_eval": 1.5}}))
    return d


@pytest.mark.parametrize("name", sorted(NON_RUN_DIRS | SWEEP_NON_RUN_DIRS | {".hidden"}))
def test_every_reader_skips_the_same_non_run_folders(name, tmp_path):
    sweep = make_sweep(tmp_path / "results", "sw", spec=ONE)
    (sweep / SWEEP_JSON).write_text(json.dumps({"name": "sw", "runs": []}))
    (run,) = [d for d in sweep.iterdir() if d.is_dir()]
    _fake_run_in(sweep / name)            # looks like a run, in a folder that holds none
    assert find_run_dirs(sweep) == [run]
    assert find_run_dirs(tmp_path / "results") == [run]
    choice = choose_runs(sweep)
    assert [d.name for d in choice.finished] == [run.name] and choice.skipped == []


@pytest.mark.parametrize("name", sorted(SWEEP_NON_RUN_DIRS))
def test_a_sweep_named_like_a_sweep_folder_part_is_still_read(name, tmp_path):
    """`setup` and `study` are non-run folders inside a sweep folder (one with sweep.json) only: a
    sweep of that name directly in a results root is read like any other."""
    sweep = make_sweep(tmp_path / "results", name, spec=ONE)
    (sweep / SWEEP_JSON).write_text(json.dumps({"name": name, "runs": []}))
    (run,) = [d for d in sweep.iterdir() if d.is_dir()]
    assert find_run_dirs(tmp_path / "results") == [run]
    assert [d.name for d in choose_runs(sweep).finished] == [run.name]


def test_sync_of_a_sweep_folder_leaves_its_setup_jobs_out(tmp_path, monkeypatch, capsys):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    sweep = make_sweep(tmp_path / "results", "sw", spec=ONE)
    (sweep / SWEEP_JSON).write_text(json.dumps({"name": "sw", "runs": []}))
    _fake_run_in(sweep / SETUP_DIR)
    (tmp_path / "store").mkdir()
    rc = main(["sync", str(sweep), "--to", "mlflow", "--uri", f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "synced 1/1 runs to mlflow" in out and "not synced" not in err


# --------------------------------------------------------------------------- report and export


def test_report_refuses_a_sweep_with_no_usable_run_like_export(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "results", "sw", spec=[("grpo", 0, 8, "finished"), ("ppo", 0, 0, "finished")])
    for d in sorted(x for x in sweep.iterdir() if x.is_dir()):
        (d / "summary.json").write_bytes(b"\xff\xfe\x00binary")          # every run unreadable
    first = sorted(x.name for x in sweep.iterdir())[0]
    _, line = _one_line(capsys, ["report", str(sweep)], 2,
                        f"sweep_dir={str(sweep)!r} has no finished runs to report (2 run folder(s), none finished: "
                        f"{first}: summary.json cannot be read (is not UTF-8 text")
    assert line.startswith("harness: config error: ")
    assert not (sweep / "report").exists()
    _, line = _one_line(capsys, ["export", str(sweep), str(tmp_path / "dest")], 2,
                        "has no finished runs to export (2 run folder(s), none finished: ")
    assert not (tmp_path / "dest").exists()


def test_report_and_export_of_a_run_folder_name_its_parent(tmp_path, capsys):
    run = make_run(tmp_path / "results", "sw", "grpo", 0, 8)
    parent = str(run.parent)
    _, line = _one_line(capsys, ["export", str(run), str(tmp_path / "dest")], 2,
                        f"RUNS_DIR={str(run)!r} has no finished runs to export: it is a run folder itself, not a "
                        f"sweep's results folder; give its parent, {parent!r} (with --runs {run.name!r} for this run alone)")
    assert not (tmp_path / "dest").exists()
    _one_line(capsys, ["report", str(run)], 2,
              f"sweep_dir={str(run)!r} has no finished runs to report: it is a run folder itself, not a sweep's "
              f"results folder; give its parent, {parent!r}")
    assert not (run / "report").exists()
    _one_line(capsys, ["report", str(run), "--output-dir", str(tmp_path / "r")], 2, "give its parent")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("text,why", [
    ("{not json", "sweep.json: is not valid JSON"),
    ("[1, 2]", "sweep.json: holds an array where an object is expected"),
    ('{"runs": 3}', "sweep.json: its 'runs' is a number, not an array (not a sweep.json `harness sweep` wrote)"),
    ('{"report_columns": "peak.rss_mb"}', "its 'report_columns' is a string, not an array"),
])
def test_an_unusable_sweep_json_is_a_warning(text, why, tmp_path, capsys):
    sweep = make_sweep(tmp_path / "results", "sw", spec=ONE)
    (sweep / SWEEP_JSON).write_text(text)
    dest = tmp_path / "dest"
    assert main(["export", str(sweep), str(dest)]) == 0
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"harness export: warning: {sweep / SWEEP_JSON}") and why in lines[0]
    assert lines[0].endswith(": not exported (the report reads the runs without it)"), err
    assert "exported 1 run(s)" in out and not (dest / SWEEP_JSON).exists()
    assert main(["report", str(sweep)]) == 0
    out, err = capsys.readouterr()
    warned = [line for line in err.splitlines() if line.startswith("harness report: warning: ")]
    assert len(warned) == 1 and why in warned[0] and warned[0].endswith(
        ": ignored (its report.columns and study settings are not read)"), err
    assert "Traceback" not in err


def test_report_warns_of_a_column_no_run_has(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "results", "sw", spec=ONE)
    (sweep / SWEEP_JSON).write_text(json.dumps({"name": "sw", "runs": [],
                                                "report_columns": ["nonexistent.col", "peak.rss_mb"]}))
    assert main(["report", str(sweep)]) == 0
    out, err = capsys.readouterr()
    warned = [line for line in err.splitlines() if "report.columns" in line]
    assert warned == ["harness report: warning: report.columns: 'nonexistent.col' is in no run's summary.json, so "
                      "its column is empty (a column is a dotted path into summary.json, e.g. peak.rss_mb, "
                      "wall_seconds, final_eval.eval/<task>/acc)"], err
    assert "wrote " in out


def test_a_sweep_folder_with_a_finished_run_still_reports(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "results", "sw", spec=[("grpo", 0, 8, "finished"), ("ppo", 2, 0, "failed")])
    assert main(["report", str(sweep)]) == 0
    out, err = capsys.readouterr()
    assert "excluded (not finished): ppo-s2-" in out and "Traceback" not in err
    assert os.path.isfile(sweep / "report" / "report.md")


def test_columns_are_judged_against_finished_runs_only():
    """An interrupted sweep's summaries lack their final figures: no warning until a run finished, and then
    only a column no finished run holds."""
    from harness.rundir.read import columns_in_no_run
    running = {"status": "interrupted", "initial_eval": {"eval/arith/acc": 0.5}, "peak": {"rss_mb": 9.0}}
    cols = ["final_eval.eval/arith/acc", "peak.rss_mb"]
    assert columns_in_no_run([running, running], cols) == []
    done = {"status": "finished", "final_eval": {"eval/arith/acc": 0.6}}
    assert columns_in_no_run([running, done], cols) == [
        "report.columns: 'peak.rss_mb' is in no run's summary.json, so its column is empty (a column is a dotted "
        "path into summary.json, e.g. peak.rss_mb, wall_seconds, final_eval.eval/<task>/acc)"]
