"""Measurements that check the network models on this machine: links, loopback, crossovers.

* :func:`link_times` / :func:`fit_link`: one-way message times between two ranks,
  over ddtk's transport (emulated or not) or over gloo's own point-to-point, and
  the latency and bandwidth that fit them (t = latency + bytes / bandwidth).
* :func:`loopback_check`: the topology model reduced to this machine (each rank a
  "node" behind a loopback link, :func:`ddtk.net.topology.loopback`) against
  gloo's measured all-reduce.
* :func:`crossover_from_times` and :func:`emulated_crossover`: where ddtk's tree
  all-reduce stops beating its ring on an emulated network, measured, next to
  where :mod:`ddtk.comm.costmodel` puts it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

_TAG = 1 << 25


def link_times(
    ctx, sizes: Sequence[int], reps: int = 7, via: str = "ddtk", exchange: bool = False
) -> dict[int, float] | None:
    """Rank 0's fastest one-way time per size, ping-ponging with rank 1 (other ranks idle).

    ``via="ddtk"`` uses this context's transport, emulated links included; ``"gloo"``
    ``torch.distributed``'s point-to-point. ``exchange=True`` times both ranks sending
    to each other at once instead, which is what one step of a ring does: on one host
    the two directions share the cores that copy the bytes, so they are not independent.
    The fastest of ``reps``: noise only adds time. Every rank must call it; ranks other
    than 0 get None.
    """
    import torch.distributed as dist

    if via not in ("ddtk", "gloo"):
        raise ValueError(f"via is 'ddtk' or 'gloo', got {via!r}")
    out: dict[int, float] = {}
    for nbytes in sizes:
        x = torch.zeros(max(1, nbytes // 4))
        ctx.barrier()
        best = math.inf
        y = torch.empty_like(x)
        for _ in range(reps if ctx.rank < 2 else 0):
            start = time.perf_counter()
            if exchange:
                _exchange(ctx, x, y, via, dist)
                best = min(best, time.perf_counter() - start)
            else:
                _ping_pong(ctx, x, via, dist)
                best = min(best, (time.perf_counter() - start) / 2)
        out[nbytes] = best
    ctx.barrier()
    return out if ctx.rank == 0 else None


def _ping_pong(ctx, x: torch.Tensor, via: str, dist: Any) -> None:
    peer = 1 - ctx.rank
    if via == "gloo":
        if ctx.rank == 0:
            dist.send(x, peer)
            dist.recv(x, peer)
        else:
            dist.recv(x, peer)
            dist.send(x, peer)
        return
    comm = ctx._comm
    if ctx.rank == 0:
        comm.isend(x, peer, _TAG).wait()
        comm.irecv(x, peer, _TAG).wait()
    else:
        comm.irecv(x, peer, _TAG).wait()
        comm.isend(x, peer, _TAG).wait()


def _exchange(ctx, x: torch.Tensor, y: torch.Tensor, via: str, dist: Any) -> None:
    peer = 1 - ctx.rank
    if via == "gloo":
        works = [dist.irecv(y, peer), dist.isend(x, peer)]
    else:
        works = [ctx._comm.irecv(y, peer, _TAG), ctx._comm.isend(x, peer, _TAG)]
    for w in works:
        w.wait()


def timed_together(
    ctx, fn: Any, reps: int = 3, margin_s: float = 0.02, max_margin_s: float = 0.64
) -> list[float]:
    """Seconds of ``fn`` on the slowest rank, ``reps`` times, every rank starting at one clock time.

    A barrier through emulated links lets ranks go up to a link latency apart (on a 5 ms
    link, 5 ms), and that skew would land in the times. Ranks of one host share
    ``CLOCK_MONOTONIC``, so after a gloo barrier (not emulated: it takes microseconds)
    rank 0 names a start time ``margin_s`` ahead, every rank sleeps until then, and a
    call's time runs from that instant to the end of the last rank. If a rank reaches
    the start late (a machine busy with other work can deschedule it for longer than
    the margin), every rank learns it from the same all-reduce, the sample is dropped
    and the margin doubled, up to ``max_margin_s``; only then does it raise.
    """
    import torch.distributed as dist

    from ddtk.net.emulate import sleep_until

    out: list[float] = []
    margin = margin_s
    while len(out) < reps:
        dist.barrier()
        start = torch.tensor([time.monotonic_ns() + int(margin * 1e9)], dtype=torch.int64)
        dist.broadcast(start, src=0)
        begin = int(start[0])
        late = time.monotonic_ns() > begin
        sleep_until(begin)
        fn()
        elapsed = torch.tensor(
            [(time.monotonic_ns() - begin) / 1e9, float(late)], dtype=torch.float64
        )
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if elapsed[1] > 0:  # every rank sees the same flag, so all retry or all raise
            if max(2 * margin, 0.01) > max_margin_s:
                raise RuntimeError(
                    f"a rank reached the agreed start late: raise margin_s (now {margin} s)"
                )
            margin = max(2 * margin, 0.01)
            continue
        out.append(float(elapsed[0]))
    return out


def fit_link(times: dict[int, float]) -> tuple[float, float]:
    """``(latency s, bandwidth B/s)`` of ``t = latency + bytes / bandwidth``, least squares on relative error."""
    if len(times) < 2:
        raise ValueError("fit_link needs times for at least two sizes")
    m = np.array(list(times), dtype=float)
    t = np.array(list(times.values()), dtype=float)
    w = 1 / np.maximum(t, 1e-12)
    design = np.stack([np.ones_like(m), m], 1) * w[:, None]
    (a, inv_b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    return max(float(a), 0.0), (1 / inv_b if inv_b > 0 else math.inf)


def reduce_rate(nbytes: int = 8 << 20, reps: int = 5) -> float:
    """Bytes per second one thread sums (``a += b`` on float32): the gamma of the cost model."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.ones(nbytes // 4), torch.ones(nbytes // 4)
        a.add_(b)  # pages touched
        best = math.inf
        for _ in range(reps):
            start = time.perf_counter()
            a.add_(b)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return nbytes / best


def _gloo_link(ctx, sizes: Sequence[int], reps: int) -> dict[int, float] | None:
    return link_times(ctx, sizes, reps, via="gloo", exchange=True)


def loopback_check(
    world_sizes: Sequence[int] = (2, 4),
    sizes: Sequence[int] = (4 << 10, 256 << 10, 4 << 20, 32 << 20),
    link_sizes: Sequence[int] = (4, 64 << 10, 1 << 20, 8 << 20),
    iters: int = 5,
    iperf_seconds: float = 1.0,
) -> dict[str, Any]:
    """The topology model on this machine's loopback, against two all-reduces measured here.

    The link comes from measurements: latency and bandwidth of gloo's own
    point-to-point (two ranks exchanging messages, as a ring step does, fitted), and
    the rate at which one thread sums two buffers (the reduction between receives).
    ``iperf3`` (when installed) gives the raw TCP ceiling of loopback for comparison.
    The contenders, timed interleaved: ``"ddtk ring"``, ddtk's ring over gloo's
    point-to-point, which is literally the ring of exchanges the model describes, and
    ``"gloo all_reduce"``, gloo's own implementation. One row per (world size, size,
    contender): measured, predicted and the error.
    """
    import shutil

    import ddtk
    from ddtk.bench.collectives import sweep
    from ddtk.net.predict import predict
    from ddtk.net.shaping import loopback_iperf3
    from ddtk.net.topology import loopback

    link = ddtk.launch(_gloo_link, 2, args=(list(link_sizes), 9), backend="gloo", transport="tcp")[
        0
    ]
    alpha, beta = fit_link(link)
    gamma = reduce_rate()
    iperf = loopback_iperf3(iperf_seconds) if shutil.which("iperf3") else None
    names = {"ring": "ddtk ring", "torch": "gloo all_reduce"}
    rows = []
    for n in world_sizes:
        model = loopback(n, beta, alpha, gamma)
        measured = sweep(n, list(sizes), algorithms=("ring",), iters=iters, warmup=1,
                         backend="gloo", transports=("tcp",))  # fmt: skip
        for r in measured:
            predicted = predict(model, "all_reduce", r["nbytes"], "ring").time
            rows.append({"world_size": n, "nbytes": r["nbytes"], "contender": names[r["algorithm"]],
                         "measured_s": r["time_median_s"], "predicted_s": predicted,
                         "error": predicted / r["time_median_s"] - 1})  # fmt: skip
    return {
        "gloo_latency_s": alpha,
        "gloo_bandwidth_Bps": beta,
        "reduce_rate_Bps": gamma,
        "link_times": link,
        "iperf3": iperf,
        "rows": rows,
    }


def crossover_from_times(
    sizes: Sequence[int], first: Sequence[float], second: Sequence[float]
) -> float | None:
    """The size where ``second`` stops being slower than ``first`` (log-log interpolation), or None.

    With ``first`` the tree and ``second`` the ring: the tree wins below the returned
    size, the ring above. None if the sign of the difference never changes.
    """
    diff = [math.log(b) - math.log(a) for a, b in zip(first, second)]
    for i in range(len(diff) - 1):
        if diff[i] > 0 >= diff[i + 1]:
            lo, hi = math.log(sizes[i]), math.log(sizes[i + 1])
            frac = diff[i] / (diff[i] - diff[i + 1])
            return math.exp(lo + frac * (hi - lo))
    return None


def _algorithm_times(ctx, sizes: Sequence[int], algorithms: Sequence[str], iters: int) -> dict:
    """Median all-reduce time per algorithm and size, every call started together (rank 0's dict)."""
    out: dict[str, list[float]] = {a: [] for a in algorithms}
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4))
        for a in algorithms:
            ctx.all_reduce(x, algorithm=a)  # warm-up: buffers, connections
            samples = timed_together(ctx, lambda a=a, x=x: ctx.all_reduce(x, algorithm=a), iters)
            out[a].append(sorted(samples)[len(samples) // 2])
    return out


def emulated_crossover(
    network: Any,
    world_size: int = 4,
    sizes: Sequence[int] = tuple(8 << (10 + i) for i in range(8)),
    iters: int = 3,
    first: str = "tree",
    second: str = "ring",
) -> dict[str, Any]:
    """Time ddtk's ``first`` and ``second`` all-reduce on ``network``; where do they cross?

    The prediction uses :mod:`ddtk.comm.costmodel` with alpha = the links' latency and
    beta = 1 / their bandwidth: the model that lecture 01 fitted on this machine.
    Every call starts at one agreed clock time (:func:`timed_together`).
    """
    import ddtk
    from ddtk.comm.costmodel import cost_terms, predict_time

    times = ddtk.launch(_algorithm_times, world_size, args=(list(sizes), (first, second), iters),
                        network=network, validate=False)[0]  # fmt: skip
    got = list(sizes)
    alpha, beta = network.latency, 1 / network.bandwidth
    model = {a: [predict_time(a, s, world_size, alpha, beta) for s in got] for a in (first, second)}
    (s1, f1), (s2, f2) = cost_terms(first, world_size), cost_terms(second, world_size)
    # equal times: s1 a + f1 M b = s2 a + f2 M b
    predicted = (s1 - s2) * alpha / ((f2 - f1) * beta) if (f2 - f1) * (s1 - s2) > 0 else None
    return {
        "sizes": got,
        "measured_s": times,
        "predicted_s": model,
        "measured_crossover": crossover_from_times(got, times[first], times[second]),
        "predicted_crossover": predicted,
        "network": str(network),
        "world_size": world_size,
    }


def pattern_times(ctx, nbytes: int, reps: int = 3) -> dict[str, float] | None:
    """Seconds (slowest rank, fastest of ``reps``) of each communication pattern of training.

    ``nbytes`` follows nccl-tests: the all-reduce buffer, the all-gather *output*, the
    reduce-scatter *input*, what each rank sends in total in the all-to-all, and one
    pipeline activation for ``send_recv`` (each rank sends to the next, as a pipeline
    stage does, and receives from the previous). Rank 0 returns the dict, others None.
    """

    n = ctx.world_size
    whole = torch.ones(max(n, nbytes // 4))
    part = torch.ones(max(1, nbytes // 4 // n))
    right, left = (ctx.rank + 1) % n, (ctx.rank - 1) % n
    act = torch.ones(max(1, nbytes // 4))
    got = torch.empty_like(act)

    def send_recv() -> None:
        works = [ctx._comm.irecv(got, left, _TAG), ctx._comm.isend(act, right, _TAG)]
        for w in works:
            w.wait()

    ops = {
        "all_reduce": lambda: ctx.all_reduce(whole),
        "all_gather": lambda: ctx.all_gather(part),
        "reduce_scatter": lambda: ctx.reduce_scatter(whole),
        "all_to_all": lambda: ctx.all_to_all(whole),
        "send_recv": send_recv,
    }
    out = {}
    for name, op in ops.items():
        op()  # warm-up
        out[name] = min(timed_together(ctx, op, reps))
    return out if ctx.rank == 0 else None
