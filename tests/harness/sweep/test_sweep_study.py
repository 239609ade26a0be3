"""report.study / report.selection: validated before any work (selection resolved against the sweep
file's folder), shown by --dry-run (also when the folder does not exist yet), recorded in sweep.json;
`harness sweep` ends by writing the study report when every run finished (selection_dir passed only
when set), and says which runs kept it from being written otherwise."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import harness.cli.sweep as sweep_cli
from harness.cli.main import main
from harness.sweep.plan import load_sweep
from harness.sweep.sequential import sweep_design
from harness.sweep.spec import SweepError
from sweep_testing import env, run_cli

HEAD = """name: st
config:
  train.prompts_per_step: 2
  sampling.samples_per_prompt: 4
grid:
  algorithm: [grpo, rft]
  seed: [0]
budget: {unit: samples, amount: 16, eval_points: 1}
launcher: {workers: 2}
"""


def sweep_file(tmp_path: Path, report: str, head: str = HEAD) -> Path:
    d = tmp_path / "sweeps"
    d.mkdir(exist_ok=True)
    p = d / "st.yaml"
    p.write_text(head + report)
    return p


def test_study_and_selection_are_read_and_resolved(tmp_path):
    sw = load_sweep(sweep_file(tmp_path, "report: {study: true, selection: ../results/lr_select}"),
                    output_dir=str(tmp_path / "out"))
    assert sw.report_study is True and sw.report_selection == (tmp_path / "results" / "lr_select").resolve()
    assert sw.study_dir == (tmp_path / "out").resolve() / "st" / "study"
    sw = load_sweep(sweep_file(tmp_path, f"report: {{study: true, selection: {tmp_path / 'abs'}, columns: [a.b]}}"))
    assert sw.report_selection == tmp_path / "abs" and sw.report_columns == ["a.b"]
    sw = load_sweep(sweep_file(tmp_path, "report: {columns: [wall_seconds]}"))
    assert (sw.report_study, sw.report_selection, sw.report_columns) == (False, None, ["wall_seconds"])
    assert sw.report_baseline is None
    assert load_sweep(sweep_file(tmp_path, "report: {baseline: rft}")).report_baseline == "rft"


@pytest.mark.parametrize("report, why", [
    ("report: {study: yes please}", "report.study='yes please' is invalid: expected true or false"),
    ("report: {study: true, selection: 3}", "report.selection=3 is invalid: expected a folder path"),
    ("report: {study: true, selection: ''}", "report.selection='' is invalid: expected a non-empty folder path"),
    ("report: {selection: ../results/lr_select}", "report.selection is given but report.study is not true"),
    ("report: {studdy: true}", "unknown key 'report.studdy'; did you mean 'study'? (valid: columns, baseline, study, "
                               "selection, prm_selection, retired, sequential, amendments, cap)"),
    ("report: {baseline: grpp}", "report.baseline='grpp' names no algorithm of this sweep's runs; did you mean "
                                 "'grpo'? (its algorithms: grpo, rft)"),
    ("report: {baseline: 3}", "report.baseline=3 is invalid: expected the name of an algorithm of the sweep"),
    ("report: {baseline: ''}", "report.baseline='' is invalid"),
    ("report: [study]", "report must be a mapping with columns, baseline, study, selection"),
])
def test_bad_report_sections_name_the_problem(tmp_path, report, why):
    with pytest.raises(SweepError) as e:
        load_sweep(sweep_file(tmp_path, report))
    assert why in str(e.value) and "st.yaml" in str(e.value)


def test_dry_run_says_where_the_study_report_goes_and_from_which_selection(tmp_path):
    path = sweep_file(tmp_path, "report: {study: true, selection: ../lr_select}")
    out = tmp_path / "out"
    p = run_cli(path, out, "--dry-run")
    assert p.returncode == 0, p.stdout + p.stderr
    sel, study = (tmp_path / "lr_select").resolve(), out.resolve() / "st" / "study"
    assert (f"study report: written to {study}/ when every run finished, with the learning-rate selection "
            f"from {sel} (does not exist yet)") in p.stdout.splitlines()
    assert not out.exists()       # a dry run writes nothing
    sel.mkdir()
    p = run_cli(path, out, "--dry-run")
    assert f"with the learning-rate selection from {sel}\n" in p.stdout + "\n" and "does not exist" not in p.stdout
    p = run_cli(sweep_file(tmp_path, "report: {study: true}"), out, "--dry-run")
    assert "(no learning-rate selection folder: report.selection is not set)" in p.stdout
    p = run_cli(sweep_file(tmp_path, ""), out, "--dry-run")
    assert "study report" not in p.stdout


class _Study:
    """Stands in for harness.report.study: records each build_study_report call."""

    def __init__(self):
        self.calls = []

    def build_study_report(self, sweep_dir, out_dir=None, **kw):
        self.calls.append((Path(sweep_dir), Path(out_dir), kw))
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "report.md").write_text("# study\n")
        return Path(out_dir) / "report.md"


@pytest.fixture
def study(monkeypatch):
    """The sweep in this process over the fake trainer, with a stand-in study report (the table
    report is test_sweep_report.py's)."""
    for k, v in env(HARNESS_TRAIN_FN="sweep_fake_trainer:train").items():
        monkeypatch.setenv(k, v)
    stub = _Study()
    monkeypatch.setattr(sweep_cli, "report_study", stub)
    monkeypatch.setattr(sweep_cli, "_write_report", lambda sw: 0)
    return stub


def test_sweep_ends_with_the_study_report(tmp_path, study, capsys):
    path = sweep_file(tmp_path, "report: {study: true, selection: ../lr_select}")
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--output-dir", str(out), "--no-progress"]) == 0
    sd, sel = out.resolve() / "st", (tmp_path / "lr_select").resolve()
    assert study.calls == [(sd, sd / "study", {"selection_dir": sel})]
    assert f"study report: {sd / 'study' / 'report.md'} (learning-rate selection: {sel})" in capsys.readouterr().out
    doc = json.loads((sd / "sweep.json").read_text())
    assert doc["report"] == {"study": True, "selection": str(sel)} and doc["status"] == "finished"
    # without a selection folder: called without the keyword (works before and after selection_dir exists)
    path = sweep_file(tmp_path, "report: {study: true}")
    assert main(["sweep", str(path), "--output-dir", str(tmp_path / "out2"), "--no-progress"]) == 0
    sd2 = (tmp_path / "out2").resolve() / "st"
    assert study.calls[1] == (sd2, sd2 / "study", {})
    assert json.loads((sd2 / "sweep.json").read_text())["report"] == {"study": True, "selection": None}
    # report.study off: no study report
    path = sweep_file(tmp_path, "")
    assert main(["sweep", str(path), "--output-dir", str(tmp_path / "out3"), "--no-progress"]) == 0
    assert len(study.calls) == 2
    assert json.loads(((tmp_path / "out3") / "st" / "sweep.json").read_text())["report"] == {
        "study": False, "selection": None}


def test_failed_runs_mean_no_study_report_and_say_which(tmp_path, study, capsys):
    head = HEAD.replace("  seed: [0]\n", "  seed: [0]\nalgorithms:\n  rft: {train.lr: 0.0666}\n")
    path = sweep_file(tmp_path, "report: {study: true}", head=head)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--output-dir", str(out), "--no-progress"]) == 1
    assert study.calls == []
    rft = next(r.run_id for r in load_sweep(path, output_dir=str(out)).runs if r.run_id.startswith("rft-"))
    text = capsys.readouterr().out
    assert (f"study report not written: 1 run(s) not finished: {rft} (failed); re-run the same command to "
            f"finish them, and the study report is written at the end") in text
    assert not (out / "st" / "study").exists()


def test_a_part_run_with_only_writes_no_report_until_the_last_run(tmp_path, study, capsys):
    head = HEAD.replace("  seed: [0]\n", "  seed: [0, 1]\n")
    path = sweep_file(tmp_path, "report: {study: true}", head=head)
    out = tmp_path / "out"
    runs = load_sweep(path, output_dir=str(out)).runs
    first = [r.run_id for r in runs if "-s0-" in r.run_id]
    assert 0 < len(first) < len(runs)
    assert main(["sweep", str(path), "--output-dir", str(out), "--no-progress", "--only", "*-s0-*"]) == 0
    assert study.calls == []
    assert (f"reports not written: {len(runs) - len(first)} run(s) of the sweep not finished (not selected by "
            f"--only); they are written when the last run finishes") in capsys.readouterr().out
    assert main(["sweep", str(path), "--output-dir", str(out), "--no-progress", "--only", "*-s1-*"]) == 0
    assert len(study.calls) == 1 and "study report:" in capsys.readouterr().out


def test_the_real_study_report_is_written_at_the_end(tmp_path):
    """harness.report.study itself (not a stand-in), over the fake trainer's runs, in a subprocess."""
    out = tmp_path / "out"
    p = run_cli(sweep_file(tmp_path, "report: {study: true}"), out, "--no-progress", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    study_dir = out.resolve() / "st" / "study"
    assert p.stdout.rstrip().splitlines()[-1] == f"study report: {study_dir / 'report.md'}"
    assert {f.name for f in study_dir.iterdir()} >= {"report.md", "claims.csv", "table5.csv", "plots"}


def test_amendments_are_checked_and_recorded_in_sweep_json(tmp_path, study):
    """report.amendments: dated sentences on how the design changed after data came in; sweep.json keeps
    them for the study report (which prints them: tests/harness/report/test_study.py)."""
    for bad, why in (("amendments: 'a change'", "report.amendments must be a list of sentences"),
                     ("amendments: ['ok', 3]", "report.amendments must be a list of sentences"),
                     ("amendments: ['  ']", "report.amendments must be a list of sentences")):
        with pytest.raises(SweepError, match=why):
            load_sweep(sweep_file(tmp_path, "report: {study: true, " + bad + "}"), output_dir=str(tmp_path / "o"))
    with pytest.raises(SweepError, match="report.amendments is given but report.study is not true"):
        load_sweep(sweep_file(tmp_path, "report: {amendments: ['x']}"), output_dir=str(tmp_path / "o"))
    path = sweep_file(tmp_path, "report:\n  study: true\n  amendments:\n    - '2026-11-27: arm X from 3 to 5\n"
                                "      seeds (a cap at the first look cannot decide).'\n")
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--output-dir", str(out), "--no-progress"]) == 0
    doc = json.loads((out.resolve() / "st" / "sweep.json").read_text())
    assert doc["report"] == {"study": True, "selection": None,
                             "amendments": ["2026-11-27: arm X from 3 to 5 seeds (a cap at the first look cannot decide)."]}


def test_cap_is_checked_and_recorded_in_sweep_json(tmp_path, study):
    """report.cap: the study design's cap (the most seeds any arm is looked at), a whole number from the first look
    to 100, only with report.study; the sequential design and the study report use it (sweep.json keeps it)."""
    for bad in ("0", "2", "101", "true", "ten", "12.5"):
        with pytest.raises(SweepError, match=r"report.cap=.* is invalid: expected a whole number of seeds from 3 "):
            load_sweep(sweep_file(tmp_path, "report: {study: true, cap: " + bad + "}"),
                       output_dir=str(tmp_path / "o"))
    with pytest.raises(SweepError, match="report.cap is given but report.study is not true"):
        load_sweep(sweep_file(tmp_path, "report: {cap: 20}"), output_dir=str(tmp_path / "o"))
    sw = load_sweep(sweep_file(tmp_path, "report: {study: true, cap: 20}"), output_dir=str(tmp_path / "o"))
    assert sw.report_cap == 20 and sweep_design(sw).cap == 20
    plain = load_sweep(sweep_file(tmp_path, "report: {study: true}"), output_dir=str(tmp_path / "o"))
    assert sweep_design(plain).cap == 10
    out = tmp_path / "out"
    assert main(["sweep", str(sweep_file(tmp_path, "report: {study: true, cap: 12}")), "--output-dir", str(out),
                 "--no-progress"]) == 0
    doc = json.loads((out.resolve() / "st" / "sweep.json").read_text())
    assert doc["report"] == {"study": True, "selection": None, "cap": 12}


def test_a_study_grid_that_gives_one_arm_two_settings_is_refused_before_any_run(tmp_path, capsys):
    two_lrs = HEAD.replace("  seed: [0]\n", "  seed: [0]\n  train.lr: [1.0e-4, 2.0e-4]\n")
    out = tmp_path / "out"
    assert main(["sweep", str(sweep_file(tmp_path, "report: {study: true}", two_lrs)), "--dry-run",
                 "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.study is invalid for this grid: its study arm grpo would hold two settings" \
        in err[0] and "train.lr=0.0002 (the arm's: 0.0001)" in err[0]
    assert not out.exists()
    # the same grid without a study is an ordinary sweep; arms the study names apart (staleness) are two arms
    assert main(["sweep", str(sweep_file(tmp_path, "report: {columns: [wall_seconds]}", two_lrs)), "--dry-run",
                 "--output-dir", str(out)]) == 0
    stale = HEAD.replace("  seed: [0]\n", "  seed: [0]\n  train.staleness: [0, 1]\n")
    assert main(["sweep", str(sweep_file(tmp_path, "report: {study: true}", stale)), "--dry-run",
                 "--output-dir", str(out)]) == 0


def test_prm_gate_and_retired_claims_are_shown_and_recorded_in_sweep_json(tmp_path, study):
    """report.prm_selection (the learned-PRM gate of claims 4 and 8) and report.retired ({claim id: why}): resolved
    and checked before any work, said by --dry-run, kept in sweep.json for the study report
    (tests/harness/report/test_study_prm_gate.py reads them)."""
    with pytest.raises(SweepError, match=r"report.retired has the key 'x': expected a claim id"):
        load_sweep(sweep_file(tmp_path, "report: {study: true, retired: {x: why}}"), output_dir=str(tmp_path / "o"))
    path = sweep_file(tmp_path, "report: {study: true, prm_selection: ../prm_sel, retired: {7: 'never selected',"
                                " 5: 'the interpreter'}}")
    sw = load_sweep(path, output_dir=str(tmp_path / "o"))
    prm = (tmp_path / "prm_sel").resolve()
    assert sw.report_prm_selection == prm and sw.report_retired == {"7": "never selected", "5": "the interpreter"}
    out = tmp_path / "out"
    p = run_cli(path, out, "--dry-run")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (f"; the learned-PRM gate (claims 4 and 8) from {prm} (does not exist yet); retired claims "
            f"(report.retired): 5, 7") in p.stdout
    assert main(["sweep", str(path), "--output-dir", str(out), "--no-progress"]) == 0
    doc = json.loads((out.resolve() / "st" / "sweep.json").read_text())
    assert doc["report"] == {"study": True, "selection": None, "prm_selection": str(prm),
                             "retired": {"7": "never selected", "5": "the interpreter"}}
