"""Point-to-point transport: the only place where bytes leave a rank.

Every collective in :mod:`ddtk.comm` is built from :meth:`Transport.isend` and
:meth:`Transport.irecv`, thin wrappers over ``torch.distributed`` point-to-point
calls that count bytes and messages in :class:`~ddtk.comm.stats.CommStats`.

Tags keep traffic apart. User messages (``ctx.send``/``ctx.recv``) use tags below
:data:`USER_TAG_LIMIT`. Each collective call takes a fresh block of internal tags
from :meth:`Transport.tag_block`, and gives every (step, segment) message of the
algorithm its own tag inside that block. Messages between a pair of ranks with the
same tag are delivered in order, which is what makes back-to-back collectives safe.

Self-describing messages (:meth:`send_tensor`, :meth:`send_object`) carry a small
int64 header first, so the receiver can allocate the right buffer.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ddtk.comm.stats import CommStats

USER_TAG_LIMIT = 1 << 20
_INTERNAL_BASE = 1 << 24
_BLOCK_BITS = 18
_BLOCKS = 64
TAGS_PER_BLOCK = 1 << _BLOCK_BITS

# Header layout: [kind, dtype code, ndim or nbytes, dim0, dim1, ...]
_HEADER_LEN = 32
_MAX_DIMS = _HEADER_LEN - 3
_KIND_TENSOR, _KIND_PICKLE = 1, 2
DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.complex64, torch.complex128,
)  # fmt: skip
DTYPE_CODE = {dt: i for i, dt in enumerate(DTYPES)}


class Work(Protocol):
    """What an asynchronous send or receive returns."""

    def wait(self, timeout: Any = ...) -> Any: ...


class _Done:
    """A completed no-op, used for zero-byte messages that are never sent."""

    def wait(self, timeout: Any = None) -> bool:
        return True


@dataclass(frozen=True)
class Message:
    """A received point-to-point message."""

    src: int
    tag: int
    payload: Any


class Transport:
    """Counts, tags and sends tensors between the ranks of one process group."""

    def __init__(self, rank: int, world_size: int, device: torch.device, stats: CommStats):
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.stats = stats
        self._block = 0
        self._workspace: dict[torch.dtype, torch.Tensor] = {}

    # -- raw tensors -----------------------------------------------------------------
    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        """Start sending a contiguous tensor; zero-byte tensors are not sent at all."""
        if tensor.numel() == 0:
            return _Done()
        self.stats.record_send(tensor.numel() * tensor.element_size())
        return dist.isend(tensor, dst, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        """Start receiving into a contiguous tensor; zero-byte tensors expect no message."""
        if tensor.numel() == 0:
            return _Done()
        self.stats.record_recv(tensor.numel() * tensor.element_size())
        return dist.irecv(tensor, src, tag=tag)

    def exchange(self, send: torch.Tensor, recv: torch.Tensor, peer: int, tag: int) -> None:
        """Send ``send`` to ``peer`` and receive ``recv`` from it at the same time."""
        works = [self.irecv(recv, peer, tag), self.isend(send, peer, tag)]
        for w in works:
            w.wait()

    def tag_block(self) -> int:
        """First tag of a fresh block of :data:`TAGS_PER_BLOCK` internal tags."""
        base = _INTERNAL_BASE + self._block * TAGS_PER_BLOCK
        self._block = (self._block + 1) % _BLOCKS
        return base

    def workspace(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat scratch tensor of at least ``numel`` elements, reused across calls.

        Fresh large allocations page-fault on first touch, which on a virtual
        machine can cost as much as the transfer itself; a collective's receive
        buffer is only needed during the call, so it is kept and reused.
        """
        buf = self._workspace.get(dtype)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=self.device)
            self._workspace[dtype] = buf
        return buf[:numel]

    def release_workspace(self) -> None:
        """Free the cached scratch buffers."""
        self._workspace.clear()

    # -- self-describing tensors and objects -------------------------------------------
    def send_tensor(self, tensor: torch.Tensor, dst: int, tag: int) -> list[Work]:
        """Start sending a tensor of any shape and dtype; the receiver needs to know nothing.

        The tensor is copied first, so the caller may change it right away.
        """
        tensor = tensor.detach()
        if tensor.dtype not in DTYPE_CODE or tensor.dim() > _MAX_DIMS:
            return self.send_object(tensor.cpu(), dst, tag)
        header = self._header(_KIND_TENSOR, DTYPE_CODE[tensor.dtype], tensor.dim(), tensor.shape)
        payload = tensor.to(self.device, copy=True).contiguous()
        return [self.isend(header, dst, tag), self.isend(payload, dst, tag)]

    def send_object(self, obj: Any, dst: int, tag: int) -> list[Work]:
        """Start sending any picklable object as a header plus a byte payload."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        header = self._header(_KIND_PICKLE, 0, len(data), ())
        return [self.isend(header, dst, tag), self.isend(payload, dst, tag)]

    def send_any(self, obj: Any, dst: int, tag: int) -> list[Work]:
        """Start sending a tensor natively and anything else pickled; wait on the returned works."""
        if isinstance(obj, torch.Tensor):
            return self.send_tensor(obj, dst, tag)
        return self.send_object(obj, dst, tag)

    def recv_any(self, src: int | None, tag: int) -> Message:
        """Receive what :meth:`send_any` sent; ``src=None`` takes the first sender."""
        header = torch.zeros(_HEADER_LEN, dtype=torch.int64, device=self.device)
        src = self._recv_header(header, src, tag)
        kind, code, n = (int(v) for v in header[:3].tolist())
        if kind == _KIND_TENSOR:
            shape = [int(d) for d in header[3 : 3 + n].tolist()]
            out = torch.empty(shape, dtype=DTYPES[code], device=self.device)
            self.irecv(out, src, tag).wait()
            return Message(src, tag, out)
        if kind == _KIND_PICKLE:
            buf = torch.empty(n, dtype=torch.uint8, device=self.device)
            self.irecv(buf, src, tag).wait()
            return Message(src, tag, pickle.loads(buf.cpu().numpy().tobytes()))
        raise RuntimeError(
            f"rank {self.rank}: corrupt message header from rank {src}: {header[:3].tolist()}"
        )

    def _recv_header(self, header: torch.Tensor, src: int | None, tag: int) -> int:
        self.stats.record_recv(header.numel() * header.element_size())
        if src is None:
            return int(dist.recv(header, None, tag=tag))
        dist.recv(header, src, tag=tag)
        return src

    def _header(
        self, kind: int, code: int, n: int, shape: tuple[int, ...] | torch.Size
    ) -> torch.Tensor:
        values = [kind, code, n, *shape]
        header = torch.zeros(_HEADER_LEN, dtype=torch.int64)
        header[: len(values)] = torch.tensor(values, dtype=torch.int64)
        return header.to(self.device)
