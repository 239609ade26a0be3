"""Reports and studies, round 4 (issue 48): written to a stage and moved into place whole (a kill or a
full disk mid-report leaves the old report as it was, no torn or 0-byte PNG), a run whose per-problem
records are cut short or disagree with its summary is listed, excluded, and said on stderr and in the
header, and report.md carries no raw HTML from a run field (report.html escapes it already)."""
from __future__ import annotations

import csv
import errno
import json
from pathlib import Path

import pytest

from _fake_results import make_study_run, make_sweep  # tests/support
from harness.cli.main import main
from harness.report import build as report_build
from harness.report import study as report_study
from harness.report.decisions import Design
from harness.report.format import md_safe

PAYLOAD = "<img src=x onerror=alert(1)>"
START = {"acc": 0.40, "ood": 0.20, "pass": [0.40, 0.60], "maj": [0.40, 0.40]}
FINAL = {"grpo": (0.60, 0.25), "rft": (0.55, 0.22)}
DESIGN = Design(first_look=2, cap=2, n_boot=200)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _failed_run_says(sweep: Path, text: str) -> None:
    """The failed run's summary ``error`` (a run field the runs table shows) set to ``text``."""
    for d in sweep.iterdir():
        f = d / "summary.json"
        if f.is_file() and json.loads(f.read_text())["status"] == "failed":
            s = json.loads(f.read_text())
            s["error"] = text
            f.write_text(json.dumps(s))
            return
    raise AssertionError("no failed run in the fake sweep")


def test_report_md_escapes_raw_html_from_run_fields(tmp_path):
    sweep = make_sweep(tmp_path)
    _failed_run_says(sweep, f"RuntimeError: {PAYLOAD}")
    res = report_build.build_report(sweep)
    md = res["markdown"].read_text()
    assert "onerror" in md  # the text is there, as text
    assert "<img" not in md and "&lt;img src=x" in md
    assert "<img src=x" not in res["html"].read_text()


def test_md_safe_keeps_comparisons_and_code_spans():
    assert md_safe("p < 0.05, a <= b") == "p < 0.05, a <= b"
    assert md_safe("`harness report <sweep folder x>`") == "`harness report <sweep folder x>`"
    assert md_safe(f"`x` {PAYLOAD} `y`") == f"`x` &lt;{PAYLOAD[1:]} `y`"  # a field closing a span: escaped
    assert md_safe(f"x` {PAYLOAD} `y") == f"x` {PAYLOAD} `y"  # inside a code span: shown as text
    assert md_safe("</b><!-- c -->") == "&lt;/b>&lt;!-- c -->"


def test_a_report_that_fails_part_way_leaves_the_old_one_whole(tmp_path, monkeypatch):
    sweep = make_sweep(tmp_path)
    report_build.build_report(sweep)
    for f in (sweep / "report").rglob("*.*"):  # an older report: other bytes than this one would write
        f.write_bytes(b"OLD " + f.name.encode())
    before = _tree(sweep / "report")

    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(report_build, "write_csvs", full_disk)  # after the plots, before report.md
    with pytest.raises(OSError):
        report_build.build_report(sweep)
    assert _tree(sweep / "report") == before
    assert [p.name for p in sweep.iterdir() if p.name.startswith(".")] == []  # no stage left behind
    assert all(p.stat().st_size > 0 for p in (sweep / "report" / "plots").iterdir())


def _study(root: Path) -> Path:
    sweep = root / "study"
    for algo, (acc, ood) in FINAL.items():
        for seed in (0, 1):
            final = {"acc": acc + 0.02 * seed, "ood": ood, "pass": [acc, acc + 0.1], "maj": [acc, acc]}
            make_study_run(sweep, algo, seed, start=START, final=final, rss=300.0)
    (sweep / "sweep.json").write_text(json.dumps({"name": "study"}))
    return sweep


def test_a_study_killed_part_way_leaves_the_old_report_and_claims(tmp_path, monkeypatch):
    sweep = _study(tmp_path)
    report_study.build_study_report(sweep, n_boot=20, design=DESIGN)
    before = _tree(sweep / "study")
    real = report_study._write_csv

    def killed_after_claims(path, rows):
        real(path, rows)
        if path.name == "claims.csv":
            raise KeyboardInterrupt  # a kill between claims.csv and report.md
    monkeypatch.setattr(report_study, "_write_csv", killed_after_claims)
    with pytest.raises(KeyboardInterrupt):
        report_study.build_study_report(sweep, n_boot=20, design=DESIGN)
    assert _tree(sweep / "study") == before


def _cut_records(run_dir: Path, step_file: str) -> None:
    f = run_dir / "eval" / step_file
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[:len(lines) // 2]))


def test_a_run_with_records_cut_short_is_excluded_and_said(tmp_path, capsys):
    sweep = _study(tmp_path)
    cut = next(d for d in sorted(sweep.iterdir()) if d.name.startswith("grpo-s1"))
    final_step = max(int(p.stem.split("_")[-1]) for p in (cut / "eval").glob("arith_[0-9]*.jsonl"))
    _cut_records(cut, f"arith_{final_step}.jsonl")
    rc = main(["report", str(sweep), "--study"])
    err = capsys.readouterr().err
    assert rc == 0
    said = [line for line in err.splitlines() if cut.name in line]
    assert said and "excluded from the study" in said[0] and "final evaluation" in said[0], err
    md = (sweep / "study" / "report.md").read_text()
    head = md.split("## ", 1)[0]
    assert "incomplete or inconsistent per-problem records" in head and cut.name in head
    seeds = next(line for line in md.splitlines() if "Seeds per algorithm" in line)
    assert "GRPO: 1 (0)" in seeds or "grpo: 1 (0)" in seeds.lower(), seeds
    with open(sweep / "study" / "claims.csv") as f:
        assert all(cut.name not in json.dumps(r) for r in csv.DictReader(f))


def test_records_that_disagree_with_the_summary_exclude_the_run(tmp_path, capsys):
    sweep = _study(tmp_path)
    bad = next(d for d in sorted(sweep.iterdir()) if d.name.startswith("rft-s0"))
    f = bad / "eval" / "arith_0.jsonl"
    recs = [json.loads(line) for line in f.read_text().splitlines()]
    for r in recs:  # every greedy answer graded right: the mean no longer matches the summary
        if isinstance(r.get("greedy"), dict):
            r["greedy"]["correct"] = True
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    report_study.build_study_report(sweep, n_boot=20, design=DESIGN)
    err = capsys.readouterr().err
    assert f"run {bad.name}: initial evaluation" in err and "differs from the summary" in err
    assert bad.name in (sweep / "study" / "report.md").read_text().split("## ", 1)[0]


@pytest.mark.parametrize("study", [False, True])
def test_report_refuses_an_output_folder_with_other_files(study, tmp_path, capsys):
    sweep = _study(tmp_path) if study else make_sweep(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    rc = main(["report", str(sweep), "--output-dir", str(out)] + (["--study"] if study else []))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "did not write (notes.txt)" in err[0], err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_records_cut_short_with_the_same_mean_are_still_excluded(tmp_path, capsys):
    """Problems taken out of a run's final records so that their mean still equals the summary's:
    fewer problems than the other runs' is itself the reason."""
    sweep = _study(tmp_path)
    cut = next(d for d in sorted(sweep.iterdir()) if d.name.startswith("grpo-s1"))
    final_step = max(int(p.stem.split("_")[-1]) for p in (cut / "eval").glob("arith_[0-9]*.jsonl"))
    f = cut / "eval" / f"arith_{final_step}.jsonl"
    recs = [json.loads(line) for line in f.read_text().splitlines()]
    right = [r for r in recs if r["greedy"]["correct"]]
    wrong = [r for r in recs if not r["greedy"]["correct"]]
    assert (len(right), len(wrong)) == (310, 190)  # acc 0.62 of 500
    keep = right[31:] + wrong[19:]  # 279 of 450: still 0.62
    f.write_text("".join(json.dumps(r) + "\n" for r in keep))
    report_study.build_study_report(sweep, n_boot=20, design=DESIGN)
    err = capsys.readouterr().err
    assert f"run {cut.name}: final evaluation: 450 problems' records, the other runs have 500" in err, err


def test_the_sweeps_own_report_folder_is_never_replaced_with_a_users_files_in_it(tmp_path):
    """`harness sweep` and `quickstart` write <sweep>/report through build_report: the check is there too."""
    sweep = make_sweep(tmp_path)
    (sweep / "report").mkdir()
    (sweep / "report" / "draft.docx").write_bytes(b"mine")
    with pytest.raises(Exception, match="report folder=.* did not write \\(draft.docx\\)"):
        report_build.build_report(sweep)
    assert sorted(p.name for p in (sweep / "report").iterdir()) == ["draft.docx"]


def test_the_study_report_md_escapes_raw_html_from_run_fields(tmp_path):
    sweep = _study(tmp_path)
    odd = next(d for d in sorted(sweep.iterdir()) if d.name.startswith("rft-s1"))
    s = json.loads((odd / "summary.json").read_text())
    s["status"] = PAYLOAD  # not finished: listed among the excluded runs with its status
    (odd / "summary.json").write_text(json.dumps(s))
    md = report_study.build_study_report(sweep, n_boot=20, design=DESIGN).read_text()
    assert "onerror" in md and "<img" not in md
