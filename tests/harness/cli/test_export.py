"""`harness export RUNS_DIR DEST`: finished run folders copied trimmed (no completions, weights,
checkpoints, caches or logs; only the start and final evaluation records), idempotent; copied back
into a results folder they plan as finished; bad inputs are one line, exit 2, before any copying."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import sweep_fake_trainer
from evals.metrics import problem_curves
from evals.records import compact_curves, compact_ks
from harness.cli.main import main
from harness.foundation.base import to_dict
from harness.rundir.export import trim_record
from harness.sweep.plan import load_sweep
from support_paths import REPO

SWEEP = """name: study
config:
  train.prompts_per_step: 2
  sampling.samples_per_prompt: 4
grid:
  algorithm: [grpo, rft]
  seed: [0]
budget: {unit: samples, amount: 24, eval_points: 3}
"""
N = 6                              # samples per problem
TEXT = "COMPLETION-TEXT"           # in every completion, so a leak is found by grepping


def _item(i: int, j: int, gold: str) -> dict:
    """One graded item as evals.records.record_item writes it (arith: with "valid")."""
    ans = gold if (i + j) % 3 else str(int(gold) + 1)
    ok = ans == gold
    return {"completion": f"{TEXT} {i}-{j}: 2*{i}=... #### {ans}", "answer": ans, "key": ans, "correct": ok,
            "finished": True, "num_tokens": 20 + j, "valid": ok and j % 2 == 0}


def _records(step: int, samples: bool, greedy: bool = True, problems: int = 4) -> list[dict]:
    """Records of one evaluation file, as harness.engine.evaluate writes them."""
    out = []
    for i in range(problems):
        gold = str(3 * i + step)
        rec = {"id": f"{i}+{i}*2", "question": f"What is {i}+{i}*2? {TEXT}", "gold": gold,
               "greedy": _item(i, 99, gold) if greedy else None, "samples": []}
        if samples:
            rec["samples"] = [_item(i, j, gold) for j in range(N)]
            curves = problem_curves([s["key"] for s in rec["samples"]], [s["correct"] for s in rec["samples"]])
            rec["num_correct"], rec["pass@k"], rec["maj@k"] = curves["num_correct"], curves["pass@k"], curves["maj@k"]
            rec["num_valid"] = sum(s["valid"] for s in rec["samples"])
        out.append(rec)
    return out


def _write_jsonl(path: Path, recs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))


@pytest.fixture
def sweep_results(tmp_path):
    """results/study/ as a real sweep leaves it: two finished runs (the fake trainer's files plus
    evaluation records at steps 0, 1, 2, 3 with samples, out-of-domain and validation records,
    final_model/, checkpoint/, worker.log), one failed run, sweep.json, report/ and _cache/."""
    (tmp_path / "sweeps").mkdir()
    sfile = tmp_path / "sweeps" / "study.yaml"
    sfile.write_text(SWEEP)
    results = tmp_path / "results"
    sw = load_sweep(sfile, output_dir=str(results))
    for r in sw.runs:
        sweep_fake_trainer.train(r.config, resume=True, progress=False)
        (r.run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(r.config), sort_keys=False))  # as the trainer
        ev = r.run_dir / "eval"
        for step in (0, 1, 2, 3):
            final = step in (0, 3)
            _write_jsonl(ev / f"arith_{step}.jsonl", _records(step, samples=False))
            if final:
                _write_jsonl(ev / f"arith_{step}_samples.jsonl", _records(step, samples=True, greedy=False, problems=2))
                _write_jsonl(ev / f"arith_ood_{step}.jsonl", _records(step + 10, samples=True))
        _write_jsonl(ev / "arith_validation.jsonl", _records(7, samples=False))
        (r.run_dir / "final_model").mkdir()
        (r.run_dir / "final_model" / "model.safetensors").write_bytes(b"\0" * 4096)
        (r.run_dir / "worker.log").write_text("log\n")
        assert (r.run_dir / "checkpoint" / "state.json").is_file()
    sd = sw.sweep_dir
    failed = sd / "ppo-s0-00000000"
    failed.mkdir()
    (failed / "summary.json").write_text(json.dumps({"run_id": failed.name, "status": "failed"}))
    (failed / "metrics.jsonl").write_text("")
    (sd / "sweep.json").write_text(json.dumps({"name": "study", "runs": [r.run_id for r in sw.runs]}, indent=2))
    (sd / "report").mkdir()
    (sd / "report" / "report.md").write_text("# report\n")
    (sd / "_cache" / "warmup").mkdir(parents=True)
    (sd / "_cache" / "warmup" / "x.bin").write_bytes(b"1" * 100)
    return sfile, sw


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_export_trims_runs_and_is_idempotent(sweep_results, tmp_path, capsys):
    _, sw = sweep_results
    dest = tmp_path / "export"
    assert main(["export", str(sw.sweep_dir), str(dest)]) == 0
    out = capsys.readouterr().out.splitlines()
    ids = sorted(r.run_id for r in sw.runs)
    assert out[0] == "skipped ppo-s0-00000000: status 'failed', not finished"
    tree = _tree(dest)
    per_run = ["config.yaml", "eval/arith_0.jsonl", "eval/arith_0_samples.jsonl", "eval/arith_3.jsonl",
               "eval/arith_3_samples.jsonl", "eval/arith_ood_0.jsonl", "eval/arith_ood_3.jsonl",
               "eval/arith_validation.jsonl", "metrics.jsonl", "summary.json"]
    assert sorted(tree) == sorted(["sweep.json"] + [f"{rid}/{f}" for rid in ids for f in per_run])
    total = sum(len(b) for b in tree.values())
    assert out[-1] == (f"exported 2 run(s) to {dest}, skipped 1, {total:,} bytes in all "
                       f"({len(tree)} file(s) written, the rest already up to date)")
    for rid in ids:    # copied as they are
        for f in ("config.yaml", "summary.json", "metrics.jsonl"):
            assert tree[f"{rid}/{f}"] == (sw.sweep_dir / rid / f).read_bytes()
    assert tree["sweep.json"] == (sw.sweep_dir / "sweep.json").read_bytes()
    # no completion or question text anywhere; every report-relevant field is the original's
    assert not any(TEXT.encode() in b for b in tree.values())
    for rid in ids:
        for name in [f for f in per_run if f.startswith("eval/")]:
            orig = [json.loads(x) for x in (sw.sweep_dir / rid / name).read_text().splitlines()]
            lines = tree[f"{rid}/{name}"].decode().splitlines()
            trimmed = [json.loads(x) for x in lines]
            assert len(trimmed) == len(orig) == (2 if name.endswith("_samples.jsonl") else 4)
            for o, t in zip(orig, trimmed):
                assert t["id"] == o["id"] and t["gold"] == o["gold"]
                assert "question" not in t
                assert ("samples" in t) == (not o["samples"])  # an empty list stays, samples are compacted
                if o["greedy"] is None:
                    assert t["greedy"] is None
                else:
                    assert t["greedy"] == {k: o["greedy"][k] for k in ("key", "correct", "finished", "valid")}
                    assert list(t["greedy"]) == ["key", "correct", "finished", "valid"]   # the record's order
                if o["samples"]:  # compact: counts, histograms, curves at k = 1, 2, 4, ..., n
                    n = len(o["samples"])
                    assert t["n"] == n and t["num_correct"] == o["num_correct"]
                    assert t["num_valid"] == sum(x["valid"] for x in o["samples"])
                    assert t["ks"] == compact_ks(n)
                    for k in ("pass@k", "maj@k"):   # the same floats as the evaluator's curves
                        assert t[k] == [o[k][j - 1] for j in t["ks"]]
                    full = compact_curves(t)
                    assert full["pass@k"] == o["pass@k"] and full["maj@k"] == o["maj@k"]
            assert all(", " not in x and ": " not in x for x in lines)  # compact
            first = json.loads((sw.sweep_dir / rid / name).read_text().splitlines()[0])
            if not first["samples"]:  # a record without samples keeps its own key order
                assert list(trimmed[0]) == [k for k in first if k != "question"]
    # the trimmed samples file is a fraction of the original
    rid = ids[0]
    assert len(tree[f"{rid}/eval/arith_ood_3.jsonl"]) < 0.6 * (sw.sweep_dir / rid / "eval/arith_ood_3.jsonl").stat().st_size
    # again: the same bytes, nothing rewritten
    mtimes = {p: p.stat().st_mtime_ns for p in dest.rglob("*") if p.is_file()}
    assert main(["export", str(sw.sweep_dir), str(dest)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("(0 file(s) written, the rest already up to date)")
    assert _tree(dest) == tree
    assert {p: p.stat().st_mtime_ns for p in dest.rglob("*") if p.is_file()} == mtimes
    # --runs: a glob over the run folders' names
    dest2 = tmp_path / "only_rft"
    assert main(["export", str(sw.sweep_dir), str(dest2), "--runs", "rft-*"]) == 0
    assert sorted(p.name for p in dest2.iterdir()) == sorted(["sweep.json", next(i for i in ids if i.startswith("rft-"))])


def test_exported_runs_plan_as_finished_in_a_results_folder(sweep_results, tmp_path, capsys):
    sfile, sw = sweep_results
    assert [r.state for r in sw.runs] == ["new", "new"]   # planned before the fake trainer ran
    assert [r.state for r in load_sweep(sfile, output_dir=str(tmp_path / "results")).runs] == ["finished"] * 2
    dest = tmp_path / "committed"
    assert main(["export", str(sw.sweep_dir), str(dest)]) == 0
    fresh = tmp_path / "elsewhere" / "results"
    shutil.copytree(dest, fresh / "study")
    again = load_sweep(sfile, output_dir=str(fresh))
    assert [r.run_dir.parent for r in again.runs] == [fresh.resolve() / "study"] * 2
    assert [r.state for r in again.runs] == ["finished", "finished"]
    assert all(not (r.run_dir / "checkpoint").exists() for r in again.runs)


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli.main", "export", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_bad_inputs_one_line_exit_2_before_copying(sweep_results, tmp_path):
    _, sw = sweep_results
    cases = [
        ((tmp_path / "nope", tmp_path / "d1"), "RUNS_DIR=", "no such directory", tmp_path / "d1"),
        ((sw.sweep_dir, sw.sweep_dir / "exported"), "DEST=", "inside RUNS_DIR", sw.sweep_dir / "exported"),
        ((sw.sweep_dir, sw.sweep_dir), "DEST=", "inside RUNS_DIR", None),
        ((sw.sweep_dir, tmp_path / "d2", "--runs", "ppo-*"), "RUNS_DIR=", "no finished runs to export (1 run folder(s) "
         "matching --runs 'ppo-*', none finished: ppo-s0-00000000: status 'failed', not finished)", tmp_path / "d2"),
        ((sw.sweep_dir / "report", tmp_path / "d3"), "RUNS_DIR=", "no finished runs to export (no run folders",
         tmp_path / "d3"),
    ]
    for args, field, why, dest in cases:
        p = _cli(*args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"harness: config error: {field}") and why in lines[0], lines
        assert p.stdout == ""
        if dest is not None:
            assert not dest.exists()
    (tmp_path / "afile").write_text("x")
    p = _cli(sw.sweep_dir, tmp_path / "afile")
    assert p.returncode == 2 and "DEST=" in p.stderr and "a file, not a directory" in p.stderr
    assert (tmp_path / "afile").read_text() == "x"


def test_trim_record_keeps_order_and_drops_texts():
    rec = {"id": "1+1", "question": "q", "gold": "2", "greedy": {"completion": "c", "answer": "2", "key": "2",
                                                                  "correct": True, "finished": True, "num_tokens": 3},
           "samples": [{"completion": "c", "answer": None, "key": None, "correct": False, "finished": False,
                        "num_tokens": 9}], "num_correct": 0, "pass@k": [0.0], "maj@k": [0.0]}
    assert json.dumps(trim_record(rec), separators=(",", ":")) == (
        '{"id":"1+1","gold":"2","greedy":{"key":"2","correct":true,"finished":true},'
        '"n":1,"num_correct":0,"answers":[],"no_answer":1,"ks":[1],"pass@k":[0.0],"maj@k":[0.0]}')
    # a record without samples keeps its own fields, texts dropped
    assert json.dumps(trim_record({k: v for k, v in rec.items() if k != "samples"}), separators=(",", ":")) == (
        '{"id":"1+1","gold":"2","greedy":{"key":"2","correct":true,"finished":true},'
        '"num_correct":0,"pass@k":[0.0],"maj@k":[0.0]}')
    assert "greedy" not in trim_record({"id": "x", "greedy": "a bare completion text"})


def test_help_says_what_is_left_out():
    p = subprocess.run([sys.executable, "-m", "harness.cli.main", "export", "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    text = " ".join(p.stdout.split())
    assert "intermediate evaluations' records are left out" in text and "--runs GLOB" in text


# ------------------------------------------------------------------ round 4 (issue 48): links and foreign folders

def test_export_never_copies_a_file_linked_out_of_a_run(sweep_results, tmp_path):
    """A run whose config.yaml links to a secret, or whose kept evaluation record links out, is
    skipped with the reason (the rule of `harness sync`); the secret is in no exported file."""
    _, sw = sweep_results
    secret = tmp_path / "id_rsa"
    secret.write_text("SECRET-KEY-MATERIAL\n")
    a, b = sorted(r.run_dir for r in sw.runs)
    (a / "config.yaml").unlink()
    (a / "config.yaml").symlink_to(secret)
    (b / "eval" / "arith_validation.jsonl").unlink()
    (b / "eval" / "arith_validation.jsonl").symlink_to(secret)
    dest = tmp_path / "export"
    p = _cli(sw.sweep_dir, dest, "--runs", "*-s0-*")
    assert p.returncode == 2 and "no finished runs to export" in p.stderr  # both skipped: nothing to export
    assert "config.yaml: it resolves to" in p.stderr and not dest.exists()
    (b / "eval" / "arith_validation.jsonl").unlink()  # b is whole again: exported, a still skipped
    _write_jsonl(b / "eval" / "arith_validation.jsonl", _records(7, samples=False))
    p = _cli(sw.sweep_dir, dest)
    assert p.returncode == 0, p.stderr
    assert f"skipped {a.name}: config.yaml: it resolves to {secret}" in p.stdout
    assert not (dest / a.name).exists()
    assert not any(b"SECRET-KEY-MATERIAL" in data for data in _tree(dest).values())


def test_export_refuses_a_symlinked_run_folder_in_dest(sweep_results, tmp_path):
    _, sw = sweep_results
    dest, elsewhere = tmp_path / "export", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    rid = sorted(r.run_id for r in sw.runs)[0]
    (dest / rid).symlink_to(elsewhere, target_is_directory=True)
    p = _cli(sw.sweep_dir, dest)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{rid} in it is a symbolic link" in lines[0] and "never writes through" in lines[0]
    assert sorted(x.name for x in elsewhere.iterdir()) == ["keep.txt"]
    assert sorted(x.name for x in dest.iterdir()) == [rid]


def test_export_never_writes_through_a_link_deeper_in_dest(sweep_results, tmp_path):
    _, sw = sweep_results
    dest, elsewhere = tmp_path / "export", tmp_path / "elsewhere"
    assert main(["export", str(sw.sweep_dir), str(dest)]) == 0
    elsewhere.mkdir()
    rid = sorted(r.run_id for r in sw.runs)[0]
    shutil.rmtree(dest / rid / "eval")
    (dest / rid / "eval").symlink_to(elsewhere, target_is_directory=True)
    p = _cli(sw.sweep_dir, dest)
    assert p.returncode == 2 and f"{dest / rid / 'eval'} is a symbolic link" in p.stderr, p.stderr
    assert list(elsewhere.iterdir()) == []


def test_export_refuses_a_dest_with_files_it_did_not_write(sweep_results, tmp_path):
    _, sw = sweep_results
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "config.json").write_text('{"mine": true}')
    p = _cli(sw.sweep_dir, dest)
    assert p.returncode == 2 and "did not write (config.json)" in p.stderr, p.stderr
    assert sorted(x.name for x in dest.iterdir()) == ["config.json"]
    assert main(["export", str(sw.sweep_dir), str(tmp_path / "export")]) == 0  # an export's own folder
    assert main(["export", str(sw.sweep_dir), str(tmp_path / "export")]) == 0  # is exported into again
