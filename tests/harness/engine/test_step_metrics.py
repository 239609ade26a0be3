"""The learner's metrics accumulator (harness/engine/step_metrics.py) and its rows plan
(harness/engine/batching.plan_update), against values computed by hand."""
from types import SimpleNamespace

import pytest
import torch

from harness.engine.batching import Rows, plan_update
from harness.engine.learner import Batch
from harness.engine.step_metrics import METRICS, StepMetrics


def _ranks(*metrics: StepMetrics):
    """A stand-in for a distributed ``dist`` whose ranks hold ``metrics`` (rank order)."""
    return SimpleNamespace(is_distributed=True, gather_objects=lambda mine: [m.share() for m in metrics])


def test_one_process_row_by_kind_and_in_the_tables_order():
    m = StepMetrics()
    m.set("train/lr", 1e-3)
    m.over(4, "train/loss", "train/pg_loss")  # 2 epochs x 2 mini-batches
    for x in (1.0, 2.0, 3.0, 6.0):
        m.add("train/loss", x)
    m.add("train/kl", 3.0, 4)
    m.add("train/kl", 1.0, 4)
    m.mean("train/adv_mean", torch.tensor([0.5, -1.0, 2.0]))
    m.max("train/ratio_max", 1.25)
    m.max("train/ratio_max", 1.125)
    m.over(0, "train/clip_frac")  # no kept token: its count is taken as 1
    m.mean("train/adv_group_sum_mean", torch.zeros(0))  # no element: not in the row
    row = m.values()
    assert row == {"train/adv_mean": pytest.approx(0.5), "train/loss": 3.0, "train/pg_loss": 0.0,
                   "train/kl": 0.5, "train/clip_frac": 0.0, "train/ratio_max": 1.25, "train/lr": 1e-3}
    assert list(row) == [k for k in METRICS if k in row]
    assert row["train/adv_mean"] == torch.tensor([0.5, -1.0, 2.0]).mean().item()  # the tensor's own mean, bit for bit


def test_ranks_pool_means_average_losses_and_take_rank_zeros_shared_values():
    a, b = StepMetrics(), StepMetrics()
    a.mean("train/adv_mean", torch.tensor([1.0, 2.0, 3.0]))
    b.mean("train/adv_mean", torch.tensor([10.0]))
    a.over(2, "train/loss")
    a.add("train/loss", 1.0)
    b.over(2, "train/loss")
    b.add("train/loss", 3.0)
    a.over(5, "train/clip_frac")
    a.add("train/clip_frac", 1.0)
    b.over(0, "train/clip_frac")  # this rank kept nothing
    a.max("train/ratio_max", 1.5)
    b.max("train/ratio_max", 2.5)
    a.set("train/grad_norm", 0.75)
    b.set("train/grad_norm", 0.75)
    a.mean("train/value_mean", torch.zeros(0))  # a rank with no kept token adds nothing
    b.mean("train/value_mean", torch.tensor([4.0, 6.0]))
    row = a.values(_ranks(a, b))
    assert row["train/adv_mean"] == pytest.approx(16 / 4)     # every rank's tokens, as one process sees them
    assert row["train/loss"] == pytest.approx((0.5 + 1.5) / 2)  # the ranks' losses averaged
    assert row["train/clip_frac"] == pytest.approx(1 / 5)
    assert row["train/ratio_max"] == 2.5 and row["train/grad_norm"] == 0.75
    assert row["train/value_mean"] == pytest.approx(5.0)
    assert b.values(_ranks(a, b)) == row  # every rank gets the same row


def _rows(mask_rows: list) -> Rows:
    mask = torch.tensor(mask_rows, dtype=torch.float32)
    B, T = mask.shape
    ids = torch.zeros(B, T + 1, dtype=torch.long)
    b = Batch(ids, torch.ones_like(ids), ids, torch.zeros(B, T, dtype=torch.long), mask)
    return Rows(b, torch.arange(B, dtype=torch.float32)[:, None].expand(B, T).clone(), None, None, None, None)


def test_plan_cuts_the_kept_rows_into_mini_batches_normalised_by_every_sampled_row():
    rows = _rows([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]])  # 2, 1, 3, 2, 1 tokens
    keep = torch.tensor([True, False, True, True, True])
    plan = plan_update(keep, None, rows, mini_batches=2, micro_batch_size=2, const_len=3, device="cpu")
    assert plan.n_kept == 4 and plan.kept_tokens == 8 and plan.n_slices == 2
    assert plan.adv[:, 0].tolist() == [0.0, 2.0, 3.0, 4.0]  # the kept rows, in order
    # slices of the batch: rows 0-1 and rows 2-4; each normalised by all its sampled rows, kept or not
    (m0, m1) = plan.minis
    assert (m0.ctx.num_seqs, m0.ctx.num_tokens, m1.ctx.num_seqs, m1.ctx.num_tokens) == (2, 3, 3, 6)
    assert m0.slices == [slice(0, 1)] and m1.slices == [slice(1, 3), slice(3, 4)]
    assert plan_update(torch.zeros(5, dtype=torch.bool), None, rows, mini_batches=2, micro_batch_size=2,
                       const_len=3, device="cpu") is None  # nothing kept: no update
