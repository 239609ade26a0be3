"""The train/* metrics of a learner step: what each means, one accumulator of what the update observed, and the one place it becomes values (after an all-reduce over ranks).

The learner records observations while it computes the update (:class:`StepMetrics`: ``mean``,
``add`` / ``over``, ``max``, ``set``); :meth:`StepMetrics.values` makes the metrics row once, at the end. Each
metric is computed once, by its kind (``METRICS``):

- ``mean``: a mean over elements (rows, tokens, groups). Recorded as a tensor of the elements
  (:meth:`StepMetrics.mean`: one process takes its mean) or as a sum over a count
  (:meth:`StepMetrics.add`). Several processes: the ranks' sums added over their added counts,
  the mean over every rank's elements as one process would see them. Absent where the count is 0;
  ``clip_frac``'s count is taken as at least 1.
- ``loss``: a sum over the update's optimizer-step slices (all epochs), over their number.
  Several processes: the mean of the ranks' values (the update follows the rank-averaged loss).
- ``max``: the largest value recorded (from 0), over ranks too.
- ``quantile``: a quantile of every value collected (:meth:`StepMetrics.collect`, e.g. the ratios
  of every micro-batch and epoch): ``train/ratio_p50`` is the median of what was collected as
  ``train/ratio``. Several processes: of every rank's values together.
- ``shared``: the same on every rank (the learning rate, the gradient norm after the gradients'
  all-reduce, flags): rank 0's.

A metric that was not recorded is absent from the row; the row lists metrics in ``METRICS``'s order.
"""
from __future__ import annotations

import torch

from algorithms.advantages import group_token_sums

__all__ = ["METRICS", "StepMetrics", "group_advantage_sums"]

METRICS: dict[str, tuple[str, str]] = {
    "train/kept_fraction": ("mean", "fraction of the sampled rows the filter kept"),
    "train/overlong_penalty": ("mean", "DAPO's soft overlong penalty added to the outcome reward, per row "
                                       "(algorithm.overlong_buffer > 0)"),
    "train/kl_reward_penalty": ("mean", "KL in the reward: per row, the sum of its tokens' KL estimates"),
    "train/adv_mean": ("mean", "advantage, over the kept tokens"),
    "train/adv_abs_mean": ("mean", "absolute advantage, over the kept tokens"),
    "train/adv_group_sum_mean": ("mean", "sum of a group's kept token advantages, over the groups with a kept "
                                         "row (0 for a zero-sum estimator)"),
    "train/adv_group_sum_abs_mean": ("mean", "absolute sum of a group's kept token advantages, over those groups"),
    "train/grad_norm": ("shared", "gradient norm before clipping, of the last policy optimizer step"),
    "train/loss": ("loss", "the policy's loss (with the KL term where it is in the loss)"),
    "train/pg_loss": ("loss", "the policy-gradient part of the loss"),
    "train/kl_loss": ("loss", "the KL term of the loss, the algorithm's estimator (KL in the loss)"),
    "train/kl": ("mean", "per-token KL of the sampling policy to the reference, over the kept tokens (k3, "
                         "algorithms.objective.reference_kl)"),
    "train/clip_frac": ("mean", "fraction of the kept tokens of every epoch whose ratio was outside the clip range "
                                "(below plus above)"),
    "train/clip_frac_low": ("mean", "fraction of the kept tokens of every epoch whose ratio was below 1 - eps_low "
                                    "(a sequence's ratio counts for each of its tokens at sequence level)"),
    "train/clip_frac_high": ("mean", "fraction of the kept tokens of every epoch whose ratio was above 1 + eps_high"),
    "train/ratio_max": ("max", "largest probability ratio to the sampling policy on a kept token"),
    "train/ratio_p10": ("quantile", "10% quantile of the ratios the loss used (per token, or per sequence for a "
                                    "sequence-level ratio: GSPO), over every micro-batch and epoch"),
    "train/ratio_p50": ("quantile", "median of those ratios"),
    "train/ratio_p90": ("quantile", "90% quantile of those ratios"),
    "train/value_loss": ("loss", "the critic's value loss"),
    "train/value_mean": ("mean", "the critic's value before the update, over the kept tokens"),
    "train/lr": ("shared", "the policy's learning rate"),
    "train/policy_frozen": ("shared", "1 while the policy is frozen for the critic's warm-up"),
    "train/skipped": ("shared", "1 when no row was kept and nothing was learned"),
    # off-policy rollouts (train.staleness, sampling.dtype, algorithm.correction): behaviour (the sampler's
    # log-probs) against proximal (the learner's at the weights the update starts from), algorithms.corrections
    "offpolicy/staleness": ("shared", "updates between the weights that sampled the batch and those it trains"),
    "offpolicy/mismatch_kl": ("mean", "per-token KL(behaviour || proximal), k3 on the sampled kept tokens"),
    "offpolicy/logp_abs_diff": ("mean", "mean |log pi_prox - log pi_behav| over the kept tokens"),
    "offpolicy/ratio_max": ("max", "largest raw token ratio pi_prox / pi_behav (before any truncation)"),
    "offpolicy/ratio_p10": ("quantile", "10% quantile of the raw token ratios pi_prox / pi_behav"),
    "offpolicy/ratio_p50": ("quantile", "median of the raw token ratios"),
    "offpolicy/ratio_p90": ("quantile", "90% quantile of the raw token ratios"),
    "offpolicy/truncated_frac": ("mean", "share of the kept tokens whose weight algorithm.correction cut to its cap"),
    "offpolicy/masked_frac": ("mean", "share of the kept tokens algorithm.correction masked (weight 0)"),
}
"""Every train/* metric a learner step can log: name -> (kind, meaning), in the row's order."""

COUNT_AT_LEAST_ONE = ("train/clip_frac", "train/clip_frac_low", "train/clip_frac_high")


def _quantile_of(name: str) -> tuple[str, float]:
    """``train/ratio_p90`` -> (``train/ratio``, 0.9): what was collected, and the quantile."""
    base, _, q = name.rpartition("_p")
    return base, int(q) / 100


def _quantile(values, q: float) -> float:
    return torch.quantile(torch.as_tensor(values, dtype=torch.float64), q).item()


def group_advantage_sums(adv: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor, n: int) -> torch.Tensor:
    """The sum of the token advantages of each group (the ``n`` samples of a prompt; kept rows, as
    the update uses them), for the groups with a kept row."""
    keep = keep.to(adv.device)
    return group_token_sums(adv, mask * keep[:, None].to(mask.dtype), n)[keep.view(-1, n).any(1)]


class StepMetrics:
    """What one learner step observed, by metric name (see the module doc)."""

    def __init__(self):
        self._elements: dict[str, torch.Tensor] = {}
        self._sums: dict[str, list] = {}  # name -> [sum, count]
        self._values: dict[str, float] = {}  # max and shared metrics
        self._collected: dict[str, list] = {}  # name -> tensors whose values quantile metrics read

    def mean(self, name: str, elements: torch.Tensor) -> None:
        """``name`` is the mean of ``elements`` (a tensor: one value per row, token or group)."""
        self._elements[name] = elements

    def add(self, name: str, total: float, count: float = 0) -> None:
        """Add ``total`` to the sum of ``name`` and ``count`` to its count (both start at 0)."""
        s = self._sums.setdefault(name, [0.0, 0])
        s[0] += total
        s[1] += count

    def over(self, count: float, *names: str) -> None:
        """``names`` are sums over ``count`` (a loss over the update's optimizer steps, a fraction
        over tokens): in the row from now on, 0 until something is added to them."""
        for name in names:
            self.add(name, 0.0, count)

    def collect(self, name: str, values: torch.Tensor) -> None:
        """Add ``values`` (1-D) to those collected as ``name`` (quantile metrics ``<name>_pNN`` read them)."""
        self._collected.setdefault(name, []).append(values.detach().reshape(-1).float().cpu())

    def _collected_values(self, base: str):
        parts = self._collected.get(base, [])
        return torch.cat(parts) if parts else torch.zeros(0)

    def max(self, name: str, value: float) -> None:
        """``name`` is the largest value recorded (from 0.0)."""
        self._values[name] = max(self._values.get(name, 0.0), value)

    def set(self, name: str, value: float) -> None:
        """``name`` is ``value`` (the same on every rank)."""
        self._values[name] = value

    def share(self) -> dict:
        """This rank's share, as plain numbers: [sum, count] of means and losses, values of the rest."""
        out = {k: [v.sum().item(), v.numel()] for k, v in self._elements.items()}
        quant = {k: self._collected_values(k).tolist() for k in self._collected}
        return {**out, **{k: list(v) for k, v in self._sums.items()}, **self._values, **quant}

    def values(self, dist=None) -> dict:
        """The metrics row: ``{name: value}`` in ``METRICS``'s order. ``dist``: a
        :class:`harness.engine.distributed.Distributed`; when it is distributed, every rank calls
        and gets the same row, made from every rank's share."""
        if dist is not None and dist.is_distributed:
            return _combine(dist.gather_objects(self.share()))
        row = {}
        for name, (kind, _) in METRICS.items():
            if name in self._elements:
                if self._elements[name].numel():
                    row[name] = self._elements[name].mean().item()
            elif name in self._sums:
                total, count = self._sums[name]
                count = max(count, 1) if name in COUNT_AT_LEAST_ONE else count
                if count:
                    row[name] = total / count
            elif name in self._values:
                row[name] = self._values[name]
            elif kind == "quantile" and _quantile_of(name)[0] in self._collected:
                got = self._collected_values(_quantile_of(name)[0])
                if got.numel():
                    row[name] = _quantile(got, _quantile_of(name)[1])
        return row


def _combine(shares: list) -> dict:
    """The metrics row from every rank's share (rank order), by each metric's kind."""
    row = {}
    for name, (kind, _) in METRICS.items():
        if kind == "quantile":
            base, q = _quantile_of(name)
            got = [x for s in shares for x in s.get(base, [])]
            if got:
                row[name] = _quantile(got, q)
            continue
        have = [s[name] for s in shares if name in s]
        if not have:
            continue
        if kind == "mean":
            total, count = sum(h[0] for h in have), sum(h[1] for h in have)
            count = max(count, 1.0) if name in COUNT_AT_LEAST_ONE else count
            if count:
                row[name] = total / count
        elif kind == "loss":
            row[name] = sum(h[0] / h[1] for h in have) / len(have)
        elif kind == "max":
            row[name] = max(have)
        elif name in shares[0]:  # shared: rank 0's
            row[name] = shares[0][name]
    return row

