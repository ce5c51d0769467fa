"""Timing helpers shared by the benchmarks: synchronised timing across ranks and summaries."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist


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


def parse_size(text: str) -> int:
    """``"4K"``, ``"64M"``, ``"1G"`` or a plain integer, in bytes (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        raise ValueError(
            f"cannot read size {text!r}; use bytes or a suffix K, M, G (e.g. 4K, 64M)"
        ) from None


def format_bytes(n: float) -> str:
    """1024 -> '1 KiB', 67108864 -> '64 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if float(n).is_integer() else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} GiB"
