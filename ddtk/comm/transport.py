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

A hang becomes an error. With an ``op_timeout`` every send and receive is
*watched*: a wait that makes no progress for ``op_timeout`` seconds raises
:class:`CollectiveTimeoutError`, and a lost connection :class:`PeerLostError`,
both naming the operation (``all_reduce[ring]``), this rank and the peer it was
waiting for. Before raising, the rank leaves a note in the rendezvous store and
reads its peers' notes, so the error also names the ranks that never reached
the operation: in a ring, rank 1 waits for rank 0, but the culprit is the hung
rank 2 that rank 0 waits for. Without ``op_timeout`` the works are gloo's own,
untouched, and nothing costs more than before.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
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


class CommunicationError(RuntimeError):
    """A send, receive or collective failed: names the operation, this rank and the peers.

    ``op`` is the operation (``"all_reduce[ring]"``, ``"recv"``), ``rank`` this rank,
    ``peers`` the ranks it was directly waiting for (empty if unknown) and
    ``missing`` the ranks that, as far as the rendezvous store tells, never reached
    the operation (hung, dead or running other code).
    """

    def __init__(
        self, message: str, op: str, rank: int, peers: list[int], missing: list[int]
    ) -> None:
        super().__init__(message)
        self.op, self.rank, self.peers, self.missing = op, rank, peers, missing


class CollectiveTimeoutError(CommunicationError, TimeoutError):
    """An operation made no progress for ``op_timeout`` seconds (a hung or very slow peer)."""


class PeerLostError(CommunicationError, ConnectionError):
    """The connection to a peer closed in the middle of an operation (a dead peer)."""


class Work(Protocol):
    """What an asynchronous send or receive returns."""

    def wait(self, timeout: Any = ...) -> Any: ...


class _Done:
    """A completed no-op, used for zero-byte messages that are never sent."""

    def wait(self, timeout: Any = None) -> bool:
        return True


class _Watched:
    """A gloo work whose argument-less :meth:`wait` gives up after the transport's ``op_timeout``."""

    __slots__ = ("_comm", "_op", "_peer", "_seq", "_work")

    def __init__(self, work: Any, comm: Transport, peer: int | None) -> None:
        self._work, self._comm, self._peer = work, comm, peer
        self._op, self._seq = comm.op, comm.seq

    def wait(self, timeout: Any = None) -> Any:
        """Wait; an explicit ``timeout`` keeps gloo's own behaviour (used by ``ctx.flush``)."""
        if timeout is not None:
            return self._work.wait(timeout)
        try:
            return self._work.wait(self._comm.op_timeout)
        except RuntimeError as exc:
            peers = [] if self._peer is None else [self._peer]
            raise self._comm.failure(self._op, self._seq, peers, exc) from exc

    def _source_rank(self) -> int:
        return self._work._source_rank()


@dataclass(frozen=True)
class Message:
    """A received point-to-point message."""

    src: int
    tag: int
    payload: Any


class Transport:
    """Counts, tags and sends tensors between the ranks of one process group (gloo or NCCL).

    This is the ``"tcp"`` transport on CPU: gloo's point-to-point over sockets.
    :class:`~ddtk.comm.shm_transport.ShmTransport` replaces it between ranks of one host.
    """

    name = "tcp"

    def __init__(
        self,
        rank: int,
        world_size: int,
        device: torch.device,
        stats: CommStats,
        op_timeout: float | None = None,
    ):
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.stats = stats
        self._block = 0
        self._workspace: dict[torch.dtype, torch.Tensor] = {}
        self.op_timeout_s = op_timeout
        self.op_timeout = None if op_timeout is None else timedelta(seconds=op_timeout)
        self.op = "send/recv"  # the operation running now; set by the context
        self.phase = ""  # a part of it ("argument check"), named in errors
        self.seq = 0  # how many collectives this rank has started

    # -- failures --------------------------------------------------------------------
    def failure(
        self, op: str, seq: int, peers: list[int], exc: BaseException, phase: str = ""
    ) -> CommunicationError:
        """Turn a failed wait into an error naming the operation, the peers and the missing ranks."""
        text = str(exc).split("] ", 1)[-1]  # drop gloo's source-file prefix
        phase = phase or self.phase
        timed_out = "timed out" in text.lower() or "timeout" in text.lower()
        grace = min(5.0, max(0.5, self.op_timeout_s / 2)) if timed_out else 0.5
        notes = _exchange_notes(self, f"{op}#{seq}", grace)
        missing = sorted(r for r in range(self.world_size) if r != self.rank and r not in notes)
        where = f"{op}{f' ({phase})' if phase else ''}"
        waiting = (
            f"waiting for rank {', '.join(map(str, peers))}" if peers else "waiting for its peers"
        )
        if timed_out:
            head = f"rank {self.rank}: {where} made no progress for {self.op_timeout_s} s {waiting}"
        else:
            head = f"rank {self.rank}: {where} lost its connection {waiting}"
        lines = [head + "."]
        if missing:
            lines.append(
                f"Rank(s) {', '.join(map(str, missing))} did not report being in {op} (call "
                f"#{seq} on this rank): hung, dead, or elsewhere in the program."
            )
        other = {r: n for r, n in notes.items() if n != f"{op}#{seq}"}
        for r, note in sorted(other.items()):
            lines.append(f"Rank {r} is stuck in {note.replace('#', ' (call #')})")
        lines.append(f"Cause: {text}")
        cls = CollectiveTimeoutError if timed_out else PeerLostError
        return cls(" ".join(lines), op, self.rank, peers, missing)

    # -- raw tensors -----------------------------------------------------------------
    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        """Start sending a contiguous tensor; zero-byte tensors are not sent at all."""
        if tensor.numel() == 0:
            return _Done()
        self.stats.record_send(tensor.numel() * tensor.element_size())
        if self.op_timeout is None:
            return dist.isend(tensor, dst, tag=tag)
        return self._watched(dist.isend, tensor, dst, tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        """Start receiving into a contiguous tensor; zero-byte tensors expect no message."""
        if tensor.numel() == 0:
            return _Done()
        self.stats.record_recv(tensor.numel() * tensor.element_size())
        if self.op_timeout is None:
            return dist.irecv(tensor, src, tag=tag)
        return self._watched(dist.irecv, tensor, src, tag)

    def _watched(self, start: Callable, tensor: torch.Tensor, peer: int | None, tag: int) -> Work:
        """Start a send or receive whose failures, even at the start, name the op and the peer."""
        try:
            return _Watched(start(tensor, peer, tag=tag), self, peer)
        except RuntimeError as exc:  # the connection was already closed
            raise self.failure(self.op, self.seq, [] if peer is None else [peer], exc) from exc

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

    def close(self) -> None:
        """Let the peers know this rank is done (nothing to do over gloo)."""

    def undelivered(self, timeout: float | None) -> list[tuple[int, int]]:
        """(dst, tag) of sent messages no receiver has taken; gloo's sends complete only then."""
        return []

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
        if self.op_timeout is not None:  # a watched receive, from ``src`` or from anyone
            work = self._watched(dist.irecv, header, src, tag)
            work.wait()
            return src if src is not None else int(work._source_rank())
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


_NOTE_KEY = "ddtk/stuck/{}"


def _default_store() -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


def _exchange_notes(comm: Transport, note: str, grace: float) -> dict[int, str]:
    """Say in the rendezvous store where this rank is stuck; return the notes of the other ranks.

    Only runs on the failure path. It waits up to ``grace`` seconds (half the
    op_timeout, between 0.5 and 5 s, after a timeout; 0.5 s after a lost
    connection, which the peers see at once) for the peers that also fail to
    leave their notes; the ranks with no note never reached the operation.
    """
    store = _default_store()
    if store is None or comm.world_size == 1:
        return {}
    others = [r for r in range(comm.world_size) if r != comm.rank]
    try:
        store.set(_NOTE_KEY.format(comm.rank), note)
        deadline = time.monotonic() + grace
        present: list[int] = []
        while time.monotonic() < deadline:
            present = [r for r in others if store.check([_NOTE_KEY.format(r)])]
            if len(present) == len(others):
                break
            time.sleep(0.05)
        return {r: store.get(_NOTE_KEY.format(r)).decode() for r in present}
    except Exception:  # the store itself is gone: say what this rank knows
        return {}
