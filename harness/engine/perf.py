"""Wall-clock and peak memory per phase.

CPU: peak RSS of this process. Linux lets a process reset its own high-water mark
(writing 5 to /proc/self/clear_refs resets VmHWM), so each phase gets its own peak; where
that is not allowed, the lifetime peak (ru_maxrss) is reported for every phase.
GPU: ``torch.cuda`` allocator peaks (reset per phase).

``baseline_rss_mb`` is the RSS right after imports, before any model exists: on a tiny
model the libraries alone (~350-460 MiB) hide the model's share, so peaks are also
reported above that baseline.
"""
from __future__ import annotations

import resource
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

_CLEAR_REFS = "/proc/self/clear_refs"


def _status_kb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def rss_mb() -> float:
    kb = _status_kb("VmRSS")
    return (kb or 0.0) / 1024.0


def lifetime_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _reset_hwm() -> bool:
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def hwm_mb() -> float:
    kb = _status_kb("VmHWM")
    return kb / 1024.0 if kb is not None else lifetime_peak_rss_mb()


class PerfTracker:
    """Accumulates seconds and peak memory per named phase."""

    def __init__(self, device: torch.device | None = None):
        self.device = device or torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        self.baseline_rss_mb = rss_mb()
        self.can_reset = _reset_hwm()
        self.seconds: dict[str, float] = defaultdict(float)
        self.peak_rss: dict[str, float] = defaultdict(float)
        self.peak_cuda: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str):
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.can_reset:
            _reset_hwm()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize(self.device)
                self.peak_cuda[name] = max(self.peak_cuda[name], torch.cuda.max_memory_allocated(self.device) / 2**20)
            self.seconds[name] += time.perf_counter() - t0
            self.peak_rss[name] = max(self.peak_rss[name], hwm_mb())

    def pop_seconds(self) -> dict[str, float]:
        out = dict(self.seconds)
        self.seconds.clear()
        return out

    def peak_rss_mb(self) -> float:
        return max([lifetime_peak_rss_mb() if not self.can_reset else 0.0, *self.peak_rss.values(), rss_mb()])

    def summary(self) -> dict[str, float]:
        peak = self.peak_rss_mb()
        out = {"perf/peak_rss_mb": peak, "perf/peak_rss_above_base_mb": peak - self.baseline_rss_mb,
               "perf/baseline_rss_mb": self.baseline_rss_mb}
        for k, v in self.peak_rss.items():
            out[f"perf/peak_rss_mb/{k}"] = v
            out[f"perf/peak_rss_above_base_mb/{k}"] = v - self.baseline_rss_mb
        if self.cuda:
            out["perf/peak_cuda_mb"] = max(self.peak_cuda.values(), default=0.0)
            for k, v in self.peak_cuda.items():
                out[f"perf/peak_cuda_mb/{k}"] = v
        return out
