"""What every gradient compressor shares: the payload, byte accounting, and aggregation.

A compressor turns a tensor into a :class:`Payload` (the tensors that go on the
wire) and back::

    payload = c.compress(grad)          # what this rank would send
    approx = c.decompress(payload)      # what a receiver rebuilds
    payload.nbytes                      # exact bytes of the tensors on the wire

and :meth:`Compressor.aggregate` does the distributed part: it returns, on every
rank, the average over ranks of every rank's decompressed contribution.

Byte accounting. ``Payload.nbytes`` is the exact sum of ``numel * element_size``
of the payload tensors. It excludes metadata that every rank already knows
without communication: the shape and dtype of the gradient bucket (fixed for the
whole run), the compressor's settings (k, s, rank...) and anything derived from
a seed shared by all ranks (random-k indices, PowerSGD's initial Q). Those are
kept in ``Payload.shape``, ``Payload.dtype`` and ``Payload.shared``.

How payloads are exchanged. A sparse or per-rank-scaled payload cannot be summed
element by element (rank 0's index 5 and rank 1's index 5 are different
coordinates; rank 0's int8 code 3 and rank 1's mean different values), so the
default :meth:`Compressor.exchange` packs this rank's payload into one byte
buffer of exactly ``nbytes`` bytes, all-gathers the buffers, and decompresses
and averages them locally. Compressors whose payload is dense and linear
(no compression, random-k with shared indices, PowerSGD's P and Q) override
:meth:`~Compressor.exchange` to use ``ctx.all_reduce`` instead, which sends
about ``2 * nbytes`` per rank whatever the world size, where all-gather sends
``(world_size - 1) * nbytes``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

__all__ = ["CompressionStats", "Compressor", "Exchanged", "KSparsifier", "NoCompression", "Payload"]


@dataclass
class Payload:
    """The tensors one rank puts on the wire, plus what a receiver needs to rebuild the tensor.

    ``tensors`` go on the wire (counted in :attr:`nbytes`); ``shape``, ``dtype``
    and ``shared`` are known to every rank without communication (not counted).

    >>> import torch
    >>> from ddtk.compression import TopK
    >>> TopK(k=2).compress(torch.tensor([1.0, -3.0, 2.0])).nbytes   # 2 float32 values + 2 int32 indices
    16
    """

    tensors: dict[str, torch.Tensor]
    shape: torch.Size
    dtype: torch.dtype
    shared: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Exact bytes of the payload tensors: sum of ``numel * element_size``."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def numel(self) -> int:
        """Number of elements of the tensor this payload rebuilds."""
        return math.prod(self.shape)

    def pack(self) -> torch.Tensor:
        """All payload tensors as one flat uint8 buffer of exactly :attr:`nbytes` bytes."""
        parts = [
            t.detach().contiguous().reshape(-1).view(torch.uint8) for t in self.tensors.values()
        ]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)

    def unpack(self, buffer: torch.Tensor) -> Payload:
        """A payload with this one's layout (names, shapes, dtypes) read from ``buffer`` (see :meth:`pack`)."""
        out, start = {}, 0
        for name, t in self.tensors.items():
            size = t.numel() * t.element_size()
            raw = buffer[start : start + size].clone()  # clone: aligned storage for the dtype view
            out[name] = raw.view(t.dtype).reshape(t.shape)
            start += size
        return Payload(out, self.shape, self.dtype, self.shared)


class Exchanged(NamedTuple):
    """Result of :meth:`Compressor.exchange`: the average, this rank's own contribution, its bytes."""

    mean: torch.Tensor  # average over ranks of the decompressed contributions
    own: torch.Tensor  # this rank's decompressed contribution, as counted in ``mean``
    nbytes: int  # payload bytes this rank contributed (Payload.nbytes)


@dataclass
class CompressionStats:
    """Bytes per :meth:`Compressor.aggregate` call, on this rank.

    ``payload_bytes``: compressed bytes this rank contributed (``Payload.nbytes``).
    ``dense_bytes``: bytes of the uncompressed tensor. ``sent_bytes``: bytes this
    rank's transport actually sent during the call (from ``ctx.stats``), which
    includes the collective's own overhead, e.g. ``(world_size - 1) * payload``
    for an all-gather ring.
    """

    calls: int = 0
    payload_bytes: int = 0
    dense_bytes: int = 0
    sent_bytes: int = 0

    @property
    def ratio(self) -> float:
        """Compression ratio so far: dense bytes / payload bytes."""
        return self.dense_bytes / self.payload_bytes if self.payload_bytes else float("inf")

    def reset(self) -> None:
        """Zero every counter."""
        self.calls = self.payload_bytes = self.dense_bytes = self.sent_bytes = 0


class Compressor:
    """Base class: subclasses implement :meth:`compress` and :meth:`decompress`.

    Stateful compressors keep one state per ``key`` (a gradient bucket). Stochastic
    ones draw from :meth:`_generator`, seeded with ``(seed, rank, key, call number)``;
    :meth:`aggregate` sets :attr:`rank` from ``ctx`` so ranks draw different numbers.

    >>> import ddtk, torch
    >>> from ddtk.compression import TopK
    >>> def work(ctx):
    ...     c = TopK(k=2)
    ...     g = torch.tensor([1.0, -4.0, 2.0, 0.5]) * (ctx.rank + 1)
    ...     return c.aggregate(ctx, g), c.last_bytes   # mean of each rank's top-2
    >>> ddtk.launch(work, world_size=2)[0]
    (tensor([ 0., -6.,  3.,  0.]), 16)
    """

    name = "compressor"

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self.rank = 0
        self.stats = CompressionStats()
        self.last_bytes = 0  # payload bytes of the last aggregate (what a trainer reports per step)
        self.last_sent_bytes = 0  # bytes the transport really sent during the last aggregate
        self._calls: dict[tuple[str, int], int] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # -- what subclasses provide -----------------------------------------------------
    def compress(self, tensor: torch.Tensor, key: int = 0) -> Payload:
        """The payload this rank would send for ``tensor`` (bucket ``key``)."""
        raise NotImplementedError

    def decompress(self, payload: Payload) -> torch.Tensor:
        """The tensor a receiver rebuilds from ``payload`` (same shape and dtype as the input)."""
        raise NotImplementedError

    # -- distributed part ------------------------------------------------------------
    def aggregate(self, ctx: Any, tensor: torch.Tensor, key: int = 0) -> torch.Tensor:
        """Average over ranks of every rank's decompressed contribution; a collective.

        Every rank calls it with a tensor of the same shape and dtype and the same
        ``key``. Updates :attr:`last_bytes`, :attr:`last_sent_bytes` and :attr:`stats`.
        """
        self._check(tensor)
        self.rank = ctx.rank
        if tensor.numel() == 0:  # every rank has the same (empty) shape: nothing to send
            out, nbytes, sent = tensor.detach().clone(), 0, 0
        else:
            sent0 = ctx.stats.bytes_sent
            out, _, nbytes = self.exchange(ctx, tensor, key)
            sent = ctx.stats.bytes_sent - sent0
        self.last_bytes, self.last_sent_bytes = nbytes, sent
        self.stats.calls += 1
        self.stats.payload_bytes += nbytes
        self.stats.dense_bytes += tensor.numel() * tensor.element_size()
        self.stats.sent_bytes += sent
        return out

    def exchange(self, ctx: Any, tensor: torch.Tensor, key: int = 0) -> Exchanged:
        """Compress, all-gather the packed payloads, decompress each and average.

        Returns this rank's own decompressed contribution too, which error
        feedback needs for its residual.
        """
        payload = self.compress(tensor, key)
        own = self.decompress(payload)
        buffers = ctx.all_gather(payload.pack())
        total = torch.zeros_like(own)
        for r, buf in enumerate(buffers):
            total += own if r == ctx.rank else self.decompress(payload.unpack(buf))
        return Exchanged(total / ctx.world_size, own, payload.nbytes)

    # -- helpers ---------------------------------------------------------------------
    def _generator(self, key: int, stream: str, per_rank: bool = True) -> torch.Generator:
        """A generator for call number t of bucket ``key``: seeded by (seed, rank, key, t).

        ``per_rank=False`` leaves the rank out, so every rank draws the same numbers.
        """
        t = self._calls.get((stream, key), 0)
        self._calls[(stream, key)] = t + 1
        rank = self.rank if per_rank else -1
        text = repr((self.seed, rank, key, t, stream)).encode()  # not hash(): salted per process
        mixed = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1
        return torch.Generator().manual_seed(mixed)

    @staticmethod
    def _check(tensor: Any) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"compressors take a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.dtype.is_floating_point:
            raise TypeError(f"compressors take a floating-point tensor, got {tensor.dtype}")


def positive_int(value: Any, name: str) -> int:
    """``value`` as an int >= 1, or a ValueError/TypeError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value}")
    return value


def index_dtype(n: int) -> torch.dtype:
    """int32 indices while they fit (4 bytes each), int64 beyond 2**31 - 1 elements."""
    return torch.int32 if n <= torch.iinfo(torch.int32).max else torch.int64


class KSparsifier(Compressor):
    """Base of the compressors that keep ``k`` entries, given as a count or a fraction (top-k, random-k)."""

    prefix = "k"

    def __init__(self, ratio: float | None = None, k: int | None = None, seed: int = 0):
        super().__init__(seed)
        if (ratio is None) == (k is None):
            raise ValueError("give exactly one of ratio (fraction kept, in (0, 1]) or k (count)")
        if ratio is not None and not (isinstance(ratio, (int, float)) and 0 < ratio <= 1):
            raise ValueError(f"ratio must be a fraction in (0, 1], got {ratio!r}")
        self.ratio = None if ratio is None else float(ratio)
        self.k = None if k is None else positive_int(k, "k")
        self.name = f"{self.prefix}:{self.ratio}" if self.k is None else f"{self.prefix}:{self.k}"

    def k_for(self, n: int) -> int:
        """How many entries are kept of a tensor of ``n`` elements."""
        if self.k is not None:
            return min(self.k, n)
        return min(n, max(1, math.ceil(self.ratio * n)))  # type: ignore[operator]


class NoCompression(Compressor):
    """The dense baseline: send the tensor as it is, average with a ring all-reduce.

    Bytes on the wire: ``n * element_size`` (4n for float32). The payload is
    dense and linear, so :meth:`exchange` sums it with ``ctx.all_reduce``.

    >>> import ddtk, torch
    >>> from ddtk.compression import NoCompression
    >>> ddtk.launch(lambda ctx: NoCompression().aggregate(ctx, torch.ones(3) * ctx.rank), 2)[0]
    tensor([0.5000, 0.5000, 0.5000])
    """

    name = "none"

    def compress(self, tensor: torch.Tensor, key: int = 0) -> Payload:
        self._check(tensor)
        return Payload({"values": tensor.detach().clone()}, tensor.shape, tensor.dtype)

    def decompress(self, payload: Payload) -> torch.Tensor:
        return payload.tensors["values"].clone()

    def exchange(self, ctx: Any, tensor: torch.Tensor, key: int = 0) -> Exchanged:
        own = tensor.detach().clone()
        total = ctx.all_reduce(own, op="sum")
        return Exchanged(total / ctx.world_size, own, own.numel() * own.element_size())
