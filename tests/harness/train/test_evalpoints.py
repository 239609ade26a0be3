"""Evaluation points: the out-of-domain set, the n-sample subset, the shared start evaluation
(cached next to the warm-up, exactly equal to a fresh one), per-seed warm-ups, and a run's
wall-clock without the warm-up wait."""
import contextlib
import json
import time

import torch
from tiny_runs import TINY_RUN, stop_before_stage  # tests/support

from harness.config.schema import load_config
from harness.rundir.ids import run_id
from harness.train import loop as loop_mod
from harness.train import warmup as warmup_mod
from harness.train.checkpoint import checkpoint_path
from harness.train.loop import run_dir, train

TINY = [
    "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32",
    "task.min_ops=1", "task.max_ops=1", "task.eval_size=6", "warmup.steps=3", "warmup.examples_per_step=4",
    "sampling.samples_per_prompt=2", "sampling.max_new_tokens=8", "train.prompts_per_step=2",
    "train.threads=1", "train.save_final_model=false", "budget.unit=steps", "budget.amount=2",
    "budget.eval_points=1",
]


def _cfg(tmp_path, *extra, out="out"):
    return load_config(None, TINY + [f"output_dir={tmp_path / out}", *extra])


def test_ood_set_and_sample_subset_are_scored_at_start_and_end(tmp_path):
    cfg = _cfg(tmp_path, "eval.n=3", "eval.sample_problems=2", "eval.ood.enabled=true",
               "eval.ood.min_ops=2", "eval.ood.max_ops=2", "eval.ood.eval_size=5", "algorithm=grpo")
    s = train(cfg, progress=False)
    for ev in (s["initial_eval"], s["final_eval"]):
        assert ev["eval/arith/num_problems"] == 6 and ev["eval/arith/sample_problems"] == 2
        assert ev["eval/arith_ood/num_problems"] == 5 and ev["eval/arith_ood/sample_problems"] == 2
        assert {"eval/arith/pass@3", "eval/arith/maj@3", "eval/arith_ood/pass@3", "eval/arith_ood/acc"} <= set(ev)
    out = run_dir(cfg) / "eval"
    ood = [json.loads(line) for line in (out / "arith_ood_0.jsonl").read_text().splitlines()]
    assert len(ood) == 5 and all(sum(ch in "+-*" for ch in r["id"]) == 2 for r in ood)  # operands 1..9
    samples = [json.loads(line) for line in (out / "arith_0_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all(len(r["samples"]) == 3 for r in samples)


def test_start_evaluation_is_shared_by_algorithms_and_equals_a_fresh_one(tmp_path):
    a = train(_cfg(tmp_path, "algorithm=grpo", "eval.n=2"), progress=False)
    cache = list((tmp_path / "out" / "_cache" / "warmup").glob("*/initial_eval/*/metrics.json"))
    assert len(cache) == 1
    b_cfg = _cfg(tmp_path, "algorithm=rft", "eval.n=2")
    b = train(b_cfg, progress=False)
    assert b["initial_eval"] == a["initial_eval"]
    assert (run_dir(b_cfg) / "eval" / "arith_0.jsonl").read_text() == \
        (tmp_path / "out" / "default" / run_id(_cfg(tmp_path, "algorithm=grpo", "eval.n=2")) / "eval" /
         "arith_0.jsonl").read_text()
    # the same start computed afresh (another output folder, so no cache) gives the same numbers
    c = train(_cfg(tmp_path, "algorithm=rft", "eval.n=2", out="fresh"), progress=False)
    def scores(ev):
        return {k: v for k, v in ev.items() if not k.endswith("/seconds")}
    assert scores(c["initial_eval"]) == scores(a["initial_eval"]) and len(scores(a["initial_eval"])) >= 10
    # another seed is another start evaluation (its own sampling seeds)
    train(_cfg(tmp_path, "algorithm=grpo", "eval.n=2", "seed=1"), progress=False)
    assert len(list((tmp_path / "out" / "_cache" / "warmup").glob("*/initial_eval/*/metrics.json"))) == 2


def test_warmup_cache_defaults_under_the_output_dir_and_per_seed_keys(tmp_path):
    c0, c1 = _cfg(tmp_path, "seed=0"), _cfg(tmp_path, "seed=1")
    assert warmup_mod.warmup_dir(c0).parent == tmp_path / "out" / "_cache" / "warmup"
    assert warmup_mod.warmup_dir(c0) == warmup_mod.warmup_dir(c1)
    p0, p1 = _cfg(tmp_path, "seed=0", "warmup.per_seed=true"), _cfg(tmp_path, "seed=1", "warmup.per_seed=true")
    assert warmup_mod.warmup_dir(p0) != warmup_mod.warmup_dir(p1) != warmup_mod.warmup_dir(c1)
    assert warmup_mod.warmup_seed(p1) == 1 and warmup_mod.warmup_seed(c1) == 0
    # where the cache lives does not change the run id
    assert run_id(c0) == run_id(_cfg(tmp_path, "seed=0", f"warmup.cache_dir={tmp_path / 'elsewhere'}"))


def test_wall_clock_excludes_a_warmup_lock_wait(tmp_path, monkeypatch):
    real = warmup_mod._locked

    @contextlib.contextmanager
    def slow_lock(path):
        time.sleep(2.0)  # another worker holds the warm-up lock
        with real(path):
            yield

    monkeypatch.setattr(warmup_mod, "_locked", slow_lock)
    t0 = time.time()
    s = train(_cfg(tmp_path, "algorithm=grpo"), progress=False)
    total = time.time() - t0
    assert s["setup_seconds"]["warmup_wait"] >= 2.0
    assert s["warmup_seconds"] >= 2.0 + s["setup_seconds"]["warmup_build"] - 1e-9
    assert 0 < s["wall_seconds"] <= total - 2.0


def test_each_evaluation_is_a_phase_the_live_table_reads(tmp_path, monkeypatch):
    """The summary names the evaluation under way (the sweep's live table shows it; the bar is full
    during the last one) and drops it when training resumes: initial, intermediate, final."""
    from harness.train import loop as loop_mod
    seen = []
    real = loop_mod.evaluate

    def spy(model, tok, task, cfg, step, out_dir, final, perf, ood=None):
        seen.append((step, json.loads((out_dir / "summary.json").read_text()).get("phase")))
        return real(model, tok, task, cfg, step, out_dir, final, perf, ood=ood)

    monkeypatch.setattr(loop_mod, "evaluate", spy)
    s = train(_cfg(tmp_path, "algorithm=grpo", "budget.amount=4", "budget.eval_points=2",
                   "warmup.cache_dir=" + str(tmp_path / "nocache")), progress=False)
    assert seen == [(0, "initial evaluation"), (2, "evaluation"), (4, "final evaluation")]
    assert "phase" not in s and "phase" not in json.loads((tmp_path / "out").rglob("summary.json").__next__().read_text())


def test_an_evaluation_with_a_sample_subset_records_both_passes_seconds(tmp_path, monkeypatch):
    """The greedy pass over every problem and the n samples over the subset are two calls; the
    point's eval/<task>/seconds is their sum (it used to be the greedy pass's alone)."""
    from harness.train import evalpoints

    def fake(model, tok, task, problems, greedy, n, out_path, **kw):
        return ({"eval/arith/num_problems": len(problems), "eval/arith/seconds": 40.0 if n else 2.5,
                 **({"eval/arith/acc": 0.5} if greedy else {"eval/arith/pass@2": 0.75})})

    class Task:
        name = "arith"

        def eval_problems(self):
            return list(range(6))

    monkeypatch.setattr(evalpoints, "run_evaluation", fake)
    cfg = _cfg(tmp_path, "eval.n=2", "eval.sample_problems=2")
    ev = evalpoints._score(None, None, Task(), cfg, 0, tmp_path, 0, 2, False)
    assert ev["eval/arith/seconds"] == 42.5
    assert ev["eval/arith/num_problems"] == 6 and ev["eval/arith/sample_problems"] == 2
    assert ev["eval/arith/acc"] == 0.5 and ev["eval/arith/pass@2"] == 0.75


def test_start_validation_scores_are_recorded_cached_and_those_of_the_untrained_policy(tmp_path, monkeypatch):
    # at lr 1e-30 no weight moves (each update rounds away in float32): the end's validation records are the start's
    a_cfg = _cfg(tmp_path, "algorithm=grpo", "eval.validation=true", "train.lr=1e-30")
    a = train(a_cfg, progress=False)
    ev = run_dir(a_cfg) / "eval"
    start = [json.loads(line) for line in (ev / "arith_validation_start.jsonl").read_text().splitlines()]
    end = [json.loads(line) for line in (ev / "arith_validation.jsonl").read_text().splitlines()]
    assert len(start) == 6 and [r["id"] for r in start] == [r["id"] for r in end]
    assert [r["greedy"] for r in start] == [r["greedy"] for r in end]
    acc = sum(bool(r["greedy"]["correct"]) for r in start) / 6
    assert a["initial_val_eval"]["eval/arith/acc"] == a["final_val_eval"]["eval/arith/acc"] == acc
    assert a["initial_val_eval"]["eval/arith/num_problems"] == 6
    assert "initial_val_eval" not in train(_cfg(tmp_path, "algorithm=grpo"), progress=False)  # off by default
    # an entry of its own beside the test-set one; another run of the warm-up reads it (computing it would fail)
    entries = sorted(p.name for p in (tmp_path / "out" / "_cache" / "warmup").glob("*/initial_eval/*-validation"))
    assert len(entries) == 1
    real = loop_mod._validation_eval

    def end_only(run, start=False):
        assert not start, "the start's validation scores were computed again instead of read from the cache"
        return real(run, start)
    monkeypatch.setattr(loop_mod, "_validation_eval", end_only)
    b_cfg = _cfg(tmp_path, "algorithm=rft", "eval.validation=true", "train.lr=0.05")
    b = train(b_cfg, progress=False)
    assert b["initial_val_eval"] == a["initial_val_eval"]
    assert (run_dir(b_cfg) / "eval" / "arith_validation_start.jsonl").read_text() == \
        (ev / "arith_validation_start.jsonl").read_text()
    monkeypatch.setattr(loop_mod, "_validation_eval", real)
    # computed afresh (no cache in another output folder), after training at a real rate: still the start's
    c = train(_cfg(tmp_path, "algorithm=rft", "eval.validation=true", "train.lr=0.05", out="fresh"), progress=False)
    assert {k: v for k, v in c["initial_val_eval"].items() if not k.endswith("/seconds")} == \
        {k: v for k, v in a["initial_val_eval"].items() if not k.endswith("/seconds")}


def test_a_resume_keeps_the_starts_validation_score_and_never_scores_a_trained_policy_as_the_start(tmp_path,
                                                                                                   monkeypatch):
    cfg = load_config(None, TINY_RUN + [f"output_dir={tmp_path / 'a'}", "eval.validation=true", "train.lr=0.05"])
    whole = train(load_config(None, TINY_RUN + [f"output_dir={tmp_path / 'w'}", "eval.validation=true",
                                                "train.lr=0.05"]), progress=False)
    stop_before_stage(cfg, 2)
    real = loop_mod._validation_eval

    def end_only(run, start=False):
        assert not start, "the start's validation score was computed on resume, from a trained policy"
        return real(run, start)
    monkeypatch.setattr(loop_mod, "_validation_eval", end_only)
    s = train(cfg, progress=False)                       # resumed at step 2: the score comes from the resume point
    def scores(ev):
        return {k: v for k, v in ev.items() if not k.endswith("/seconds")}
    assert s["resumed_from_step"] == 2 and scores(s["initial_val_eval"]) == scores(whole["initial_val_eval"])
    # a resume point written before runs recorded it: left out, with a warning, not computed from the trained policy
    old = load_config(None, TINY_RUN + [f"output_dir={tmp_path / 'b'}", "eval.validation=true", "train.lr=0.05"])
    monkeypatch.setattr(loop_mod, "_validation_eval", real)
    stop_before_stage(old, 2)
    state_file = checkpoint_path(run_dir(old))
    state = torch.load(state_file, weights_only=True)
    state.pop("initial_val_eval")
    torch.save(state, state_file)
    monkeypatch.setattr(loop_mod, "_validation_eval", end_only)
    s = train(old, progress=False)
    assert s["status"] == "finished" and "initial_val_eval" not in s and "final_val_eval" in s
