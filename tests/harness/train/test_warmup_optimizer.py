"""A pickled ``optimizer.pt`` planted in a cached warm-up (issue 48, the case left from round 3): an entry built
now records its optimizer state's digest, so an edited one makes the entry rebuilt (as edited weights do); an
entry from before the digest, whose optimizer state torch refuses or that belongs to another model, ends in one
line naming the file and what to do (exit 2: `RunFileError`), never an UnpicklingError traceback."""
from __future__ import annotations

import json

import pytest

from harness.foundation.files import file_sha256
import torch

from algorithms.presets import resolve
from harness.config.schema import load_config
from harness.engine.learner import Learner
from harness.engine.perf import PerfTracker
from harness.rundir.layout import RunFileError
from harness.train import warmup as wu
from small_model import save_small_model  # tests/support


class Planted:
    """Pickled into optimizer.pt: torch.load(weights_only=True) refuses it."""

    def __reduce__(self):
        return (print, ("the planted pickle ran",))


@pytest.fixture
def entry(tmp_path):
    """A whole warm-up cache entry as `harness.train.warmup` writes it (weights, optimizer state, warmup.json)."""
    e = tmp_path / "entry"
    model = save_small_model(e)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    torch.save(opt.state_dict(), e / wu.OPTIMIZER_FILE)
    meta = {"key": e.name, "digest": wu.checkpoint_digest(e), "optimizer_digest": file_sha256(e / wu.OPTIMIZER_FILE)}
    (e / wu.META_FILE).write_text(json.dumps(meta))
    assert wu.entry_problem(e) is None
    return e, model


def test_a_planted_optimizer_state_makes_the_entry_unusable(entry):
    e, _ = entry
    torch.save({"state": Planted()}, e / wu.OPTIMIZER_FILE)
    assert wu.entry_problem(e) == "its optimizer state (optimizer.pt) changed since it was built (digest mismatch)"
    (e / wu.OPTIMIZER_FILE).unlink()
    assert wu.entry_problem(e) == "optimizer.pt is missing or not a regular file"


@pytest.mark.parametrize("planted", ["pickle", "garbage", "empty", "other-shape"])
def test_an_old_entrys_unusable_optimizer_state_is_one_line(planted, entry):
    e, model = entry
    meta = json.loads((e / wu.META_FILE).read_text())
    del meta["optimizer_digest"]  # an entry built before the digest
    (e / wu.META_FILE).write_text(json.dumps(meta))
    f = e / wu.OPTIMIZER_FILE
    if planted == "pickle":
        torch.save({"state": Planted()}, f)
    elif planted == "garbage":
        f.write_bytes(b"\x80\x04garbage" * 10)
    elif planted == "empty":
        f.write_bytes(b"")
    else:
        torch.save({"state": {0: {"step": torch.tensor(1.0), "exp_avg_sq": torch.zeros(3)}}}, f)
    assert wu.entry_problem(e) is None
    cfg = load_config(None, ["algorithm=rft"])
    learner = Learner(model, resolve(cfg.algorithm), cfg, "cpu", PerfTracker())
    with pytest.raises(RunFileError) as got:
        learner.init_optimizer_from(str(f))
    msg = str(got.value)
    assert "\n" not in msg and msg.startswith(str(f)) and "optimizer state cannot be used" in msg
    assert f"delete the warm-up cache entry {e}" in msg and "reuse_warmup_optimizer: false" in msg
