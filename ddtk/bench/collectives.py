"""``ddtk bench collectives``: all-reduce bandwidth in the style of nccl-tests.

For every message size (powers of two) and algorithm it reports the time
(median, p10, p90 of the slowest rank; calls shorter than 2 ms are timed in
batches of back-to-back calls, as nccl-tests does, so that the skew with which
the ranks leave the barrier does not swamp them), the algorithm bandwidth (bytes / time)
and the bus bandwidth (algbw x 2(n-1)/n, comparable across world sizes). The
peer, ``torch.distributed.all_reduce`` on the same process group (gloo on CPU,
NCCL on GPU), runs interleaved with the ddtk algorithms in the same processes,
so both see the same machine load; each row shows ddtk busbw / peer busbw.
Results are checked against the peer outside the timed region.

Run it::

    ddtk bench collectives                                  # 2 and 4 ranks, 1 KiB .. 64 MiB
    ddtk bench collectives -n 2 --max-bytes 4M --algorithms ring,tree --json out.json --plot out.png

Each rank runs one thread (``torch.set_num_threads(1)``); world size, core
count and backend are recorded with every result.

ddtk's rows write into a preallocated buffer (``all_reduce(x, out=buf)``), as the
peer reduces in place: a fresh result of 64 MiB costs as much in page faults as
the transfer itself, and that is the allocator's cost, not the algorithm's.

``--transports shm,tcp`` (the default) times every ddtk algorithm over both of
ddtk's transports in the same processes: shared memory and gloo's sockets. Rows
carry a ``transport`` field and are labelled ``ring/shm``, ``ring/tcp``.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Sequence
from typing import Any

import torch

from ddtk.bench.timing import summarize, timed_across_ranks
from ddtk.comm.costmodel import bus_factor

PEER = "torch"
VALIDATED = "ring+validate"


def _iters_for(nbytes: int, iters: int) -> int:
    """More repetitions for small, noisy messages; fewer for big ones."""
    return iters * 5 if nbytes <= (64 << 10) else iters


SAMPLE_S = 2e-3
"""A sample times back-to-back calls for at least this long (at most :data:`MAX_CALLS` calls)."""

MAX_CALLS = 1000
"""Enough for 2 ms of the fastest row (memcpy of a few bytes, about 2 µs a call)."""


def _calls_per_sample(seconds_per_call: float) -> int:
    """How many back-to-back calls make one sample, from a warm-up call's time.

    The ranks leave the barrier before a sample up to a few hundred microseconds
    apart; a sample of 2 ms or more keeps that skew out of the median. Every rank
    gets the same number, because the warm-up time is already the slowest rank's.
    """
    return max(1, min(MAX_CALLS, math.ceil(SAMPLE_S / max(seconds_per_call, 1e-9))))


def label(row: dict) -> str:
    """How a row is named in tables and plots: ``ring/shm``, ``torch``, ``memcpy``."""
    transport = row.get("transport")
    return f"{row['algorithm']}/{transport}" if transport else row["algorithm"]


def _rank_sweep(
    ctx,
    sizes: Sequence[int],
    algorithms: Sequence[str],
    iters: int,
    warmup: int,
    peer: bool,
    memcpy: bool,
    validated: bool,
    transports: Sequence[str] = (),
) -> list[dict]:
    """Body run on every rank: correctness check, then interleaved timing, per size."""
    import torch.distributed as dist

    from ddtk.comm.context import DistributedContext

    contexts = {ctx.transport: ctx}
    for t in transports:  # one more context per further transport, in the same processes
        if t not in contexts:
            other = DistributedContext(ctx.rank, ctx.world_size, ctx.backend, ctx.device,
                                       validate=False, transport=t, network=ctx.network)  # fmt: skip
            contexts.setdefault(other.transport, other)
    # Every sample starts at a barrier; shared memory's lets the ranks go within
    # microseconds of each other, gloo's only within hundreds (the same for every row).
    barrier = contexts["shm"].barrier if "shm" in contexts else None
    rows: list[dict] = []
    for nbytes in sizes:
        numel = max(1, nbytes // 4)
        x = torch.randn(numel, generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device)
        want = x.clone()
        dist.all_reduce(want)
        errors = {
            (a, t): float((c.all_reduce(x, algorithm=a) - want).abs().max())
            for a in algorithms
            for t, c in contexts.items()
        }
        contenders = _contenders(contexts, ctx, x, algorithms, peer, memcpy, validated)
        samples: dict[tuple[str, str | None], list[float]] = {name: [] for name in contenders}
        calls = dict.fromkeys(contenders, 1)
        for i in range(warmup + _iters_for(nbytes, iters)):
            for name, fn in contenders.items():  # interleaved: all see the same conditions
                t = timed_across_ranks(fn, calls[name], barrier)
                if i < warmup:
                    calls[name] = _calls_per_sample(t)
                else:
                    samples[name].append(t)
        for (name, transport), ts in samples.items():
            row = _row(name, ctx.world_size, numel * 4, ts, errors.get((name, transport)))
            rows.append({**row, "transport": transport})
    return rows


def _contenders(
    contexts: dict,
    ctx,
    x: torch.Tensor,
    algorithms: Sequence[str],
    peer: bool,
    memcpy: bool,
    validated: bool,
) -> dict[tuple[str, str | None], Any]:
    """The operations timed for one message, by (row name, transport)."""
    import torch.distributed as dist

    out = torch.empty_like(x)  # the peer reduces in place: no contender allocates its result
    contenders: dict[tuple[str, str | None], Any] = {
        (a, t): (lambda a=a, c=c: c.all_reduce(x, algorithm=a, out=out))
        for a in algorithms
        for t, c in contexts.items()
    }
    if peer:
        peer_buf = x.clone()
        contenders[PEER, None] = lambda: dist.all_reduce(peer_buf)
    if validated:
        contenders[VALIDATED, ctx.transport] = lambda: _validated(ctx, x, out)
    if memcpy:
        dst = torch.empty_like(x)
        contenders["memcpy", None] = lambda: dst.copy_(x)
    return contenders


def _validated(ctx, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    ctx.validate = True
    try:
        return ctx.all_reduce(x, algorithm="ring", out=out)
    finally:
        ctx.validate = False


def _row(name: str, n: int, nbytes: int, samples: list[float], max_error: float | None) -> dict:
    stats = summarize(samples)
    algbw = nbytes / stats["time_median_s"] / 1e9
    factor = 1.0 if name == "memcpy" else bus_factor("all_reduce", n)
    return {
        "algorithm": name, "world_size": n, "nbytes": nbytes, **stats,
        "algbw_gbps": algbw, "busbw_gbps": algbw * factor, "samples": len(samples), "max_abs_error": max_error,
    }  # fmt: skip


def sweep(
    world_size: int,
    sizes: Sequence[int],
    algorithms: Sequence[str] = ("ring",),
    iters: int = 10,
    warmup: int = 2,
    peer: bool = True,
    memcpy: bool = False,
    validate: bool = False,
    validated_row: bool = False,
    backend: str = "auto",
    timeout: float = 1800.0,
    transports: Sequence[str] = ("shm", "tcp"),
    network: Any = None,
) -> list[dict]:
    """Measure all-reduce on ``world_size`` fresh local ranks; one dict per (algorithm, transport, size).

    ``validate`` turns argument validation on for the ddtk rows (off by default,
    as in a benchmark); ``validated_row`` adds a ``"ring+validate"`` row (first
    transport) that shows what validation costs. ``transports`` lists ddtk's
    transports to time (the first one that can run is the launch's own). ``network``
    (a :class:`ddtk.net.emulate.EmulatedNetwork`) puts emulated links under every ddtk
    transport; the peer's own collective does not go through them.
    """
    import ddtk

    results = ddtk.launch(
        _rank_sweep, world_size,
        args=(list(sizes), list(algorithms), iters, warmup, peer, memcpy, validated_row, list(transports)),
        backend=backend, timeout=timeout, validate=validate, transport=transports[0],
        network=network,
    )  # fmt: skip
    return results[0]


def launch_overhead(world_size: int = 4, repeats: int = 3) -> dict[str, float]:
    """Seconds for ``ddtk.launch`` to start ``world_size`` ranks, rendezvous and return (median of repeats)."""
    import ddtk

    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        ddtk.launch(_noop, world_size, validate=False)
        samples.append(time.perf_counter() - start)
    return {"world_size": world_size, **summarize(samples)}


def _noop(ctx) -> int:
    return ctx.rank


def environment() -> dict[str, Any]:
    """What every result is recorded with."""
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "cores": os.cpu_count(), "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "backend": "nccl" if gpus and dist.is_nccl_available() else "gloo", "gpus": gpus,
        "torch": torch.__version__, "python": platform.python_version(), "host": platform.node(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "threads_per_rank": 1,
    }  # fmt: skip
