"""Bad inputs to `harness sweep` are refused in one line (exit 2) before the plan is printed and before
anything is written: non-finite or non-whole launcher numbers, GPUs this machine does not have (also
under --dry-run, which prints the plan and a one-line warning, exit 0), an output folder that is a file or cannot be made, an
--only that selects nothing, a --refresh that is not a period; and a report.columns path that no run's
summary.json holds is a warning, not a silent column of '-'."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.cli.polish import LINE_LIMIT
from harness.sweep.launchers import LocalLauncher, resource_problem
from harness.sweep.plan import load_sweep
from harness.sweep.run import run_sweep
from harness.sweep.spec import LaunchOptions, SweepError
from sweep_testing import run_cli, sweep_file
from refusals import refused  # tests/support

BODY = """name: bad
grid: {seed: [0, 1]}
budget: {unit: steps, amount: 2, eval_points: 1}
"""


def _refused(capsys, tmp_path: Path, argv: list[str], must: str, rc: int = 2, plan: bool = False) -> str:
    """``harness sweep *argv`` exits ``rc`` with one stderr line holding ``must``, no traceback, nothing
    written under ``tmp_path``; the plan on stdout only when ``plan``."""
    def plan_printed(out: str) -> None:
        assert ("sweep bad: 2 run(s)" in out) == plan, out

    return refused(capsys, ["sweep", *argv], must, tmp_path, rc=rc, max_len=LINE_LIMIT + 100, stdout=plan_printed)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible, whatever the machine has


# --------------------------------------------------------------------------- 1. launcher numbers


@pytest.mark.parametrize("launcher,must", [
    ("{gpus: .inf}", "launcher.gpus=inf is invalid: expected 'auto', 0, a fraction of one GPU"),
    ("{gpus: -.inf}", "launcher.gpus=-inf is invalid"),
    ("{gpus: .nan}", "launcher.gpus=nan is invalid"),
    ("{gpus: 1.5}", "launcher.gpus=1.5 is invalid"),
    ("{gpus: -1}", "launcher.gpus=-1 is invalid"),
    ("{gpus: 1e30}", "launcher.gpus='1e30' is invalid"),   # YAML 1.1: a string
    ("{gpus: 100000}", "launcher.gpus=100000 is invalid: expected 'auto', 0, a fraction of one GPU (0.5: two runs "
                       "share one), or a whole number of GPUs up to 65536"),
    ("{workers: .inf}", "launcher.workers=inf is invalid: expected a whole number from 1 to 65536 (inf is not a finite number)"),
    ("{workers: .nan}", "launcher.workers=nan is invalid"),
    ("{workers: 2.0}", "launcher.workers=2.0 is invalid: expected a whole number from 1 to 65536 (write 2, not 2.0)"),
    ("{cpus: 2.5}", "launcher.cpus=2.5 is invalid: expected a whole number from 1 to 65536 (not a whole number)"),
    ("{cpus: 100000000000000000000}", "launcher.cpus=100000000000000000000 is invalid"),
    ("{cpus: 2048}", "launcher.cpus=2048 is invalid: each of a run's 1 process(es) would run 2048 torch threads, "
                     "at most 1024"),
    ("{procs: .inf}", "launcher.procs=inf is invalid"),
    ("{procs: 0}", "launcher.procs=0 is invalid: expected a whole number from 1 to 65536"),
    ("{zero_stage: 2.0}", "launcher.zero_stage=2.0 is invalid: expected 2, 3 or null (write 2, not 2.0)"),
    ("{zero_stage: .nan}", "launcher.zero_stage=nan is invalid"),
    ("{zero_stage: true}", "launcher.zero_stage=True is invalid"),
])
def test_launcher_numbers_must_be_finite_and_whole(launcher, must, tmp_path, capsys):
    path = sweep_file(tmp_path, BODY + f"launcher: {launcher}\n")
    for extra in (["--dry-run"], []):
        _refused(capsys, tmp_path, [str(path), "--output-dir", str(tmp_path / "out"), *extra], f"s.yaml: {must}")


def test_launcher_numbers_that_are_fine(tmp_path, capsys, no_gpu):
    for launcher in ("{gpus: 0}", "{gpus: 0.0}", "{gpus: auto, workers: 2, cpus: 1, procs: 1}", "{zero_stage: 3}",
                     "{cpus: 2048, procs: 2}"):
        path = sweep_file(tmp_path, BODY + f"launcher: {launcher}\n")
        assert main(["sweep", str(path), "--output-dir", str(tmp_path / "out"), "--dry-run"]) == 0, capsys.readouterr()
        assert "sweep bad: 2 run(s)" in capsys.readouterr().out


# --------------------------------------------------------------------------- 2. GPUs this machine lacks


@pytest.mark.parametrize("gpus", ["1", "2", "0.5"])
def test_gpus_this_machine_lacks_are_refused_before_anything_runs(gpus, tmp_path, capsys, no_gpu):
    path = sweep_file(tmp_path, BODY + f"launcher: {{gpus: {gpus}}}\n")
    out = tmp_path / "out"
    need = f"each run needs {float(gpus):g} GPU(s) but 0 are visible here (CUDA_VISIBLE_DEVICES='')"
    line = _refused(capsys, tmp_path, [str(path), "--output-dir", str(out)], need)
    assert line.startswith(f"harness: config error: this sweep cannot run on this machine: launcher.gpus={gpus}")
    # --dry-run checks the plan, not this machine: it prints the plan and warns in one line that it could not
    # run here (exit 0: the plan of a GPU sweep can be read on a laptop)
    line = _refused(capsys, tmp_path, [str(path), "--output-dir", str(out), "--dry-run"], need, rc=0, plan=True)
    assert line.startswith("warning: the plan is valid, but this sweep could not run on this machine")
    assert not out.exists()


def test_enough_visible_gpus_pass_the_check(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    path = sweep_file(tmp_path, BODY + "launcher: {gpus: 2}\n")
    assert main(["sweep", str(path), "--output-dir", str(tmp_path / "out"), "--dry-run"]) == 0
    assert capsys.readouterr().err == ""
    assert resource_problem(LaunchOptions(gpus=2)) == ""
    assert "each run needs 3 GPU(s) but 2 are visible" in resource_problem(LaunchOptions(gpus=3))
    assert resource_problem(LaunchOptions(type="ray", gpus=8)) == ""   # the cluster's, checked on connecting


def test_the_launcher_and_run_sweep_raise_the_sweeps_error(tmp_path, no_gpu):
    with pytest.raises(SweepError, match=r"cannot run on this machine: launcher.gpus=2: each run needs 2 GPU\(s\) "
                                         r"but 0 are visible"):
        LocalLauncher(options=LaunchOptions(gpus=2)).plan_resources(1)
    path = sweep_file(tmp_path, BODY + "launcher: {gpus: 1}\n")
    sw = load_sweep(path, output_dir=str(tmp_path / "out"))
    with pytest.raises(SweepError, match="cannot run on this machine: launcher.gpus=1"):
        run_sweep(sw, progress=False, stream=io.StringIO())
    assert not (tmp_path / "out").exists()   # refused before the sweep's folder (lock, sweep.json) was made


# --------------------------------------------------------------------------- 3. the output folder


def test_output_dir_that_is_a_file_or_cannot_be_made(tmp_path, capsys):
    path = sweep_file(tmp_path, BODY)
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = [([str(afile)], f"--output-dir={str(afile)!r} is invalid: is a file, not a directory"),
             ([str(afile / "sub")], f"is invalid: is under {afile}, which is a file, not a directory"),
             (["/proc/x"], "--output-dir='/proc/x' is invalid: not a writable directory")]
    for od, must in cases:
        for extra in (["--dry-run"], []):
            _refused(capsys, tmp_path, [str(path), "--output-dir", *od, *extra], must)
    # the sweep file's output_dir, and the sweep's own folder, are checked the same way
    p2 = sweep_file(tmp_path, BODY + "output_dir: /proc/x\n", name="s2.yaml")
    _refused(capsys, tmp_path, [str(p2), "--dry-run"], "output_dir='/proc/x' is invalid: not a writable directory")
    out = tmp_path / "out"
    out.mkdir()
    (out / "bad").write_text("x")
    for extra in (["--dry-run"], []):
        _refused(capsys, tmp_path, [str(path), "--output-dir", str(out), *extra],
                 f"sweep folder={str(out / 'bad')!r} is invalid: is a file, not a directory")


def test_a_file_where_a_run_goes_is_refused_before_the_plan(tmp_path, capsys):
    path = sweep_file(tmp_path, BODY)
    out = tmp_path / "out"
    sw = load_sweep(path, output_dir=str(out))
    run_dir = sw.runs[1].run_dir
    run_dir.parent.mkdir(parents=True)
    run_dir.write_text("x")
    for extra in (["--dry-run"], []):
        _refused(capsys, tmp_path, [str(path), "--output-dir", str(out), *extra],
                 f"{run_dir} is a file, not a folder, where run {sw.runs[1].run_id} of the sweep goes: move it out")
    run_dir.unlink()
    os.symlink(tmp_path / "nowhere", run_dir)
    _refused(capsys, tmp_path, [str(path), "--output-dir", str(out), "--dry-run"],
             f"is a symbolic link to {tmp_path / 'nowhere'}, which does not exist, where run")


def test_planning_under_a_file_reads_the_runs_as_new(tmp_path):
    """Reading run state where a folder on the path is a file is "absent" (ENOTDIR), not a traceback."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    sw = load_sweep(sweep_file(tmp_path, BODY), output_dir=str(afile))
    assert [r.state for r in sw.runs] == ["new", "new"]


# --------------------------------------------------------------------------- 4. --only


def test_an_only_that_selects_nothing_is_refused_with_the_run_ids(tmp_path, capsys):
    path = sweep_file(tmp_path, BODY)
    ids = [r.run_id for r in load_sweep(path, output_dir=str(tmp_path / "out")).runs]
    choices = f"this sweep's run ids: {', '.join(ids)}"
    for only, must in ((["--only", ""], "--only selects no run: it names no pattern"),
                       (["--only", ","], "--only selects no run: it names no pattern"),
                       (["--only", " , "], "--only selects no run: it names no pattern"),
                       (["--only", "zzz"], "--only 'zzz' matches no run of sweep bad"),
                       (["--only", "s0", "zzz"], "--only 'zzz' matches no run of sweep bad")):
        for extra in (["--dry-run"], []):
            line = _refused(capsys, tmp_path, [str(path), "--output-dir", str(tmp_path / "out"), *only, *extra], must)
            assert choices in line, line
    assert main(["sweep", str(path), "--output-dir", str(tmp_path / "out"), "--only", "*-s1-*", "--dry-run"]) == 0
    sw = load_sweep(path, output_dir=str(tmp_path / "out"))
    with pytest.raises(SweepError, match="only selects no run"):
        run_sweep(sw, only=[], progress=False, stream=io.StringIO())


# --------------------------------------------------------------------------- 7. --refresh and --workers


@pytest.mark.parametrize("value", ["0", "100000"])
def test_workers_keeps_the_launcher_workers_rule(value, tmp_path, capsys):
    path = sweep_file(tmp_path, BODY)
    _refused(capsys, tmp_path, [str(path), "--output-dir", str(tmp_path / "out"), "--workers", value, "--dry-run"],
             f"--workers={value} is invalid: expected a whole number from 1 to 65536")


@pytest.mark.parametrize("value,shown", [("nan", "nan"), ("-1", "-1"), ("inf", "inf"), ("0", "0"), ("1e9", "1e+09")])
def test_refresh_must_be_a_period(value, shown, tmp_path, capsys):
    path = sweep_file(tmp_path, BODY)
    for extra in (["--dry-run"], []):
        _refused(capsys, tmp_path, [str(path), "--output-dir", str(tmp_path / "out"), "--refresh", value, *extra],
                 f"--refresh {shown} is invalid: expected the seconds between refreshes of the live table, "
                 f"a number > 0 and at most 86400")


def test_run_sweep_refuses_a_bad_refresh(tmp_path):
    sw = load_sweep(sweep_file(tmp_path, BODY), output_dir=str(tmp_path / "out"))
    with pytest.raises(SweepError, match="refresh nan is invalid"):
        run_sweep(sw, refresh=float("nan"), progress=False, stream=io.StringIO())
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- 6. report.columns


def test_a_report_column_no_run_has_is_a_warning(tmp_path):
    path = sweep_file(tmp_path, """name: cols
grid: {seed: [0]}
budget: {unit: steps, amount: 2, eval_points: 1}
report: {columns: [nonexistent.col, peak.rss_mb, peak.rss_mbb]}
""")
    p = run_cli(path, tmp_path / "out", "--no-progress")
    assert p.returncode == 0, p.stdout + p.stderr
    warnings = [line for line in p.stderr.splitlines() if "report.columns" in line]
    assert warnings == [
        "harness sweep: warning: report.columns: 'nonexistent.col' is in no run's summary.json, so its column is "
        "empty (a column is a dotted path into summary.json, e.g. peak.rss_mb, wall_seconds, final_eval.eval/<task>/acc)",
        "harness sweep: warning: report.columns: 'peak.rss_mbb' is in no run's summary.json, so its column is empty; "
        "did you mean 'peak.rss_mb', 'peak.cuda_mb', 'peak.rss_above_base_mb'? (a column is a dotted path into summary.json, e.g. peak.rss_mb, wall_seconds, "
        "final_eval.eval/<task>/acc)"], p.stderr
    assert "Traceback" not in p.stderr
