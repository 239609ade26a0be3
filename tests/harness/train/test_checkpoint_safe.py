"""Checkpoints load with weights_only=True: RNG states round-trip as plain types / tensors, and
a crafted pickle in checkpoint/state.pt is refused (its code never runs)."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from harness.train import checkpoint as ck


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_rng_state_round_trips_through_weights_only(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    p = tmp_path / "state.pt"
    torch.save({"counters": {"step": 3, "samples": 96}, "passed": 1, "rng": ck._rng_state()}, p)
    expect = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    state = ck.load_state(p)
    ck._set_rng_state(state["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect
    assert state["counters"] == {"step": 3, "samples": 96}


def test_crafted_pickle_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "checkpoint" / "state.pt"
    p.parent.mkdir()
    torch.save({"learner": _Evil(), "rng": {}}, p)
    with pytest.raises(RuntimeError, match="refused to load the checkpoint"):
        ck.load_state(p)
    assert not (tmp_path / "PWNED").exists()


def test_save_then_load_checkpoint_with_optimizer_state(tmp_path):
    class FakeLearner:  # what checkpoint.learner_state reads of a Learner
        reference = critic = critic_opt = None

        def __init__(self, updates=0):
            self.policy = torch.nn.Linear(3, 2)
            self.opt = torch.optim.AdamW(self.policy.parameters(), lr=1e-3)
            self.policy(torch.ones(1, 3)).sum().backward()
            self.opt.step()
            self.updates = updates

    class OneProcess:
        is_distributed, is_main = False, True

    a, b = FakeLearner(updates=1), FakeLearner()
    p = ck.checkpoint_path(tmp_path)
    counters = {"step": 2, "samples": 8, "tokens": 40, "seconds": 1.5}
    ck.save_checkpoint(p, OneProcess(), a, None, {"counters": counters, "passed": 1, "initial_eval": {"x": 0.5}})
    state = ck.load_checkpoint(p, OneProcess(), b, None, resume=True)
    assert state["counters"] == counters and state["initial_eval"] == {"x": 0.5}
    assert torch.equal(a.policy.weight, b.policy.weight)
    assert b.opt.state_dict()["state"][0]["step"] == a.opt.state_dict()["state"][0]["step"]
    assert b.updates == 1


def test_a_finished_run_keeps_no_empty_checkpoint_folder(tmp_path):
    from types import SimpleNamespace
    from harness.train.checkpoint import checkpoint_path, remove_checkpoint
    main = SimpleNamespace(is_main=True)
    ckpt = checkpoint_path(tmp_path)
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"state")
    (ckpt.parent / "dist_0").mkdir()
    remove_checkpoint(ckpt, main)
    assert not ckpt.parent.exists()  # state, rank folders and the emptied folder are gone
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"state")
    (ckpt.parent / "notes.txt").write_text("a user's file")
    remove_checkpoint(ckpt, main)
    assert not ckpt.exists() and (ckpt.parent / "notes.txt").exists()  # someone else's file keeps the folder
