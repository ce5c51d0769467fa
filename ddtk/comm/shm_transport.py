"""The shared-memory transport: point-to-point messages between ranks of one host.

:class:`ShmTransport` has the same ``isend``/``irecv``/``Work`` interface as
:class:`~ddtk.comm.transport.Transport`, so every algorithm (``ring.py``,
``tree.py``...) runs on it unchanged. It is what NCCL's SHM transport is to its
socket transport: inside a host, bytes move by ``memcpy`` through a ring buffer
in ``/dev/shm`` instead of through the kernel's TCP stack.

How a message moves (see :mod:`ddtk.comm.shm` for the layout):

* ``isend`` writes a header (tag, size) and as much of the payload as fits
  into the ring to the peer, at once. What does not fit waits in a queue and
  is written as the receiver frees room: large messages stream through the ring
  in pieces of up to :data:`PIECE` bytes, so the receiver copies one piece out
  while the sender copies the next one in.
* Messages of :data:`DIRECT_MIN` bytes or more skip the ring: the sender
  writes only a record with the payload's address, and the receiver copies the
  bytes straight from the sender's memory into its tensor (``process_vm_readv``,
  one copy instead of two), then acknowledges; the send completes at the ack.
  Where the system forbids reading another process (tested when connecting) or
  :data:`DIRECT_ENV` ``=off``, large messages stream through the ring instead.
* ``irecv`` posts the destination tensor. Bytes are copied from the ring
  straight into it. A message that arrives before its receive is posted is
  copied into a private buffer, so the sender is never blocked by it.
* Progress is made by whoever waits: ``Work.wait`` pushes this rank's queued
  sends and drains every incoming ring until its own operation is done. It
  spins briefly (a message from a busy peer usually arrives within
  microseconds), then sleeps on a futex that the peers ring only when this
  rank sleeps; with more ranks than cores it yields the core while spinning.
* Failures: a peer that exits or is killed is seen within
  :data:`LIVENESS_S` seconds as :class:`~ddtk.comm.transport.PeerLostError`;
  a peer that is alive but sends nothing for ``op_timeout`` seconds gives
  :class:`~ddtk.comm.transport.CollectiveTimeoutError`. Both name the
  operation, this rank and the peer, as on the TCP transport.

Ranks on other hosts are reached through the parent class (gloo over TCP).
Messages of user tags (``ctx.send``/``ctx.recv``) then go through gloo too, so
that a receive from any source has one place to look.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import time
from collections import deque
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ddtk.comm import shm
from ddtk.comm.stats import CommStats
from ddtk.comm.transport import USER_TAG_LIMIT, Transport, Work, _Done

PIECE = 512 << 10
"""Largest copy between two publications of a ring position: small enough that
the receiver starts copying a large message out while the rest is still coming in."""
SPIN_S = 500e-6
"""How long a waiting rank polls the rings before it sleeps on its doorbell: a futex
wake-up costs tens of microseconds, more than most waits between busy peers."""
DIRECT_MIN = 256 << 10
"""Messages from this size on are read by the receiver straight out of the sender's
memory (one copy, ``process_vm_readv``) instead of passing through the ring (two)."""
DIRECT_ENV = "DDTK_SHM_DIRECT"
_DIRECT = 1  # record kind: the payload stays in the sender, the record holds its address
BACKGROUND_SPIN_S = 50e-6
"""The same, for a thread that is not the main thread (it would steal the main thread's
core) and for ranks that outnumber the cores (a spinning rank holds a core its peer needs)."""
LIVENESS_S = 0.05
"""How often a sleeping rank checks that the peer it waits for is still alive."""
MAX_SLEEP_S = 0.02

_DONE = _Done()
_QUICK_POLLS = 16
_generation = 0


class _Op:
    """One send or receive in flight: where its bytes are, and how many of them have moved."""

    __slots__ = ("addr", "direct", "done", "end", "keep", "nbytes", "peer", "pos", "seq",
                 "started", "tag")  # fmt: skip

    def __init__(self, peer: int | None, tag: int, tensor: torch.Tensor):
        self.peer, self.tag, self.keep = peer, tag, tensor  # ``keep``: the memory stays alive
        self.addr, self.nbytes, self.pos = tensor.data_ptr(), tensor.nbytes, 0
        self.started = self.done = False
        self.end = 0  # ring position after the message: it is received once the reader is there
        self.direct, self.seq = False, 0  # read from this process's memory; its number on the ring


class _Ring:
    """This rank's end of one ring buffer: positions, queued sends or the message being read."""

    __slots__ = ("a_at", "acked", "addr", "cap", "current", "direct", "local", "pos", "queue",
                 "r_at", "sent", "w_at", "words")  # fmt: skip

    def __init__(self, seg: shm.Segment, src: int, dst: int, local: int):
        base = seg.layout.channel(src, dst)
        self.cap = seg.layout.capacity
        self.addr = seg.address(base + shm.CHANNEL_HEADER)  # first data byte
        self.words = (base + shm.CHANNEL_HEADER) // 8  # the same, as an int64 index
        self.w_at, self.r_at = base // 8 + shm._CH_WRITE, base // 8 + shm._CH_READ
        self.a_at = base // 8 + shm._CH_ACK  # direct messages the reader has finished
        self.pos = 0  # own position: written (sender end) or read (receiver end)
        self.sent = self.acked = 0  # direct messages sent (sender end) or finished (receiver end)
        self.direct: deque[_Op] = deque()  # direct sends waiting for the reader's ack
        self.local = local  # the peer's local index, for its doorbell
        self.queue: deque[_Op] = deque()
        self.current: _Op | None = None


def _checked(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself, if the shared-memory transport can move its bytes."""
    if not tensor.is_cpu:  # not ``device.type``: that builds a device object per message
        raise ValueError(f"the shared-memory transport moves CPU tensors, got {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError("the shared-memory transport sends and receives contiguous tensors only")
    return tensor


class _ShmWork:
    """A send or receive on the shared-memory transport; ``wait`` drives the progress."""

    __slots__ = ("_comm", "_op", "_opname", "_seq")

    def __init__(self, comm: ShmTransport, op: _Op):
        self._comm, self._op = comm, op
        self._opname, self._seq = comm.op, comm.seq

    def wait(self, timeout: Any = None) -> bool:
        op, comm = self._op, self._comm
        for _ in range(_QUICK_POLLS):  # most waits end within a few polls: skip the set-up
            if op.done:
                return True
            comm.progress()
        if not op.done:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
            comm.progress_until(op, seconds, self._opname, self._seq)
        return True

    def is_completed(self) -> bool:
        return self._op.done

    def _source_rank(self) -> int:
        return int(self._op.peer)


class _Remote:
    """A gloo work to a rank on another host, waited for without starving the local rings."""

    __slots__ = ("_comm", "_work")

    def __init__(self, comm: ShmTransport, work: Work):
        self._comm, self._work = comm, work

    def wait(self, timeout: Any = None) -> Any:
        if timeout is None and self._comm.has_queued_sends():
            while not self._work.is_completed() and self._comm.has_queued_sends():
                if not self._comm.progress():
                    time.sleep(20e-6)
        return self._work.wait() if timeout is None else self._work.wait(timeout)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def _source_rank(self) -> int:
        return self._work._source_rank()


class ShmTransport(Transport):
    """Shared memory to the ranks of this host, the parent's gloo path to the others."""

    name = "shm"

    def __init__(
        self,
        rank: int,
        world_size: int,
        device: torch.device,
        stats: CommStats,
        op_timeout: float | None,
        segment: shm.Segment,
        local_ranks: list[int],
    ):
        super().__init__(rank, world_size, device, stats, op_timeout)
        self.seg, self.local_ranks = segment, local_ranks
        self.hybrid = len(local_ranks) < world_size
        me = local_ranks.index(rank)
        self._me = me
        layout = segment.layout
        self._out = {r: _Ring(segment, me, j, j) for j, r in enumerate(local_ranks) if r != rank}
        self._in = {r: _Ring(segment, j, me, j) for j, r in enumerate(local_ranks) if r != rank}
        self._ins = list(self._in.items())
        self._busy: list[_Ring] = []  # sender ends with queued sends
        self._user_sent: list[_Op] = []  # ctx.send messages not known to be received yet
        self._posted: dict[tuple[int, int], deque[_Op]] = {}
        self._any: dict[int, deque[_Op]] = {}
        self._unexpected: dict[tuple[int, int], deque[_Op]] = {}
        self._db = [layout.slot(j) // 4 for j in range(len(local_ranks))]  # doorbell int32 index
        self._sleep = [i + 1 for i in self._db]
        self._pids = [
            segment.q[layout.slot(j) // 8 + shm._SLOT_PID] for j in range(len(local_ranks))
        ]
        self._my_db_addr = segment.address(layout.slot(me))
        self._yield = len(local_ranks) > (os.cpu_count() or 1)
        self._waiting_ack: list[_Ring] = []  # sender ends with direct sends not yet acked
        reads = [segment.q[layout.slot(j) // 8 + shm._SLOT_DIRECT] for j in range(len(local_ranks))]
        self._direct_to = {r: bool(reads[j]) for j, r in enumerate(local_ranks) if r != rank}
        self.phase = ""

    # -- routing ---------------------------------------------------------------------
    def _local(self, peer: int | None, tag: int) -> bool:
        if self.hybrid and tag < USER_TAG_LIMIT:
            return False  # user messages take one path when the group spans hosts
        return peer in self._out or (peer is None and not self.hybrid)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        if tensor.numel() == 0:
            return _DONE
        if not self._local(dst, tag):
            return self._remote(super().isend(tensor, dst, tag))
        ring = self._out[dst]
        small = not ring.queue and tag >= USER_TAG_LIMIT and tensor.nbytes < DIRECT_MIN
        # The common case, a small message to an idle ring: written at once, no bookkeeping.
        if small and self._write_now(ring, tag, _checked(tensor)):
            self.stats.record_send(tensor.nbytes)
            return _DONE
        op = _Op(dst, tag, _checked(tensor))
        op.direct = op.nbytes >= DIRECT_MIN and self._direct_to[dst]
        self.stats.record_send(op.nbytes)
        if tag < USER_TAG_LIMIT:  # remembered until received, for :meth:`undelivered`
            if len(self._user_sent) >= 1024:
                self._prune_user_sent()
            self._user_sent.append(op)
        ring.queue.append(op)
        if len(ring.queue) == 1:
            self._busy.append(ring)
            self._push(ring)
        return _DONE if op.done else _ShmWork(self, op)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        if tensor.numel() == 0:
            return _DONE
        if not self._local(src, tag):
            return self._remote(super().irecv(tensor, src, tag))
        op = _Op(src, tag, _checked(tensor))
        self.stats.record_recv(op.nbytes)
        early = self._unexpected.get((src, tag))
        if early:
            self._adopt(early.popleft(), op)
            if not early:
                del self._unexpected[(src, tag)]
        else:
            self._posted.setdefault((src, tag), deque()).append(op)
        return _DONE if op.done else _ShmWork(self, op)

    def _recv_header(self, header: torch.Tensor, src: int | None, tag: int) -> int:
        if not self._local(src, tag):
            return super()._recv_header(header, src, tag)
        if src is not None:
            self.irecv(header, src, tag).wait()
            return src
        op = _Op(None, tag, _checked(header))
        self.stats.record_recv(op.nbytes)
        early = next(((k, q) for k, q in self._unexpected.items() if k[1] == tag and q), None)
        if early is not None:
            self._adopt(early[1].popleft(), op)
            if not early[1]:
                del self._unexpected[early[0]]
        else:
            self._any.setdefault(tag, deque()).append(op)
        if not op.done:
            self.progress_until(op, None, self.op, self.seq)
        return int(op.peer)

    def _remote(self, work: Work) -> Work:
        return _Remote(self, work)

    def has_queued_sends(self) -> bool:
        return bool(self._busy)

    # -- moving bytes ----------------------------------------------------------------
    def _push(self, ring: _Ring) -> bool:
        """Write queued sends into the ring as far as there is room; True if anything moved."""
        q, cap = self.seg.q, ring.cap
        free = cap - (ring.pos - q[ring.r_at])
        moved = False
        while ring.queue:
            op = ring.queue[0]
            if not op.started:
                if free < shm.HEADER + (0 if op.direct else min(op.nbytes, shm.ALIGN)):
                    break
                head = ring.words + (ring.pos % cap) // 8
                q[head], q[head + 1] = op.tag, op.nbytes
                ring.pos += shm.HEADER
                free -= shm.HEADER
                op.started = True
                if op.direct:  # the reader copies the payload out of this process itself
                    q[head + 2], q[head + 3] = _DIRECT, op.addr
                    ring.sent += 1
                    op.seq, op.end, op.pos = ring.sent, ring.pos, op.nbytes
                    ring.queue.popleft()
                    ring.direct.append(op)
                    if ring not in self._waiting_ack:
                        self._waiting_ack.append(ring)
                    q[ring.w_at] = ring.pos
                    moved = True
                    continue
                q[head + 2] = 0
            n = min(op.nbytes - op.pos, free, PIECE)
            if n <= 0:
                break
            _copy_in(ring, op.addr + op.pos, n)
            ring.pos += n
            op.pos += n
            free -= n
            moved = True
            if op.pos == op.nbytes:
                ring.pos = op.end = shm.align(ring.pos)
                free = cap - (ring.pos - q[ring.r_at])
                op.done = True
                op.keep = None
                ring.queue.popleft()
            q[ring.w_at] = ring.pos
        if moved:
            self._ring_doorbell(ring.local)
        if not ring.queue and ring in self._busy:
            self._busy.remove(ring)
        return moved

    def _write_now(self, ring: _Ring, tag: int, tensor: torch.Tensor) -> bool:
        """Write a whole small message into an idle ring at once, if it fits; True if it did."""
        q, cap, nbytes = self.seg.q, ring.cap, tensor.nbytes
        if cap - (ring.pos - q[ring.r_at]) < shm.HEADER + nbytes:
            return False
        head = ring.words + (ring.pos % cap) // 8
        q[head], q[head + 1], q[head + 2] = tag, nbytes, 0
        ring.pos += shm.HEADER
        _copy_in(ring, tensor.data_ptr(), nbytes)
        ring.pos = shm.align(ring.pos + nbytes)
        q[ring.w_at] = ring.pos
        self._ring_doorbell(ring.local)
        return True

    def _pull(self, src: int, ring: _Ring) -> bool:
        """Copy what has arrived from ``src`` into the posted receives (or private buffers)."""
        q, cap = self.seg.q, ring.cap
        avail = q[ring.w_at] - ring.pos
        moved = False
        while avail > 0:
            op = ring.current
            if op is None:
                if avail < shm.HEADER:
                    break
                head = ring.words + (ring.pos % cap) // 8
                ring.pos += shm.HEADER
                avail -= shm.HEADER
                op = ring.current = self._match(src, q[head], q[head + 1])
                if q[head + 2] == _DIRECT:
                    self._read_direct(src, ring, op, q[head + 3])
                    moved = True
                    continue
            n = min(avail, op.nbytes - op.pos)
            _copy_out(ring, op.addr + op.pos, n)
            ring.pos += n
            op.pos += n
            avail -= n
            moved = True
            if op.pos == op.nbytes:
                end = shm.align(ring.pos)
                avail -= end - ring.pos
                ring.pos = end
                op.done = True
                ring.current = None
            q[ring.r_at] = ring.pos
            if avail <= 0:
                avail = q[ring.w_at] - ring.pos
        if moved:
            self._ring_doorbell(ring.local)
        return moved

    def _read_direct(self, src: int, ring: _Ring, op: _Op, remote: int) -> None:
        """Copy a direct message out of the sender's memory into ``op``, then acknowledge it."""
        try:
            shm.read_peer(self._pids[ring.local], op.addr, remote, op.nbytes)
        except OSError as exc:
            raise self.failure(
                self.op,
                self.seq,
                [src],
                RuntimeError(f"rank {src} could not be read ({exc}); it has probably exited"),
                self.phase,
            ) from exc
        op.pos, op.done = op.nbytes, True
        ring.current = None
        ring.acked += 1
        q = self.seg.q
        q[ring.r_at] = ring.pos
        q[ring.a_at] = ring.acked

    def _check_acks(self) -> bool:
        """Complete the direct sends whose readers have acknowledged them."""
        q, moved = self.seg.q, False
        for ring in list(self._waiting_ack):
            acked = q[ring.a_at]
            while ring.direct and ring.direct[0].seq <= acked:
                op = ring.direct.popleft()
                op.done, op.keep = True, None
                moved = True
            if not ring.direct:
                self._waiting_ack.remove(ring)
        return moved

    def _match(self, src: int, tag: int, nbytes: int) -> _Op:
        """The receive an arriving message goes to: posted for (src, tag), any-source, or a new buffer."""
        for table, key in ((self._posted, (src, tag)), (self._any, tag)):
            waiting = table.get(key)
            if waiting:
                op = waiting.popleft()
                if not waiting:
                    del table[key]
                op.peer = src
                if op.nbytes != nbytes:
                    raise self._size_error(src, tag, nbytes, op.nbytes)
                return op
        op = _Op(src, tag, torch.empty(nbytes, dtype=torch.uint8))
        self._unexpected.setdefault((src, tag), deque()).append(op)
        return op

    def _adopt(self, early: _Op, op: _Op) -> None:
        """Hand a message that arrived before its receive over to that receive."""
        if early.nbytes != op.nbytes:
            raise self._size_error(early.peer, early.tag, early.nbytes, op.nbytes)
        op.peer = early.peer
        ctypes.memmove(op.addr, early.addr, early.pos)
        op.pos, op.done = early.pos, early.done
        ring = self._in[early.peer]
        if ring.current is early:  # still arriving: the rest goes straight to the receive
            ring.current = op

    def _size_error(self, src: int, tag: int, got: int, want: int) -> RuntimeError:
        return RuntimeError(
            f"rank {self.rank}: a message of {got} bytes from rank {src} (tag {tag}) met a "
            f"receive of {want} bytes: the ranks disagree about what they exchange"
        )

    def _ring_doorbell(self, local: int) -> None:
        i = self.seg.i
        i[self._db[local]] = (i[self._db[local]] + 1) & 0x7FFFFFFF
        if i[self._sleep[local]]:
            shm.futex_wake(self.seg.address(self._db[local] * 4))

    def progress(self) -> bool:
        """One pass over every ring: push queued sends, drain arrivals. True if anything moved."""
        moved = False
        if self._busy:
            for ring in list(self._busy):
                moved |= self._push(ring)
        for src, ring in self._ins:
            moved |= self._pull(src, ring)
        if self._waiting_ack:
            moved |= self._check_acks()
        return moved

    def progress_until(self, op: _Op, timeout: float | None, opname: str, seq: int) -> None:
        """Make progress until ``op`` is done; spin, then sleep; raise on a dead or silent peer."""
        idle_since = time.monotonic()
        limit = self.op_timeout_s if timeout is None else timeout
        spins, nap, next_check = 0, 1e-4, 0.0
        i, me = self.seg.i, self._me
        # A background thread (DataParallel's communication thread) shares its core
        # with the computing main thread: it spins briefly and yields while it does.
        background = threading.current_thread() is not threading.main_thread()
        polite = self._yield or background
        spin = BACKGROUND_SPIN_S if polite else SPIN_S
        spin_until = time.perf_counter() + spin
        while not op.done:
            if self.progress():
                spins, nap = 0, 1e-4
                idle_since = time.monotonic()
                spin_until = time.perf_counter() + spin
                continue
            spins += 1
            if spins & 31 or time.perf_counter() < spin_until:
                if polite:
                    os.sched_yield()
                continue
            bell = i[self._db[me]]
            i[self._sleep[me]] = 1
            if not self.progress() and not op.done:
                shm.futex_wait(self._my_db_addr, bell, nap)
                nap = min(nap * 2, MAX_SLEEP_S)
            i[self._sleep[me]] = 0
            now = time.monotonic()
            if now >= next_check:
                next_check = now + LIVENESS_S
                self._check_peer(op, opname, seq)
                if limit is not None and now - idle_since > limit:
                    self._give_up(op, opname, seq, timeout is not None)

    def _check_peer(self, op: _Op, opname: str, seq: int) -> None:
        """Raise PeerLostError if the peer ``op`` waits for has exited (after draining its ring)."""
        peers = [op.peer] if op.peer is not None else list(self._in)
        gone = {p: self._gone(p) for p in peers}
        if not all(gone.values()) or self.progress() or op.done:
            return  # a live peer, or the dead one's last bytes were still in the ring
        peer = peers[0]
        cause = RuntimeError(
            f"rank {peer} (process {self._pids[self.local_ranks.index(peer)]}) {gone[peer]} "
            "(shared-memory transport)"
        )
        raise self.failure(opname, seq, [op.peer] if op.peer is not None else [], cause, self.phase)

    def _gone(self, peer: int) -> str:
        """Why ``peer`` will send nothing more ("exited", "closed its transport"), or ""."""
        j = self.local_ranks.index(peer)
        if self.seg.q[self.seg.layout.slot(j) // 8 + shm._SLOT_STATE] == shm.STATE_CLOSED:
            return "closed its transport"
        return "" if shm.pid_alive(self._pids[j]) else "exited"

    def _give_up(self, op: _Op, opname: str, seq: int, explicit: bool) -> None:
        cause = RuntimeError(
            f"shared-memory {'send' if self._is_send(op) else 'receive'} timed out "
            f"({op.pos} of {op.nbytes} bytes moved)"
        )
        if explicit:  # a caller's own timeout (ctx.flush): a plain error, no diagnosis
            raise cause
        raise self.failure(opname, seq, [op.peer] if op.peer is not None else [], cause, self.phase)

    def undelivered(self, timeout: float | None) -> list[tuple[int, int]]:
        """(dst, tag) of user messages still unread by their receiver after ``timeout`` seconds.

        A send completes once its bytes are in the ring; this is what tells
        "delivered" from "written", as gloo's send completion does.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for ring in list(self._busy):  # push only: what arrives here stays unread
                self._push(ring)
            self._check_acks()
            self._prune_user_sent()
            if not self._user_sent or (deadline is not None and time.monotonic() > deadline):
                return [(op.peer, op.tag) for op in self._user_sent]
            time.sleep(0.001)

    def _prune_user_sent(self) -> None:
        q = self.seg.q
        self._user_sent = [
            op for op in self._user_sent if not op.done or q[self._out[op.peer].r_at] < op.end
        ]

    def _is_send(self, op: _Op) -> bool:
        """True if ``op`` is one of this rank's sends (queued, or direct and waiting for its ack)."""
        return any(op in ring.queue or op in ring.direct for ring in self._out.values())

    def close(self) -> None:
        """Tell the peers this rank is gone (they stop waiting for it) and unmap the segment."""
        slot = self.seg.layout.slot(self._me) // 8
        self.seg.q[slot + shm._SLOT_STATE] = shm.STATE_CLOSED
        for j in range(len(self.local_ranks)):
            if j != self._me:
                self._ring_doorbell(j)


def _copy_in(ring: _Ring, addr: int, n: int) -> None:
    """Copy ``n`` bytes from ``addr`` into the ring at its write position (wrapping around)."""
    start = ring.pos % ring.cap
    first = min(n, ring.cap - start)
    ctypes.memmove(ring.addr + start, addr, first)
    if first < n:
        ctypes.memmove(ring.addr, addr + first, n - first)


def _copy_out(ring: _Ring, addr: int, n: int) -> None:
    """Copy ``n`` bytes from the ring at its read position to ``addr`` (wrapping around)."""
    start = ring.pos % ring.cap
    first = min(n, ring.cap - start)
    ctypes.memmove(addr, ring.addr + start, first)
    if first < n:
        ctypes.memmove(addr + first, ring.addr, n - first)


# -- connecting ----------------------------------------------------------------------------
def host_key() -> str:
    """What ranks that can share ``/dev/shm`` have in common: host, boot and the tmpfs mount."""
    override = os.environ.get("DDTK_HOST_ID")
    if override:
        return override
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}/{os.stat(shm.SHM_DIR).st_dev}"


def connect(
    rank: int,
    world_size: int,
    device: torch.device,
    stats: CommStats,
    op_timeout: float | None,
    store: Any,
    timeout: float = 300.0,
) -> ShmTransport | None:
    """Set up shared memory among the ranks of each host (every rank calls it, in the same order).

    Returns None when this rank is alone on its host. The lowest rank of each
    host creates the segment, the others map it, and once all have, it is unlinked.
    """
    global _generation
    _generation += 1
    # A restarted group may meet the keys of its previous attempt in the same store.
    key = f"ddtk/shm/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{_generation}"
    store.set(f"{key}/host/{rank}", host_key())
    hosts = [store.get(f"{key}/host/{r}").decode() for r in range(world_size)]
    local = [r for r in range(world_size) if hosts[r] == hosts[rank]]
    if len(local) == 1:
        return None  # alone on its host: everything goes through gloo
    leader = local[0]
    if rank == leader:
        shm.sweep_stale()
        try:
            seg = shm.Segment.create(len(local), shm.capacity_from_env(len(local)))
        except OSError as exc:
            store.set(f"{key}/path/{leader}", f"!{exc}")
            raise
        store.set(f"{key}/path/{leader}", str(seg.path))
    else:
        path = store.get(f"{key}/path/{leader}").decode()
        if path.startswith("!"):
            raise OSError(f"rank {leader} could not create the shared-memory segment: {path[1:]}")
        seg = shm.Segment.open(Path(path))
    try:
        me = local.index(rank)
        slot = seg.layout.slot(me) // 8
        seg.q[slot + shm._SLOT_PID] = os.getpid()
        seg.q[slot + shm._SLOT_STATE] = shm.STATE_OPEN
        probe = ctypes.c_int64(os.getpid())  # what the peers read to test direct reads
        seg.q[slot + shm._SLOT_PROBE] = ctypes.addressof(probe)
        _prefault(seg, me)
        _store_barrier(store, f"{key}/mapped/{leader}", len(local), timeout, rank)
        seg.q[slot + shm._SLOT_DIRECT] = int(_can_read_peers(seg, me))
        _store_barrier(store, f"{key}/probed/{leader}", len(local), timeout, rank)
    finally:  # every rank unlinks, so none goes on while the file still exists
        seg.unlink()
    return ShmTransport(rank, world_size, device, stats, op_timeout, seg, local)


def _store_barrier(store: Any, key: str, count: int, timeout: float, rank: int) -> None:
    """Wait until ``count`` ranks of this host have reached ``key``."""
    store.add(key, 1)
    deadline = time.monotonic() + timeout
    while store.add(key, 0) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"rank {rank}: not every rank of this host set up the shared memory in {timeout} s"
            )
        time.sleep(0.001)


def _can_read_peers(seg: shm.Segment, me: int) -> bool:
    """True if this rank can read every local peer's memory (``process_vm_readv``).

    Containers may forbid it (seccomp, ptrace rules), and :data:`DIRECT_ENV` ``=off``
    turns it off: large messages then pass through the ring like small ones.
    """
    if os.environ.get(DIRECT_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return False
    layout, got = seg.layout, ctypes.c_int64(0)
    for j in range(layout.local_size):
        if j == me:
            continue
        pid = seg.q[layout.slot(j) // 8 + shm._SLOT_PID]
        try:
            shm.read_peer(
                pid, ctypes.addressof(got), seg.q[layout.slot(j) // 8 + shm._SLOT_PROBE], 8
            )
        except OSError:
            return False
        if got.value != pid:
            return False
    return True


def _prefault(seg: shm.Segment, me: int) -> None:
    """Touch the pages of this rank's incoming rings now, not during the first collective."""
    layout = seg.layout
    for src in range(layout.local_size):
        if src != me:
            start = layout.channel(src, me) + shm.CHANNEL_HEADER
            np.frombuffer(seg.mm, np.uint8, layout.capacity, start)[::4096] = 0
