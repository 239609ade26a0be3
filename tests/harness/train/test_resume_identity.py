"""A run resumes only where it can continue bit for bit (issue 48, item 3): under the numerics mode, the torch
thread count and the product source it started with. Another thread count (``train.threads: 0`` takes the
launcher's OMP_NUM_THREADS) or other code is refused in one line, exit 2, before anything is written; with
GRPO_HARNESS_RESUME_NEW_CODE=1 the run goes on with the new code and records both codes.

The run is tiny (1 layer, 16 wide, 2 prompts x 2 samples, 4-token completions), stopped before step 3 with its
checkpoint at step 2, once per module and copied into each test."""
from __future__ import annotations

import json
import shutil

import pytest

from harness.cli.main import main
from harness.config.schema import load_config
from harness.rundir import provenance
from harness.rundir.layout import read_json
from harness.train.loop import run_dir
from tiny_runs import TINY_RUN, stop_before_stage  # tests/support

QUICKSTART = "harness/configs/quickstart.yaml"
def _sets(root, cache):
    return TINY_RUN + ["train.threads=0", f"output_dir={root}", f"warmup.cache_dir={cache}"]


def _argv(sets):
    return ["train", "--no-progress", QUICKSTART] + [a for s in sets for a in ("--set", s)]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """(results root, warm-up cache) of a run on 1 thread (the launcher's OMP_NUM_THREADS), stopped at step 3."""
    root = tmp_path_factory.mktemp("interrupted")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        stop_before_stage(load_config(QUICKSTART, _sets(root / "results", root / "wc")))
    return root / "results", root / "wc"


@pytest.fixture
def resumable(interrupted, tmp_path, monkeypatch):
    src, cache = interrupted
    shutil.copytree(src, tmp_path / "results")
    sets = _sets(tmp_path / "results", cache)
    monkeypatch.delenv(provenance.ENV_RESUME_NEW_CODE, raising=False)
    return sets, run_dir(load_config(QUICKSTART, sets))


def test_another_thread_count_is_refused_before_anything_is_written(resumable, monkeypatch, capsys):
    sets, out = resumable
    before = (out / "summary.json").read_bytes(), (out / "metrics.jsonl").read_bytes()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert main(_argv(sets)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "cannot resume bit for bit here: it ran on 1 torch thread(s) and this process runs 2" in err[0]
    assert "train.threads=1" in err[0] and "--restart" in err[0]
    assert ((out / "summary.json").read_bytes(), (out / "metrics.jsonl").read_bytes()) == before
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the count it started with: it resumes and finishes
    assert main(_argv(sets)) == 0
    s = read_json(out / "summary.json")
    assert s["status"] == "finished" and s["resumed_from_step"] == 2 and "earlier" not in s["provenance"]


def test_other_code_is_refused_unless_asked_and_then_both_codes_are_recorded(resumable, monkeypatch, capsys):
    sets, out = resumable
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    started = read_json(out / "summary.json")["provenance"]["code"]
    assert started["source"] == provenance.source_digest()
    new = dict(started, source="0123456789abcdef")
    monkeypatch.setattr(provenance, "code_version", lambda: new)
    assert main(_argv(sets)) == 2
    err = capsys.readouterr().err
    assert f"it ran on commit {started['commit'][:12]}" in err and "source 0123456789abcdef" in err
    assert provenance.ENV_RESUME_NEW_CODE in err
    monkeypatch.setenv(provenance.ENV_RESUME_NEW_CODE, "1")
    assert main(_argv(sets)) == 0
    prov = read_json(out / "summary.json")["provenance"]
    assert prov["code"] == new and [e["code"] for e in prov["earlier"]] == [started]
    assert any("resumed from an attempt on" in line for line in provenance.describe(prov))


def test_restart_is_always_allowed(resumable, monkeypatch):
    sets, out = resumable
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert main(_argv(sets) + ["--restart"]) == 0
    s = read_json(out / "summary.json")
    assert s["status"] == "finished" and s["provenance"]["numerics"]["threads"] == 2 and not s.get("resumed_from_step")


def test_resume_problem_rules():
    base = {"numerics": {"mode": "portable", "threads": 2}, "code": {"commit": "a" * 40, "source": "s1"}}
    assert provenance.resume_problem(None, base) is None  # a run from before provenance: resumes as before
    assert provenance.resume_problem(base, json.loads(json.dumps(base))) is None
    native = {**base, "numerics": {"mode": "native", "threads": 2}}
    assert "it ran in portable numerics and this process runs native" in provenance.resume_problem(base, native)
    other = {**base, "code": {"commit": "a" * 40, "dirty": True, "source": "s2"}}
    assert "(dirty tree), source s2" in provenance.resume_problem(base, other)
    assert provenance.resume_problem(base, other, allow_new_code=True) is None
    assert provenance.carry_earlier(base, other)["earlier"] == [base]
    assert "earlier" not in provenance.carry_earlier(base, json.loads(json.dumps(base)))
