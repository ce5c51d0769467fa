"""DistributedContext: what each rank holds to talk to the others.

It wraps an initialised ``torch.distributed`` process group and offers
point-to-point messages and the collectives, each implemented in its own module
from point-to-point sends and receives (``ring.py``, ``tree.py``...). It checks
its arguments, validates that all ranks agree (see :mod:`ddtk.comm.validation`),
times every collective into :attr:`stats`, and never modifies its inputs.

Results live on :attr:`device` (``cpu`` with gloo, ``cuda:<local rank>`` with NCCL).

The point-to-point messages go through a *transport* (:attr:`transport`):
``"shm"``, shared-memory rings between the ranks of a host
(:mod:`ddtk.comm.shm_transport`), or ``"tcp"``, the process group's own
point-to-point (gloo's sockets, or NCCL). See :func:`check_transport`.

``op_timeout`` (seconds) turns a hang into an error: a receive or collective
that makes no progress for that long raises :class:`CollectiveTimeoutError`
naming the collective, this rank and the rank(s) it waited for; a peer that dies
mid-way gives :class:`PeerLostError`. After either, the group is broken (gloo
closes the connection): end the run and resume from the last checkpoint.

It is on by default: :data:`DEFAULT_OP_TIMEOUT` (300 s) unless the
``DDTK_OP_TIMEOUT`` environment variable or the ``op_timeout`` argument says
otherwise; ``DDTK_OP_TIMEOUT=off`` (or ``0``, or ``op_timeout=0``) turns it off.
Five minutes is far longer than any single send or receive of this kit takes,
and shorter than torch's own process-group timeout (10 minutes for NCCL), so a
hung peer is named by ddtk before torch's watchdog reports it without a name.
A program in which one rank legitimately works alone for longer (a long
evaluation on rank 0 while the others wait in a collective) should raise it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ddtk.comm import all_to_all as _all_to_all
from ddtk.comm import barrier as _barrier
from ddtk.comm import (
    hierarchical,
    hierarchical_rs,
    naive,
    recursive_doubling,
    reference,
    ring,
    tree,
)
from ddtk.comm import validation as _validation
from ddtk.comm.ops import ReduceOp, check_op_dtype
from ddtk.comm.stats import CommStats
from ddtk.comm.transport import (
    DTYPE_CODE,
    DTYPES,
    USER_TAG_LIMIT,
    CommunicationError,
    Message,
    Transport,
    Work,
    _default_store,
)

OP_TIMEOUT_ENV = "DDTK_OP_TIMEOUT"
TRANSPORT_ENV = "DDTK_TRANSPORT"
TRANSPORTS: tuple[str, ...] = ("auto", "shm", "tcp")
DEFAULT_OP_TIMEOUT = 300.0
_OFF = ("off", "none", "0", "0.0")

_MAX_PENDING_SENDS = 256

ALL_REDUCE_ALGORITHMS: tuple[str, ...] = (
    "ring",
    "tree",
    "recursive_doubling",
    "naive",
    "hierarchical",
    "hierarchical_rs",
    "torch",
)
_GROUPED = ("hierarchical", "hierarchical_rs")

_P2P_ALL_REDUCE: dict[str, Callable[..., torch.Tensor]] = {
    "ring": ring.all_reduce,
    "tree": tree.all_reduce,
    "recursive_doubling": recursive_doubling.all_reduce,
    "naive": naive.all_reduce,
}


def _env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return None


def op_timeout_from_env() -> float | None:
    """The per-operation timeout in seconds: :data:`OP_TIMEOUT_ENV`, else :data:`DEFAULT_OP_TIMEOUT`.

    None means off (``DDTK_OP_TIMEOUT=off``, ``none`` or ``0``): a hung peer is then
    only caught by the launcher's own timeout. Anything else that is not a positive
    number raises ValueError naming the variable.

    >>> DEFAULT_OP_TIMEOUT
    300.0
    """
    value = os.environ.get(OP_TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_OP_TIMEOUT
    if value.lower() in _OFF:
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(
            f"{OP_TIMEOUT_ENV} must be a number of seconds or 'off', got {value!r}"
        ) from None
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{OP_TIMEOUT_ENV} must be > 0 seconds (or 'off'), got {value!r}")
    return seconds


def resolve_backend(backend: str, local_world_size: int) -> str:
    """Turn ``"auto"`` into ``"nccl"`` (one GPU per local rank available) or ``"gloo"``; validate others."""
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"unknown backend {backend!r}; expected 'auto', 'gloo' or 'nccl'")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl_ok = gpus >= local_world_size and dist.is_nccl_available()
    if backend == "auto":
        return "nccl" if nccl_ok else "gloo"
    if backend == "nccl" and not nccl_ok:
        raise ValueError(
            f"backend='nccl' needs one CUDA GPU per local rank ({local_world_size}) and a torch "
            f"built with NCCL; this machine has {gpus} GPU(s), NCCL available: "
            f"{dist.is_nccl_available()}. Use backend='gloo' (or 'auto') to run on CPU."
        )
    return backend


class DistributedContext:
    """One rank's handle on the group: messages, collectives and statistics."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        backend: str,
        device: torch.device | str,
        validate: bool = True,
        op_timeout: float | None = None,
        transport: str | None = None,
        network: Any = None,
    ):
        transport = check_transport(transport)
        if op_timeout is None:
            op_timeout = op_timeout_from_env()
        elif isinstance(op_timeout, bool) or not isinstance(op_timeout, (int, float)):
            raise TypeError(f"op_timeout must be a number of seconds, got {op_timeout!r}")
        elif not 0 <= op_timeout < float("inf"):
            raise ValueError(
                f"op_timeout must be >= 0 seconds (0 turns it off), got {op_timeout!r}"
            )
        elif op_timeout == 0:
            op_timeout = None
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.device = torch.device(device)
        self.validate = validate
        self.op_timeout = None if op_timeout is None else float(op_timeout)
        self.stats = CommStats()
        self._comm = _make_transport(
            transport, rank, world_size, self.device, self.stats, self.op_timeout
        )
        self.transport = self._comm.name
        self.network = network  # an emulated network's links sit in front of the transport
        if network is not None:
            self._comm = network.wrap(self._comm, rank)
        if self.op_timeout is not None and dist.is_initialized():
            _set_group_timeout(self.op_timeout)  # torch's own collectives (argument check, "torch")
        self._all = list(range(world_size))
        self._pending: list[tuple[int, int, Work]] = []  # (dst, tag, work) of sends in flight
        self.reporter: Callable[[Any], None] | None = (
            None  # set by ddtk.launch: the parent's on_report
        )

    def report(self, value: Any) -> None:
        """Send ``value`` (picklable, small) to the launching process now, for live plots and progress.

        Under :func:`ddtk.launch` it reaches the ``on_report(rank, value)`` callback while
        the ranks are still running. Under other launchers (torchrun, Ray) it does nothing.
        """
        if self.reporter is not None:
            self.reporter(value)

    # -- construction ----------------------------------------------------------------
    @classmethod
    def from_env(
        cls,
        backend: str = "auto",
        validate: bool = True,
        timeout: float = 1800.0,
        op_timeout: float | None = None,
        transport: str | None = None,
        network: Any = None,
    ) -> DistributedContext:
        """Wrap the process group that a launcher set up, initialising it if needed.

        Works under ``torchrun`` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT),
        inside a Ray Train worker (the group is already initialised), under SLURM
        (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, with MASTER_ADDR/PORT exported
        by the batch script) and under :func:`ddtk.launch`. ``op_timeout`` defaults to
        ``DDTK_OP_TIMEOUT``, else 300 s; 0 turns it off (see the module docstring).
        ``transport`` (default ``DDTK_TRANSPORT``, else ``"auto"``): see :func:`check_transport`.
        ``network``: an :class:`ddtk.net.emulate.EmulatedNetwork` whose links delay every
        message of this context (all ranks must pass the same one).
        """
        local_size = _env_int("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE") or 1
        local_rank = _env_int("LOCAL_RANK", "SLURM_LOCALID") or 0
        if not dist.is_initialized():
            rank = _env_int("RANK", "SLURM_PROCID")
            world = _env_int("WORLD_SIZE", "SLURM_NTASKS")
            if rank is None or world is None:
                raise RuntimeError(
                    "DistributedContext.from_env() found no process group and no RANK/WORLD_SIZE "
                    "(or SLURM_PROCID/SLURM_NTASKS) in the environment. Start the script with "
                    "torchrun, srun or ddtk.launch, or call torch.distributed.init_process_group first."
                )
            backend = resolve_backend(backend, local_size)
            if backend == "nccl":
                torch.cuda.set_device(local_rank)
            _init_group(backend, rank, world, timeout)
        backend = dist.get_backend()
        device = (
            torch.device(f"cuda:{torch.cuda.current_device()}")
            if backend == "nccl"
            else torch.device("cpu")
        )
        return cls(
            dist.get_rank(), dist.get_world_size(), backend, device, validate, op_timeout,
            transport, network,
        )  # fmt: skip

    @property
    def is_master(self) -> bool:
        """True on rank 0, the rank that logs, plots and writes checkpoints."""
        return self.rank == 0

    def __repr__(self) -> str:
        return (
            f"DistributedContext(rank={self.rank}, world_size={self.world_size}, "
            f"backend={self.backend!r}, device={self.device}, transport={self.transport!r})"
        )

    def close(self) -> None:
        """Tell the peers this rank will send nothing more (they stop waiting for it at once)."""
        self._comm.close()

    # -- point to point --------------------------------------------------------------
    def send(self, obj: Any, dst: int, tag: int = 0) -> None:
        """Send a tensor or any picklable object to rank ``dst``.

        Returns at once: the message is copied and delivered in the background, so
        every rank may send before it receives (as in a ring) without deadlock.
        :meth:`flush` waits until every message sent so far has been delivered.
        """
        self._check_peer(dst, "dst")
        self._check_tag(tag)
        self._comm.op = "send"
        if len(self._pending) >= _MAX_PENDING_SENDS:  # bound the memory held by queued messages
            for _, _, w in self._pending[: _MAX_PENDING_SENDS // 2]:
                w.wait()
            del self._pending[: _MAX_PENDING_SENDS // 2]
        self._pending += [(dst, tag, w) for w in self._comm.send_any(obj, dst, tag)]

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every message sent with :meth:`send` has been received.

        With a ``timeout`` (seconds), raise a RuntimeError naming the messages that
        no rank received in time, instead of waiting for ever.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._pending:
            try:
                if deadline is None:
                    self._pending[0][2].wait()
                else:
                    left = max(0.001, deadline - time.monotonic())
                    self._pending[0][2].wait(timedelta(seconds=left))
            except RuntimeError:
                if deadline is None:
                    raise
                break
            self._pending.pop(0)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        lost = sorted(
            {(dst, tag) for dst, tag, _ in self._pending} | set(self._comm.undelivered(left))
        )
        if lost:
            what = ", ".join(f"to rank {d} with tag {t}" for d, t in lost)
            raise RuntimeError(
                f"rank {self.rank} finished with messages that were never received: {what}"
            )

    def recv(self, src: int | None = None, tag: int = 0) -> Message:
        """Receive the next message with ``tag`` from ``src`` (from any rank if ``src`` is None)."""
        if src is not None:
            self._check_peer(src, "src")
        elif self.backend == "nccl":
            raise ValueError(
                "recv(src=None) is not supported with NCCL, which has no receive-from-any; give src"
            )
        self._check_tag(tag)
        self._comm.op = "recv"
        return self._comm.recv_any(src, tag)

    # -- collectives -----------------------------------------------------------------
    def broadcast(self, tensor: torch.Tensor | None, root: int = 0) -> torch.Tensor:
        """Root's tensor on every rank; non-root ranks may pass None (they learn the shape from root)."""
        self._check_root(root)
        if self.rank == root:
            self._check_tensor(tensor, "broadcast")
        with self._collective("broadcast", None, root=root):
            tag = self._comm.tag_block()
            if self.world_size == 1:
                return tensor.detach().to(self.device, copy=True)  # type: ignore[union-attr]
            if self.rank == root:
                meta = torch.tensor(list(tensor.shape), dtype=torch.int64)  # type: ignore[union-attr]
                _send_meta(self, meta, tensor.dtype, root, tag)  # type: ignore[union-attr]
                buf = tensor.detach().to(self.device, copy=True).contiguous()  # type: ignore[union-attr]
            else:
                buf = _recv_meta(self, root, tag)
            return tree.broadcast_(self._comm, self._all, buf, root, tag + 2)

    def scatter(
        self, chunks: Sequence[torch.Tensor] | torch.Tensor | None, root: int = 0
    ) -> torch.Tensor:
        """Rank i gets ``chunks[i]`` from root. A tensor is split along dim 0 like ``torch.tensor_split``."""
        self._check_root(root)
        if self.rank == root:
            chunks = self._scatter_chunks(chunks)
        with self._collective("scatter", None, root=root):
            return naive.scatter(self._comm, self._all, chunks, root)  # type: ignore[arg-type]

    def gather(self, tensor: torch.Tensor, root: int = 0) -> list[torch.Tensor] | None:
        """Every rank's tensor, in rank order, on root; None elsewhere. Shapes may differ."""
        self._check_root(root)
        self._check_tensor(tensor, "gather")
        with self._collective("gather", None, root=root):
            return naive.gather(self._comm, self._all, tensor, root)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's tensor, in rank order, on every rank (ring). Shapes must match."""
        self._check_tensor(tensor, "all_gather")
        with self._collective("all_gather", tensor):
            return ring.all_gather(self._comm, self._all, tensor)

    def all_to_all(self, chunks: Sequence[torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
        """Send ``chunks[j]`` to rank ``j``; return the chunk every rank sent here, in rank order.

        ``chunks`` is a list of ``world_size`` tensors (shapes and dtypes may differ, as
        tokens per expert do in a mixture-of-experts layer) or one tensor, split along
        dim 0 like ``torch.tensor_split``. See :mod:`ddtk.comm.all_to_all`.
        """
        parts = self._split_chunks(chunks, "all_to_all")
        with self._collective("all_to_all", None):
            return _all_to_all.all_to_all(self._comm, self._all, parts)

    def reduce(
        self, tensor: torch.Tensor, root: int = 0, op: ReduceOp | str = ReduceOp.SUM
    ) -> torch.Tensor | None:
        """The reduction of every rank's tensor on root (binomial tree); None elsewhere."""
        self._check_root(root)
        op = self._check_reduction(tensor, op, "reduce")
        with self._collective("reduce", tensor, op=op, root=root):
            return tree.reduce(self._comm, self._all, tensor, op, root)

    def reduce_scatter(
        self, tensor: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM
    ) -> torch.Tensor:
        """Reduce every rank's tensor and return this rank's part of dim 0 (``torch.tensor_split`` parts)."""
        op = self._check_reduction(tensor, op, "reduce_scatter")
        if tensor.dim() == 0:
            raise ValueError(
                "reduce_scatter needs a tensor with at least one dimension to split along dim 0"
            )
        with self._collective("reduce_scatter", tensor, op=op):
            return ring.reduce_scatter(self._comm, self._all, tensor, op)

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp | str = ReduceOp.SUM,
        algorithm: str = "ring",
        group_size: int | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The reduction of every rank's tensor, on every rank, by the chosen algorithm.

        ``algorithm`` is one of :data:`ALL_REDUCE_ALGORITHMS`; ``group_size`` sets
        the group size of ``"hierarchical"`` (reduce to a leader, leaders' ring,
        broadcast) and ``"hierarchical_rs"`` (group reduce-scatter, all-reduce of each
        shard across groups, group all-gather), by default about sqrt(world_size).
        ``out`` receives the result instead of a new tensor (same shape and dtype,
        contiguous, on :attr:`device`; ``out=tensor`` reduces in place, as
        ``torch.distributed.all_reduce`` does). The ring writes straight into it.
        """
        op = self._check_reduction(tensor, op, "all_reduce")
        if algorithm not in ALL_REDUCE_ALGORITHMS:
            raise ValueError(
                f"unknown all_reduce algorithm {algorithm!r}; expected one of {', '.join(ALL_REDUCE_ALGORITHMS)}"
            )
        if group_size is not None and (algorithm not in _GROUPED or group_size < 1):
            raise ValueError(
                "group_size is a positive integer and only applies to algorithm='hierarchical'"
                " or 'hierarchical_rs'"
            )
        if out is not None:
            self._check_out(out, tensor)
        extra = {"group_size": group_size} if algorithm in _GROUPED else {}
        with self._collective("all_reduce", tensor, op=op, algorithm=algorithm, **extra):
            if algorithm == "ring":
                return ring.all_reduce(self._comm, self._all, tensor, op, out=out)
            if algorithm == "torch":
                with self._watched("torch.distributed.all_reduce"):
                    result = reference.all_reduce(
                        tensor, op, self.world_size, self.device, self.backend
                    )
            elif algorithm == "hierarchical":
                result = hierarchical.all_reduce(self._comm, self._all, tensor, op, group_size)
            elif algorithm == "hierarchical_rs":
                result = hierarchical_rs.all_reduce(self._comm, self._all, tensor, op, group_size)
            else:
                result = _P2P_ALL_REDUCE[algorithm](self._comm, self._all, tensor, op)
            return result if out is None else out.copy_(result)

    def _check_out(self, out: Any, tensor: torch.Tensor) -> None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != tensor.shape or out.dtype != tensor.dtype:
            raise ValueError(
                f"out must match the input: got {tuple(out.shape)} {out.dtype}, "
                f"need {tuple(tensor.shape)} {tensor.dtype}"
            )
        if not out.is_contiguous() or out.device != self.device:
            raise ValueError(f"out must be a contiguous tensor on {self.device}")

    def ring_all_reduce(
        self, tensor: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM
    ) -> torch.Tensor:
        """Shorthand for ``all_reduce(tensor, op, algorithm="ring")``."""
        return self.all_reduce(tensor, op, algorithm="ring")

    def barrier(self) -> None:
        """Return only when every rank has called barrier (dissemination algorithm)."""
        with self._collective("barrier", None):
            _barrier.barrier(self._comm, self._all)

    # -- helpers ---------------------------------------------------------------------
    def _collective(self, name: str, tensor: torch.Tensor | None, **fields: Any):
        """Validate agreement across ranks, then time the collective into stats."""
        label = f"{name}[{fields['algorithm']}]" if "algorithm" in fields else name
        self._comm.op = label  # names the operation in timeout errors
        self._comm.seq += 1
        if self.validate:
            desc: dict[str, Any] = {
                "collective": name,
                **{k: (v.name if isinstance(v, ReduceOp) else v) for k, v in fields.items()},
            }
            if tensor is not None:
                desc.update(dtype=str(tensor.dtype), shape=tuple(tensor.shape))
            with self._watched("argument check"):
                _validation.check(desc, self.world_size, self.device, self._gather_fingerprints)
        return self.stats.timed(label)

    def _gather_fingerprints(self, mine: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's fingerprint, through this context's transport (one ring all-gather)."""
        if self.transport == "tcp":
            everyone = [torch.empty_like(mine) for _ in range(self.world_size)]
            dist.all_gather(everyone, mine)
            return everyone
        counted = (self.stats.bytes_sent, self.stats.bytes_received,
                   self.stats.messages_sent, self.stats.messages_received)  # fmt: skip
        self._comm.phase = "argument check"
        try:
            return ring.all_gather(self._comm, self._all, mine)
        finally:  # the check is not the collective's traffic: stats count what gloo's did not
            self._comm.phase = ""
            (self.stats.bytes_sent, self.stats.bytes_received,
             self.stats.messages_sent, self.stats.messages_received) = counted  # fmt: skip

    @contextlib.contextmanager
    def _watched(self, phase: str) -> Iterator[None]:
        """Turn a torch.distributed failure inside the block into a CommunicationError (with op_timeout)."""
        try:
            yield
        except (CommunicationError, _validation.CollectiveMismatchError):
            raise
        except RuntimeError as exc:
            if self.op_timeout is None:
                raise
            raise self._comm.failure(self._comm.op, self._comm.seq, [], exc, phase) from exc

    def _check_tensor(self, tensor: Any, what: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what} expects a torch.Tensor, got {type(tensor).__name__}")

    def _check_reduction(self, tensor: Any, op: ReduceOp | str, what: str) -> ReduceOp:
        self._check_tensor(tensor, what)
        op = ReduceOp.parse(op)
        check_op_dtype(op, tensor.dtype)
        return op

    def _check_root(self, root: int) -> None:
        if not isinstance(root, int) or not 0 <= root < self.world_size:
            raise ValueError(f"root must be a rank in [0, {self.world_size}), got {root!r}")

    def _check_peer(self, peer: int, name: str) -> None:
        if not isinstance(peer, int) or not 0 <= peer < self.world_size:
            raise ValueError(f"{name} must be a rank in [0, {self.world_size}), got {peer!r}")
        if peer == self.rank:
            raise ValueError(
                f"rank {self.rank} cannot send to or receive from itself ({name}={peer})"
            )

    def _check_tag(self, tag: int) -> None:
        if not isinstance(tag, int) or not 0 <= tag < USER_TAG_LIMIT:
            raise ValueError(f"tag must be an int in [0, {USER_TAG_LIMIT}), got {tag!r}")

    def _scatter_chunks(
        self, chunks: Sequence[torch.Tensor] | torch.Tensor | None
    ) -> list[torch.Tensor]:
        return self._split_chunks(chunks, "scatter on the root")

    def _split_chunks(
        self, chunks: Sequence[torch.Tensor] | torch.Tensor | None, what: str
    ) -> list[torch.Tensor]:
        """``world_size`` tensors, from a list of them or one tensor split along dim 0."""
        name = what.split()[0]
        if isinstance(chunks, torch.Tensor):
            if chunks.dim() == 0:
                raise ValueError(
                    f"{name} cannot split a 0-d tensor; pass a list of world_size tensors"
                )
            return list(torch.tensor_split(chunks, self.world_size))
        if chunks is None or isinstance(chunks, (str, bytes)) or len(chunks) != self.world_size:
            got = "None" if chunks is None else f"{len(chunks)} chunks"
            raise ValueError(
                f"{what} needs {self.world_size} chunks (one per rank) or a tensor to split, got {got}"
            )
        for c in chunks:
            self._check_tensor(c, name)
        return list(chunks)


def check_transport(transport: str | None) -> str:
    """Validate a transport name; None reads :data:`TRANSPORT_ENV` (default ``"auto"``).

    * ``"tcp"``: gloo's (or NCCL's) own point-to-point, between any ranks.
    * ``"shm"``: shared memory between the ranks of each host, gloo between hosts;
      an error where shared memory cannot be used (not Linux x86-64, NCCL, no store).
    * ``"auto"``: ``"shm"`` where it can be used and two ranks share a host, else ``"tcp"``.
    """
    if transport is None:
        transport = os.environ.get(TRANSPORT_ENV, "").strip() or "auto"
    if transport not in TRANSPORTS:
        raise ValueError(
            f"unknown transport {transport!r}; expected one of {', '.join(TRANSPORTS)}"
        )
    return transport


def _make_transport(
    kind: str, rank: int, world_size: int, device: torch.device, stats: CommStats, op_timeout: Any
) -> Transport:
    """The transport ``kind`` asks for, or the TCP one where shared memory does not apply."""
    from ddtk.comm import shm, shm_transport

    store = _default_store() if world_size > 1 and dist.is_initialized() else None
    reason = (
        shm.unsupported_reason()
        or (
            f"it moves CPU tensors and this group runs on {device}"
            if device.type != "cpu"
            else None
        )
        or (None if store is not None else "there is no initialised process group with a store")
    )
    if kind == "tcp" or world_size == 1 or (kind == "auto" and reason):
        return Transport(rank, world_size, device, stats, op_timeout)
    if reason:
        raise ValueError(f"transport='shm' cannot be used: {reason}. Use transport='tcp'.")
    comm = shm_transport.connect(rank, world_size, device, stats, op_timeout, store)
    return comm or Transport(rank, world_size, device, stats, op_timeout)


def _send_meta(
    ctx: DistributedContext, shape: torch.Tensor, dtype: torch.dtype, root: int, tag: int
) -> None:
    """Tell every rank the shape and dtype of the coming broadcast (tree, two tiny messages)."""
    if dtype not in DTYPE_CODE:
        raise TypeError(f"broadcast does not support dtype {dtype}")
    head = torch.tensor([shape.numel(), DTYPE_CODE[dtype]], dtype=torch.int64, device=ctx.device)
    tree.broadcast_(ctx._comm, ctx._all, head, root, tag)
    tree.broadcast_(ctx._comm, ctx._all, shape.to(ctx.device), root, tag + 1)


def _recv_meta(ctx: DistributedContext, root: int, tag: int) -> torch.Tensor:
    """Receive what :func:`_send_meta` sent and allocate the broadcast buffer."""
    head = torch.empty(2, dtype=torch.int64, device=ctx.device)
    tree.broadcast_(ctx._comm, ctx._all, head, root, tag)
    ndim, code = (int(v) for v in head.tolist())
    shape = torch.empty(ndim, dtype=torch.int64, device=ctx.device)
    tree.broadcast_(ctx._comm, ctx._all, shape, root, tag + 1)
    return torch.empty([int(s) for s in shape.tolist()], dtype=DTYPES[code], device=ctx.device)


def _set_group_timeout(seconds: float) -> None:
    """Make torch.distributed's own collectives on the default group give up after ``seconds``."""
    with contextlib.suppress(AttributeError, RuntimeError, ValueError):
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds))


def _init_group(
    backend: str, rank: int, world_size: int, timeout: float, store: Any = None
) -> None:
    """Initialise the default process group (env:// rendezvous unless a store is given)."""
    kwargs: dict[str, Any] = {
        "backend": backend,
        "rank": rank,
        "world_size": world_size,
        "timeout": timedelta(seconds=timeout),
    }
    if store is not None:
        kwargs["store"] = store
    if backend == "nccl":
        kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(**kwargs)
