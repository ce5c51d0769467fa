"""Communication statistics: bytes and messages moved, and time spent per collective.

The counters are updated by the transport on every point-to-point message and by
the context around every collective, so ``ctx.stats`` always tells what an
algorithm really sent, which lectures compare with the cost model.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field


@dataclass
class CollectiveStats:
    """Totals for one kind of collective (e.g. ``all_reduce[ring]``)."""

    calls: int = 0
    seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass
class CommStats:
    """What one rank has sent and received, and where the time went."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    per_collective: dict[str, CollectiveStats] = field(default_factory=dict)

    def record_send(self, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.messages_sent += 1

    def record_recv(self, nbytes: int) -> None:
        self.bytes_received += nbytes
        self.messages_received += 1

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Attribute the time and the bytes of the enclosed block to collective ``name``."""
        sent0, recv0 = self.bytes_sent, self.bytes_received
        start = time.perf_counter()
        try:
            yield
        finally:
            entry = self.per_collective.setdefault(name, CollectiveStats())
            entry.calls += 1
            entry.seconds += time.perf_counter() - start
            entry.bytes_sent += self.bytes_sent - sent0
            entry.bytes_received += self.bytes_received - recv0

    def reset(self) -> None:
        """Zero every counter."""
        self.bytes_sent = self.bytes_received = 0
        self.messages_sent = self.messages_received = 0
        self.per_collective.clear()

    def as_dict(self) -> dict:
        """A plain-dict copy, safe to return from a rank or to dump as JSON."""
        return asdict(self)
