"""Link emulation: local ranks that behave as if each pair sat on a network of your choosing.

A laptop's ranks talk through shared memory at several GB/s with microseconds of
latency. To *measure* what a 10 Gb/s Ethernet link, a 25 µs hop or one slow
cable does to a collective, :class:`EmulatedNetwork` gives every ordered pair
of ranks (a link) a bandwidth and a latency, and ddtk's collectives then run
over those links::

    net = EmulatedNetwork(bandwidth="10Gbit", latency="20us", slow={2: "1Gbit"})
    ddtk.launch(work, 4, network=net)      # every link touching rank 2 runs at 1 Gb/s

How a message is delayed (pure Python, no root, nothing outside the process):

* **A token bucket per link**, kept by the sender. Tokens (bytes) refill at the
  link's rate up to ``burst``; a message takes as many as it has bytes and may
  leave the bucket in debt. The message has left the sender when the debt is
  paid: ``done = now + debt / rate``. Back-to-back messages on one link queue
  behind each other, as on a wire; links to different peers run in parallel.
* **A NIC per rank**, optional (``nic``): one more token bucket that every message a
  rank sends takes from, whatever its destination. Without it the ranks form a full
  mesh of independent links (a rank may send to three peers at three times the
  rate); with it, fan-out traffic such as all-to-all shares one NIC, as on a cluster.
* **A per-message delay**: the message arrives ``latency`` after it has left.
* The sender sends an 8-byte *stamp* with the arrival time just before the
  payload, on the same tag, so it arrives first (messages of one pair and tag
  are delivered in order on both transports). The receive completes once the
  payload is there *and* the stamp's time has come; the send completes once
  ``done`` has passed. The stamp is bookkeeping of the emulated wire, so it is
  not counted in ``ctx.stats``.
* Every rank reads the same clock (``CLOCK_MONOTONIC``), which is why emulation
  is for ranks of one host only.

The emulation can only make links slower than the transport under it. Over
shared memory that leaves a lot of room (GB/s, tens of µs); over TCP less (a
message costs hundreds of µs). :meth:`LinkSpec.time` is what one message should
take; ``tests/test_net_emulate.py`` checks measured against it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ddtk.bench.timing import parse_size
from ddtk.comm.transport import Transport, Work
from ddtk.net.units import format_rate, format_time, parse_rate, parse_time

_STAMP_BYTES = 8
SPIN_NS = 60_000
"""The last part of a wait is spent polling the clock: a sleep overshoots by 10-80 µs."""
_SLEEP_CHUNK_S = 1e-3


@dataclass(frozen=True)
class LinkSpec:
    """One direction of one link: ``bandwidth`` in bytes/s, ``latency`` and ``burst`` bytes."""

    bandwidth: float
    latency: float
    burst: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "bandwidth", parse_rate(self.bandwidth))
        object.__setattr__(self, "latency", parse_time(self.latency))
        burst = self.burst if isinstance(self.burst, int) else parse_size(self.burst)
        if isinstance(burst, bool) or burst < 0:
            raise ValueError(f"burst must be a number of bytes >= 0, got {self.burst!r}")
        object.__setattr__(self, "burst", burst)

    def time(self, nbytes: int) -> float:
        """Seconds for one ``nbytes`` message on an idle link (past the burst): latency + size / rate."""
        return self.latency + max(0, nbytes - self.burst) / self.bandwidth

    def __str__(self) -> str:
        return f"{format_rate(self.bandwidth)}, {format_time(self.latency)}"


Override = Any  # a LinkSpec, a rate ("1Gbit"), or a dict of LinkSpec fields


@dataclass(frozen=True)
class EmulatedNetwork:
    """Bandwidth and latency for every link between local ranks (see the module docstring).

    Args:
        bandwidth: rate of every link, bytes/s or text (``"10Gbit"``, ``"1.25GB/s"``).
        latency: one-way delay of every message, seconds or text (``"20us"``).
        burst: bytes an idle link may send at once (a token bucket's depth; 0: none).
        nic: if given, the rate of each rank's NIC: all of its sends share it.
        slow: exceptions. A key ``r`` (int) applies to every link to or from rank ``r``
            (a slow NIC or cable); a key ``(src, dst)`` to that one direction. A value is
            a :class:`LinkSpec`, a rate (the latency stays), or a dict of ``bandwidth``,
            ``latency`` and ``burst``. A pair key wins over a rank key.
    """

    bandwidth: float | str
    latency: float | str = 0.0
    burst: int | str = 0
    slow: Mapping[Any, Override] = field(default_factory=dict)
    nic: float | str | None = None

    def __post_init__(self) -> None:
        base = LinkSpec(self.bandwidth, self.latency, self.burst)
        if self.nic is not None:
            object.__setattr__(self, "nic", parse_rate(self.nic))
        object.__setattr__(self, "bandwidth", base.bandwidth)
        object.__setattr__(self, "latency", base.latency)
        object.__setattr__(self, "burst", base.burst)
        object.__setattr__(
            self, "slow", {_key(k): _spec(v, base) for k, v in dict(self.slow).items()}
        )

    @property
    def default(self) -> LinkSpec:
        """The link every pair gets unless :attr:`slow` says otherwise."""
        return LinkSpec(self.bandwidth, self.latency, self.burst)

    def link(self, src: int, dst: int) -> LinkSpec:
        """The link that carries messages from rank ``src`` to rank ``dst``."""
        for key in ((src, dst), src, dst):
            if key in self.slow:
                return self.slow[key]
        return self.default

    def check(self, world_size: int) -> None:
        """Raise ValueError if an exception names a rank outside ``range(world_size)``."""
        for key in self.slow:
            ranks = key if isinstance(key, tuple) else (key,)
            bad = [r for r in ranks if not 0 <= r < world_size]
            if bad:
                raise ValueError(
                    f"EmulatedNetwork.slow names rank(s) {bad}, but the job has ranks "
                    f"0..{world_size - 1}"
                )

    def prepare(self, world_size: int, transport: str) -> tuple[str, str, list[dict[str, str]]]:
        """What :func:`ddtk.launch` needs: the store's host, the transport, per-rank environment."""
        self.check(world_size)
        return "127.0.0.1", transport, [{} for _ in range(world_size)]

    def wrap(self, comm: Transport, rank: int) -> EmulatedTransport:
        """The transport ``comm`` with this network's links in front of it."""
        return EmulatedTransport(comm, self, rank)

    def __str__(self) -> str:
        text = f"emulated links: {self.default}"
        if self.nic is not None:
            text += f", NIC {format_rate(self.nic)} per rank"
        for key, spec in self.slow.items():
            where = f"{key[0]}->{key[1]}" if isinstance(key, tuple) else f"rank {key}"
            text += f"; {where}: {spec}"
        return text


def _key(key: Any) -> int | tuple[int, int]:
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, int) for k in key):
        if key[0] == key[1]:
            raise ValueError(f"a link joins two different ranks, got {key}")
        return key
    raise ValueError(
        f"a key of EmulatedNetwork.slow is a rank (int) or a pair (src, dst), got {key!r}"
    )


def _spec(value: Override, base: LinkSpec) -> LinkSpec:
    if isinstance(value, LinkSpec):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - {"bandwidth", "latency", "burst"}
        if unknown:
            raise ValueError(
                f"unknown link field(s) {sorted(unknown)}; use bandwidth, latency, burst"
            )
        fields = {"bandwidth": base.bandwidth, "latency": base.latency, "burst": base.burst}
        return LinkSpec(**{**fields, **value})
    return LinkSpec(value, base.latency, base.burst)


class TokenBucket:
    """The sender's side of one link: when will a message of ``nbytes`` have left?

    Tokens are bytes. They refill at ``rate`` up to ``burst``; taking more than there are
    leaves a debt that the rate pays off, which queues later messages behind it.
    """

    __slots__ = ("_ns", "burst", "rate_per_ns", "tokens")

    def __init__(self, rate: float, burst: int):
        self.rate_per_ns, self.burst = rate / 1e9, float(burst)
        self.tokens, self._ns = float(burst), None

    def reserve(self, nbytes: int, now_ns: int) -> int:
        """Take ``nbytes``; return the clock time (ns) at which their last byte has left."""
        if self._ns is not None:
            self.tokens = min(self.burst, self.tokens + (now_ns - self._ns) * self.rate_per_ns)
        self._ns = now_ns
        self.tokens -= nbytes
        return now_ns if self.tokens >= 0 else now_ns + int(-self.tokens / self.rate_per_ns)


def _fine_timer_slack() -> None:
    """Let this process's sleeps end within microseconds of their deadline (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK, 1 ns


def sleep_until(deadline_ns: int, poll: Any = None) -> None:
    """Return at ``deadline_ns`` on the monotonic clock: sleep, then poll the clock for the rest.

    ``poll`` (optional) is called between sleeps of at most 1 ms, so that a transport
    that makes progress only when someone waits (shared memory) keeps moving.
    """
    while True:
        left = deadline_ns - time.monotonic_ns()
        if left <= SPIN_NS:
            break
        time.sleep(min(left - SPIN_NS, _SLEEP_CHUNK_S * 1e9) / 1e9)
        if poll is not None:
            poll()
    while time.monotonic_ns() < deadline_ns:
        os.sched_yield()  # another rank may need this core more than the clock does


class _Send:
    """An emulated send: complete once the transport has it and the link has carried it."""

    __slots__ = ("_done_ns", "_poll", "_works")

    def __init__(self, works: tuple[Work, Work], done_ns: int, poll: Any):
        self._works, self._done_ns, self._poll = works, done_ns, poll

    def wait(self, timeout: Any = None) -> bool:
        for w in self._works:
            w.wait() if timeout is None else w.wait(timeout)
        sleep_until(self._done_ns, self._poll)
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works) and time.monotonic_ns() >= self._done_ns


class _Recv:
    """An emulated receive: complete once the payload is here and its arrival time has come."""

    __slots__ = ("_poll", "_stamp", "_works")

    def __init__(self, works: tuple[Work, Work], stamp: torch.Tensor, poll: Any):
        self._works, self._stamp, self._poll = works, stamp, poll

    def wait(self, timeout: Any = None) -> bool:
        for w in self._works:
            w.wait() if timeout is None else w.wait(timeout)
        sleep_until(int(self._stamp[0]), self._poll)
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works) and (
            time.monotonic_ns() >= int(self._stamp[0])
        )

    def _source_rank(self) -> int:
        return self._works[1]._source_rank()


_OWN = frozenset({"_inner", "_buckets", "_latency_ns", "_poll", "_nic", "network"})


class EmulatedTransport:
    """A transport whose messages take the time that :class:`EmulatedNetwork` says.

    It wraps the real transport (shared memory or TCP): everything else, including
    the attributes the context sets (``op``, ``phase``, ``seq``), is the wrapped one's.
    """

    def __init__(self, inner: Transport, network: EmulatedNetwork, rank: int):
        if not inner.device.type == "cpu":
            raise ValueError(
                f"link emulation runs between CPU ranks (gloo); this group runs on {inner.device}"
            )
        network.check(inner.world_size)
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "network", network)
        peers = [r for r in range(inner.world_size) if r != rank]
        links = {r: network.link(rank, r) for r in peers}
        object.__setattr__(
            self, "_buckets", {r: TokenBucket(s.bandwidth, s.burst) for r, s in links.items()}
        )
        object.__setattr__(self, "_latency_ns", {r: int(s.latency * 1e9) for r, s in links.items()})
        object.__setattr__(self, "_poll", getattr(inner, "progress", None))
        nic = None if network.nic is None else TokenBucket(network.nic, network.burst)
        object.__setattr__(self, "_nic", nic)
        _fine_timer_slack()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)

    # -- the two calls every algorithm makes -----------------------------------------
    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        """Send now; the receiver sees it ``latency`` after the link has carried its bytes."""
        nbytes = tensor.numel() * tensor.element_size()
        inner = self._inner
        if nbytes == 0:
            return inner.isend(tensor, dst, tag)
        now = time.monotonic_ns()
        done = self._buckets[dst].reserve(nbytes, now)
        if self._nic is not None:  # the rank's NIC is shared by all its links
            done = max(done, self._nic.reserve(nbytes, now))
        stamp = torch.tensor([done + self._latency_ns[dst]], dtype=torch.int64)
        first = inner.isend(stamp, dst, tag)
        self._uncount(sent=True)
        return _Send((first, inner.isend(tensor, dst, tag)), done, self._poll)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        """Receive; complete at the arrival time the sender's stamp gives."""
        inner = self._inner
        if tensor.numel() == 0:
            return inner.irecv(tensor, src, tag)
        stamp = torch.empty(1, dtype=torch.int64)
        first = inner.irecv(stamp, src, tag)
        self._uncount(sent=False)
        return _Recv((first, inner.irecv(tensor, src, tag)), stamp, self._poll)

    def _uncount(self, sent: bool) -> None:
        """Take a stamp back out of the statistics: it is the emulated wire's, not data."""
        stats = self._inner.stats
        if sent:
            stats.bytes_sent -= _STAMP_BYTES
            stats.messages_sent -= 1
        else:
            stats.bytes_received -= _STAMP_BYTES
            stats.messages_received -= 1

    def _recv_header(self, header: torch.Tensor, src: int | None, tag: int) -> int:
        """The first message of ``recv_any``, from a known or any source: stamp, then header."""
        stamp = torch.empty(1, dtype=torch.int64)
        src = self._inner._recv_header(stamp, src, tag)
        self._uncount(sent=False)
        self._inner.irecv(header, src, tag).wait()
        sleep_until(int(stamp[0]), self._poll)
        return src

    # The transport's composite calls, run with this object as ``self`` so that their
    # messages go through the emulated isend/irecv above.
    exchange = Transport.exchange
    send_tensor = Transport.send_tensor
    send_object = Transport.send_object
    send_any = Transport.send_any
    recv_any = Transport.recv_any
