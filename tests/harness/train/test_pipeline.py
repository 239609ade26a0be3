"""Pipelined sampling with a fixed staleness k (harness/train/pipeline.py, issue 46 item 1): the rollouts of step t
come from the weights after update max(0, t - k) exactly, whatever the timing of the sampler thread; two runs
agree, a killed and resumed run agrees with an uninterrupted one, and k = 0 leaves the run id alone.

The tiny runs (tests/support/tiny_runs.py) score every completion 0 (an untrained 16-wide model), so nothing
would learn and every k would look alike: here a completion's reward is the parity of its first character,
which gives groups with varied rewards and weights that move."""
from __future__ import annotations

import copy
import random
import time

import pytest
import torch

from evals.catalog import get_task
from harness.config.schema import load_config
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.sampling import sample
from harness.foundation.base import ConfigError
from harness.rundir.ids import run_id
from harness.train import loop
from harness.train import pipeline as pl
from harness.train.checkpoint import checkpoint_path
from harness.train.stage import stage_problems, stage_seed
from tiny_runs import TINY_RUN, run_result, stop_before_stage  # tests/support

QUICKSTART = "harness/configs/quickstart.yaml"


def _parity(task, reps, ro, prm=None):
    return torch.tensor([float(ord(c[0]) % 2) if c else 0.0 for c in ro.completions]), []


@pytest.fixture(autouse=True)
def varied_rewards(monkeypatch):
    monkeypatch.setattr(loop, "score", _parity)


def _cfg(root, *extra):
    return load_config(QUICKSTART, TINY_RUN + [f"output_dir={root}", f"warmup.cache_dir={root}/wc", "train.lr=0.01",
                                               "train.save_final_model=true", "sampling.samples_per_prompt=4",
                                               "train.prompts_per_step=4", *extra])


def test_k2_twice_and_after_a_kill_gives_the_same_run(tmp_path):
    a = _cfg(tmp_path / "a", "train.staleness=2")
    loop.train(a, progress=False)
    got_a = run_result(a)
    staleness = [r["offpolicy/staleness"] for r in got_a[0] if "offpolicy/staleness" in r]
    assert staleness == [0, 1, 2, 2]  # min(t, k): the first stages are sampled by the starting weights
    b = _cfg(tmp_path / "b", "train.staleness=2")
    stop_before_stage(b, 2)
    saved = torch.load(checkpoint_path(loop.run_dir(b)), weights_only=True)
    assert sorted(saved["pipeline"]["versions"]) == [0, 1]  # stages 2 and 3 are sampled by versions 0 and 1
    loop.train(b, progress=False)
    assert run_result(b) == got_a
    c = _cfg(tmp_path / "c", "train.staleness=2")
    loop.train(c, progress=False)
    assert run_result(c) == got_a
    on = _cfg(tmp_path / "on")
    loop.train(on, progress=False)
    got_on = run_result(on)
    assert got_on[1] != got_a[1]  # staleness changes what is learned
    assert [r.get("rollout/entropy_est") for r in got_on[0]][:2] == [r.get("rollout/entropy_est") for r in
                                                                      got_a[0]][:2]  # step 1: both from version 0
    assert not any(k.startswith("offpolicy/") for r in got_on[0] for k in r)  # k = 0: today's rows


def test_default_fields_leave_run_ids_and_config_alone(tmp_path):
    base = _cfg(tmp_path)
    same = _cfg(tmp_path, "train.staleness=0", "algorithm.correction=none", "algorithm.correction_cap=2.0",
                "sampling.threads=0")
    assert run_id(base) == run_id(same)
    assert "staleness" not in base.effective_dict()["train"] and "correction" not in base.effective_dict()["algorithm"]
    assert len({run_id(_cfg(tmp_path, *s)) for s in ([], ["train.staleness=1"], ["sampling.dtype=bfloat16"],
                                                     ["algorithm.correction=token_tis"])}) == 4


def test_staleness_refuses_dynamic_sampling(tmp_path):
    with pytest.raises(ConfigError, match="train.staleness=1 is invalid.*dynamic sampling"):
        _cfg(tmp_path, "train.staleness=1", "algorithm.name=dapo")
    with pytest.raises(ConfigError, match="algorithm.correction"):
        _cfg(tmp_path, "algorithm.correction=tis")


@pytest.mark.parametrize("k,backend", [(1, "hf"), (3, "hf"), (2, "paged")])
def test_each_stage_is_drawn_by_exactly_version_t_minus_k_whatever_the_timing(tmp_path, monkeypatch, k, backend):
    """A learner stand-in moves the weights after every stage; the sampler thread is slowed at random. Stage t's
    rollouts equal a fresh sampling of its prompts and seed by the weights after max(0, t - k) moves. The paged
    backend (torch's global generator) samples in the learner's thread, from the same versions."""
    threads = torch.get_num_threads()
    cfg = _cfg(tmp_path, f"train.staleness={k}", "sampling.max_new_tokens=6", f"sampling.threads={threads + 1}",
               f"sampling.backend={backend}")
    tok = build_char_tokenizer()
    task = get_task(cfg.task)
    task.bind_tokenizer(tok)
    policy = build_tiny_model(cfg.model, tok, seed=3)
    real, jitter = pl.sample, random.Random(0)

    def slow(*a, **kw):
        time.sleep(jitter.random() * 0.02)
        return real(*a, **kw)
    monkeypatch.setattr(pl, "sample", slow)
    p = pl.for_run(cfg, None, task, tok, policy, _parity)
    if backend == "hf":
        in_force = p.pool.submit(torch.get_num_threads).result()
        assert (p.threads, in_force, torch.get_num_threads()) == (threads + 1, threads + 1, threads)  # learner's alone
    else:
        assert p.pool is None
    versions = [copy.deepcopy(policy.state_dict())]
    p.start(0, policy, 0)
    try:
        for t in range(6):
            drawn = p.take(t)
            assert drawn.version == max(0, t - k)
            ref = build_tiny_model(cfg.model, tok, seed=0)
            ref.load_state_dict(versions[drawn.version])
            problems = stage_problems(task, cfg.seed, t, cfg.train.prompts_per_step)
            want = sample(ref, tok, [task.format_prompt(q) for q in problems], n=cfg.sampling.samples_per_prompt,
                          max_new_tokens=6, seed=stage_seed(cfg.seed, t), offsets=False, backend=backend)
            assert torch.equal(drawn.draw.rollouts.completion_ids, want.completion_ids)
            assert torch.equal(drawn.draw.rollouts.logprobs, want.logprobs)
            with torch.no_grad():  # the update
                for w in policy.parameters():
                    w.add_(0.05 * torch.randn_like(w))
            versions.append(copy.deepcopy(policy.state_dict()))
            p.handover(t + 1, policy)
            assert set(p.versions) == set(range(max(0, t + 1 - k), t + 2))  # what a resume would need, no more
    finally:
        p.close()
