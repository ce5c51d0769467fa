"""Timing helpers shared by the benchmarks: synchronised timing across ranks and summaries."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from ddtk.sizes import format_bytes, parse_size

__all__ = ["format_bytes", "parse_size", "summarize", "timed_across_ranks"]


def timed_across_ranks(
    fn: Callable[[], object], repeat: int = 1, barrier: Callable[[], object] | None = None
) -> float:
    """Run ``fn`` ``repeat`` times after a barrier; return the slowest rank's seconds per call.

    A collective is as slow as its slowest rank. The ranks leave the barrier up to a
    few hundred microseconds apart (gloo's barrier wakes each rank through a socket),
    and that skew lands in the first call's time; timing ``repeat`` back-to-back
    calls (as nccl-tests does) spreads it out, which matters for messages that take
    microseconds. ``barrier`` replaces ``torch.distributed.barrier`` by one whose
    ranks leave closer together, such as a shared-memory one.
    """
    (barrier or dist.barrier)()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    elapsed = torch.tensor([(time.perf_counter() - start) / repeat], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Median, 10th and 90th percentile of a list of seconds."""
    ordered = sorted(samples)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]

    return {
        "time_median_s": statistics.median(ordered),
        "time_p10_s": pct(0.1),
        "time_p90_s": pct(0.9),
    }
