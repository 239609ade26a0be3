"""How a learner update runs its rows: which kept rows go into which optimizer step (mini-batches of micro-batches that agree across ranks), and stepping a model in one process or several.

A batch's B rows are cut, in order, into ``min(train.mini_batches, B)`` slices of sizes differing
by at most one; each slice is one optimizer step, its losses normalised by its sampled (valid)
rows and their tokens, kept or not (:class:`algorithms.losses.AggContext`); its kept rows run in
micro-batches of ``train.micro_batch_size``. A slice where no rank kept a row takes no optimizer
step. Several processes: every rank runs as many micro-batches per slice as the rank with the
most (``None`` slices: zero-weight padding, see :func:`micro`, so the collective forward passes
of ZeRO-3 agree), and a rank that kept nothing learns from a zero-mask stand-in row.

:class:`Stepper` runs a micro-batch's backward and an optimizer step through ``dist`` (a
:class:`harness.engine.distributed.Distributed`) or, in one process, as plain torch.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields, replace
from typing import Optional

import torch

from algorithms.losses import AggContext


@dataclass
class Rows:
    """A batch (``harness.engine.learner.Batch``) with what the update reads per row: advantages
    [B, T], and the reference / old log-probs, critic values and returns [B, T] where the
    algorithm has them (else None); the behaviour policy's log-probs (the sampler's) [B, T] where
    the update corrects for them (off-policy rollouts, ``algorithms.corrections``; else None)."""
    b: object
    adv: torch.Tensor
    ref_logp: Optional[torch.Tensor]
    old_logp: Optional[torch.Tensor]
    values: Optional[torch.Tensor]
    returns: Optional[torch.Tensor]
    behav_logp: Optional[torch.Tensor] = None

    def rows(self, idx) -> "Rows":
        pick = lambda x: x[idx] if x is not None else None  # noqa: E731
        return Rows(self.b.rows(idx), self.adv[idx], pick(self.ref_logp), pick(self.old_logp), pick(self.values),
                    pick(self.returns), pick(self.behav_logp))


@dataclass
class MiniBatch:
    """One optimizer step's share of the batch: the counts its losses normalise by (the sampled
    rows of its slice, kept or not) and its micro-batch slices of the kept rows (``None``: a
    zero-weight padding one)."""
    ctx: AggContext
    slices: list


@dataclass
class Plan(Rows):
    """This rank's kept rows (a zero-mask stand-in row where it kept none), the number of kept
    rows and tokens, the mini-batches that run (one optimizer step each) and the number of
    slices the batch was cut into (``n_slices``, skipped ones included)."""
    n_kept: int = 0
    kept_tokens: int = 0
    minis: list = field(default_factory=list)
    n_slices: int = 1


def chunks(n: int, size: int):
    """``slice``s of ``range(n)``, ``size`` at a time (the last one shorter)."""
    for s in range(0, n, size):
        yield slice(s, min(s + size, n))


def micro(b, sl):
    """Micro-batch ``sl`` of batch ``b`` and its slice; ``None``: a zero-weight padding micro-batch
    (row 0 with an all-zero mask: a finite forward whose loss and gradient are 0)."""
    if sl is not None:
        return b.rows(sl), sl
    sl = slice(0, 1)
    mb = b.rows(sl)
    return replace(mb, mask=torch.zeros_like(mb.mask)), sl


def plan_update(keep: torch.Tensor, valid: Optional[torch.Tensor], rows: Rows, *, mini_batches: int,
                micro_batch_size: int, const_len: int, device, dist=None) -> Optional[Plan]:
    """This rank's kept rows of ``rows`` (``keep``: bool [B]; ``valid``: the shard's real rows, None
    for all) and their mini-batches, as the module doc says; None when no rank kept anything.
    ``dist``: a distributed :class:`harness.engine.distributed.Distributed` (None: one process)."""
    mbs, B = micro_batch_size, keep.shape[0]
    n_slices = max(1, min(mini_batches, B))
    bounds = [j * B // n_slices for j in range(n_slices + 1)]
    keep = keep.cpu()
    counted = (valid.cpu() if valid is not None else torch.ones(B, dtype=torch.bool)).float()
    tokens_per_row = rows.b.mask.sum(1).cpu() * counted
    idx = keep.nonzero().squeeze(-1).to(device)
    n_kept = int(idx.numel())
    counts = [int(keep[lo:hi].sum()) for lo, hi in zip(bounds, bounds[1:])]
    all_counts = dist.gather_objects(counts) if dist is not None else [counts]
    if sum(map(sum, all_counts)) == 0:
        return None
    if n_kept == 0:  # this rank kept nothing, others did: zero-weight stand-in row
        idx = torch.zeros(1, dtype=torch.long, device=device)
    kept = rows.rows(idx)
    if n_kept == 0:
        kept = replace(kept, b=replace(kept.b, mask=torch.zeros_like(kept.b.mask)))
    minis, first = [], 0
    for j, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        n_mb = max(-(-c[j] // mbs) for c in all_counts)  # the same on every rank
        if n_mb:
            ctx = AggContext(num_seqs=int(counted[lo:hi].sum().item()),
                             num_tokens=int(tokens_per_row[lo:hi].sum().item()), const_len=const_len)
            slices: list = [slice(first + s.start, first + s.stop) for s in chunks(counts[j], mbs)]
            slices += [None] * (n_mb - len(slices))  # padding micro-batches (several processes)
            minis.append(MiniBatch(ctx, slices))
        first += counts[j]
    return Plan(**{f.name: getattr(kept, f.name) for f in fields(Rows)}, n_kept=n_kept,
                kept_tokens=int(kept.b.mask.sum().item()), minis=minis, n_slices=n_slices)


@torch.no_grad()
def forward_nograd(model, b, fn, micro_batch_size: int) -> torch.Tensor:
    """``fn(model, micro-batch)`` over batch ``b`` in micro-batches, concatenated, no gradient.
    Every rank holds the same number of rows (the trainer pads shards), so the number of forward
    passes agrees across ranks (ZeRO-3)."""
    return torch.cat([fn(model, b.rows(s)) for s in chunks(b.input_ids.shape[0], micro_batch_size)], 0)


class Stepper:
    """Gradient accumulation, backward and optimizer steps of a trained model, through ``dist``
    where there is one, else plain torch (clipping at ``max_grad_norm``)."""

    def __init__(self, dist, max_grad_norm: float):
        self.dist, self.max_grad_norm = dist, max_grad_norm
        self.distributed = dist is not None and dist.is_distributed

    def zero_grad(self, opt) -> None:
        """Before an optimizer step's micro-batches (several processes: ``dist.step`` zeroes)."""
        if not self.distributed:
            opt.zero_grad(set_to_none=True)

    def accumulate(self, model, last: bool):
        """Around one micro-batch's forward and backward; ``last``: the step's last micro-batch."""
        return self.dist.accumulate(model, last=last) if self.dist is not None else contextlib.nullcontext()

    def backward(self, model, loss) -> None:
        if self.dist is not None:
            self.dist.backward(model, loss)
        else:
            loss.backward()

    def step(self, model, opt) -> Optional[float]:
        """Clip + step; the gradient norm before clipping (None when clipping is off)."""
        if self.distributed:
            return self.dist.step(model, opt)  # clips, steps and zeroes the gradients
        gn = None
        if self.max_grad_norm > 0:
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm))
        opt.step()
        # free the gradients now: they are not needed until the next backward, and holding
        # them through sampling, scoring and the reference forward is a model's worth of memory
        opt.zero_grad(set_to_none=True)
        return gn
