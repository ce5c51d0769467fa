"""Per-link timing: find the slow link the way one finds a bad cable or a NIC at a lower speed.

A collective runs at the speed of its slowest link, and its busbw alone does not
say which link that is. :func:`probe_links` measures every ordered pair of ranks
separately, all pairs of a round at once (a round-robin schedule, so no rank is
in two pairs at a time):

* **latency**: half the round trip of a 4-byte ping-pong (median of ``pings``);
* **bandwidth**: ``messages`` messages of ``nbytes`` sent one way, then a 4-byte
  acknowledgement back; ``bytes / (time - round trip)``, so the ack's trip and the
  per-message latency do not count against the link. The best of ``trials`` runs
  is kept: noise (another process on the core) only ever makes a link look slower.

:func:`find_slow_links` reads the matrix: links under ``threshold`` times the
fastest link are slow (not the median: with one slow NIC among 4 ranks, half of
the links touch it); a rank whose every link is slow has a slow NIC (or cable to the
switch), a single slow pair is a path problem. This is what ``nccl-tests`` run on
every pair of nodes, or ``ib_write_bw`` between two hosts, would tell on a cluster.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

_TAG = 7001


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs that together cover every unordered pair of ``range(n)`` once.

    The circle method: with an odd ``n`` one rank sits out each round.
    """
    ranks = list(range(n)) + ([None] if n % 2 else [])
    m = len(ranks)
    rounds = []
    for _ in range(m - 1):
        pairs = [(ranks[i], ranks[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        ranks = [ranks[0], ranks[-1], *ranks[1:-1]]
    return rounds


def _ping(ctx, peer: int, first: bool, pings: int) -> float:
    """Median round trip of a 4-byte message with ``peer`` (``first`` sends first)."""
    x = torch.zeros(1)
    times = []
    for _ in range(pings):
        start = time.perf_counter()
        if first:
            ctx.send(x, peer, _TAG)
            ctx.recv(peer, _TAG)
        else:
            ctx.recv(peer, _TAG)
            ctx.send(x, peer, _TAG)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _stream(ctx, peer: int, sending: bool, payload: torch.Tensor, messages: int) -> float:
    """Seconds for ``messages`` payloads to go to ``peer`` and a 4-byte ack to come back."""
    ack = torch.zeros(1)
    start = time.perf_counter()
    if sending:
        for _ in range(messages):
            ctx.send(payload, peer, _TAG)
        ctx.recv(peer, _TAG)
    else:
        for _ in range(messages):
            ctx.recv(peer, _TAG)
        ctx.send(ack, peer, _TAG)
    return time.perf_counter() - start


def probe_links(
    ctx, nbytes: int = 1 << 20, messages: int = 3, pings: int = 5, trials: int = 2
) -> dict | None:
    """Latency and bandwidth of every ordered pair of ranks; rank 0 gets the matrices, others None.

    Returns ``{"latency_s": [[...]], "bandwidth_Bps": [[...]], "nbytes", "messages"}``,
    entry ``[src][dst]`` for the link from ``src`` to ``dst`` (the diagonal is 0).
    Every rank must call it.
    """
    n, me = ctx.world_size, ctx.rank
    latency = torch.zeros(n, n, dtype=torch.float64)
    bandwidth = torch.zeros(n, n, dtype=torch.float64)
    payload = torch.zeros(max(1, nbytes // 4))
    for pairs in round_robin(n):
        ctx.barrier()
        for a, b in pairs:
            if me not in (a, b):
                continue
            peer = b if me == a else a
            rtt = _ping(ctx, peer, me == a, pings)
            for src, dst in ((a, b), (b, a)):
                took = min(_stream(ctx, peer, me == src, payload, messages) for _ in range(trials))
                if me == src:  # the sender's clock saw the whole transfer and the ack
                    bandwidth[src, dst] = payload.nbytes * messages / max(took - rtt, 1e-9)
                    latency[src, dst] = rtt / 2
        ctx.flush()
    latency = ctx.all_reduce(latency)  # each entry was filled by one rank, zeros elsewhere
    bandwidth = ctx.all_reduce(bandwidth)
    if me != 0:
        return None
    return {
        "latency_s": latency.tolist(),
        "bandwidth_Bps": bandwidth.tolist(),
        "nbytes": payload.nbytes,
        "messages": messages,
    }


@dataclass(frozen=True)
class SlowLink:
    """A link under the threshold: ``src -> dst`` at ``bandwidth`` (``ratio`` of the fastest link)."""

    src: int
    dst: int
    bandwidth: float
    ratio: float


def find_slow_links(bandwidth: list[list[float]], threshold: float = 0.5) -> list[SlowLink]:
    """Links (off the diagonal) slower than ``threshold`` times the fastest link, slowest first.

    The fastest link is the reference because noise only ever slows a link down.
    """
    if not 0 < threshold < 1:
        raise ValueError(
            f"threshold is a fraction of the fastest link, between 0 and 1; got {threshold}"
        )
    n = len(bandwidth)
    links = [(s, d, bandwidth[s][d]) for s in range(n) for d in range(n) if s != d]
    if not links:
        return []
    best = max(bw for _, _, bw in links)
    slow = [SlowLink(s, d, bw, bw / best) for s, d, bw in links if bw < threshold * best]
    return sorted(slow, key=lambda link: link.bandwidth)


def diagnose(bandwidth: list[list[float]], threshold: float = 0.5) -> list[str]:
    """Plain sentences: which ranks have a slow NIC, which pairs a slow path, or that all is even."""
    n = len(bandwidth)
    slow = find_slow_links(bandwidth, threshold)
    if not slow:
        return [f"every link runs at {threshold:.0%} or more of the fastest: no slow link"]
    touched = {r: 0 for r in range(n)}
    for link in slow:
        touched[link.src] += 1
        touched[link.dst] += 1
    nics = [r for r, k in touched.items() if k >= 2 * (n - 1)]  # every link in and out of r
    lines = [
        f"rank {r}: every link to and from it is slow (a NIC or cable at a lower speed)"
        for r in nics
    ]
    for link in slow:
        if link.src in nics or link.dst in nics:
            continue
        lines.append(
            f"link {link.src} -> {link.dst}: {link.bandwidth / 1e6:.1f} MB/s, "
            f"{link.ratio:.0%} of the fastest link (a path problem)"
        )
    return lines
