"""harness.engine.paged's per-call teardown cost: transformers' continuous-batching manager runs
``gc.collect()`` when it stops (and when its batch processor is deleted), which walks every object
of the process; the sampler freezes the objects that existed before the call, so those collections
run with them frozen, and unfreezes them after. Objects the caller froze itself stay frozen."""
import gc

import pytest

from harness.config.schema import ModelConfig
from harness.engine import paged
from harness.engine.models import build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    return build_tiny_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok,
                            seed=0), tok


def _collections_seen(monkeypatch):
    """Record gc.get_freeze_count() at every gc.collect() call (transformers calls it as ``gc.collect``)."""
    seen = []
    real = gc.collect

    def collect(*args):
        seen.append(gc.get_freeze_count())
        return real(*args)
    monkeypatch.setattr(gc, "collect", collect)
    return seen


def test_manager_teardown_collects_with_the_callers_objects_frozen(tiny, monkeypatch):
    model, tok = tiny
    ids = [tok("Q:3+4\nA:")["input_ids"]]
    existing = len(gc.get_objects())
    seen = _collections_seen(monkeypatch)
    toks, lps = paged.generate(model, tok, ids, 2, 6, 1.0, 1.0, False, 0, True)
    assert len(toks) == 2 and all(1 <= len(t) <= 6 for t in toks) and len(lps) == 2
    assert len(seen) >= 2  # the manager's stop() and its batch processor's __del__
    assert all(c >= existing * 0.9 for c in seen), (seen, existing)  # everything from before the call is frozen
    assert gc.get_freeze_count() == 0  # and unfrozen after


def test_objects_the_caller_froze_stay_frozen(tiny, monkeypatch):
    model, tok = tiny
    ids = [tok("Q:7\nA:")["input_ids"]]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        paged.generate(model, tok, ids, 1, 4, 1.0, 1.0, False, 0, True)
        # still frozen (a few frozen objects the call released by reference counting leave the count)
        assert gc.get_freeze_count() >= 0.99 * frozen > 0
    finally:
        gc.unfreeze()
