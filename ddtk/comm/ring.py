"""Ring algorithms: reduce-scatter, all-gather and the bandwidth-optimal all-reduce.

With n ranks the buffer is cut into n chunks. In the reduce-scatter phase, at
each of n-1 steps, every rank sends one chunk to its right neighbour and adds the
chunk arriving from its left neighbour into its own copy; afterwards each rank
holds one chunk fully reduced. The all-gather phase circulates those finished
chunks for n-1 more steps. Every rank sends 2(n-1)/n of the buffer in total,
which is the lower bound for all-reduce, so the ring is bandwidth optimal.

Three things make this a real ring rather than a toy:

* **Segmentation and pipelining.** Each chunk is cut into segments of about
  :data:`SEGMENT_BYTES`. A segment is forwarded to the right neighbour as soon
  as it has arrived (and been reduced), so receiving, reducing and sending of
  different segments overlap, across steps as well as within one.
* **All receives are posted up front.** The transport can place incoming bytes
  straight into their final buffer while this rank is busy reducing.
* **No needless copies.** Chunks are sent straight from the input; a reduction
  writes ``own + incoming`` directly into the result; all-gather receives
  straight into the result; the receive buffer for reductions is a workspace
  reused across calls, so large all-reduces do not page-fault a fresh one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ddtk.comm.ops import ReduceOp, combine_into, finish_
from ddtk.comm.transport import TAGS_PER_BLOCK, Transport, Work

MIN_SEGMENT_BYTES = 256 << 10
MAX_SEGMENT_BYTES = 4 << 20
SEGMENTS_PER_CHUNK = 4
"""A chunk is cut into about this many segments, each between MIN_ and
MAX_SEGMENT_BYTES. Each message costs tens of microseconds of software overhead
on the CPU path, so segments must be large; four per chunk is enough for the
receive of one segment to overlap the reduction of the previous one."""


@dataclass(frozen=True)
class RingStep:
    """What one rank does at one step of ring all-reduce.

    The rank sends chunk ``send_chunk`` to rank ``(rank + 1) % n`` and receives
    chunk ``recv_chunk`` from rank ``(rank - 1) % n``, adding it to its own copy
    in the ``"reduce_scatter"`` phase and overwriting its copy in ``"all_gather"``.
    """

    phase: str
    step: int
    rank: int
    send_chunk: int
    recv_chunk: int

    @property
    def reduces(self) -> bool:
        return self.phase == "reduce_scatter"


def _reduce_scatter_steps(n: int, rank: int, shift: int, first_step: int = 0) -> list[RingStep]:
    """Reduce-scatter steps after which ``rank`` holds chunk ``(rank + 1 + shift) % n`` reduced."""
    return [
        RingStep(
            "reduce_scatter",
            first_step + s,
            rank,
            (rank - s + shift) % n,
            (rank - s - 1 + shift) % n,
        )
        for s in range(n - 1)
    ]


def _all_gather_steps(n: int, rank: int, own: int, first_step: int = 0) -> list[RingStep]:
    """All-gather steps for a rank that starts out holding chunk ``own``."""
    return [
        RingStep("all_gather", first_step + s, rank, (own - s) % n, (own - s - 1) % n)
        for s in range(n - 1)
    ]


def rank_plan(n: int, rank: int) -> list[RingStep]:
    """The 2(n-1) steps of ring all-reduce for one rank."""
    rs = _reduce_scatter_steps(n, rank, shift=0)
    return rs + _all_gather_steps(n, rank, own=(rank + 1) % n, first_step=n - 1)


def ring_schedule(world_size: int) -> list[list[RingStep]]:
    """The whole all-reduce schedule: ``schedule[step][rank]``.

    Lectures draw this; :func:`all_reduce` executes exactly these steps.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    plans = [rank_plan(world_size, r) for r in range(world_size)]
    return [list(steps) for steps in zip(*plans)] if world_size > 1 else []


def chunk_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``parts`` contiguous ranges, sizes differing by at most one.

    The first ``numel % parts`` ranges get the extra element, as ``torch.tensor_split`` does.
    """
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _segments(bound: tuple[int, int], seg_elems: int) -> list[tuple[int, int]]:
    start, stop = bound
    return [(a, min(a + seg_elems, stop)) for a in range(start, stop, seg_elems)] or [
        (start, start)
    ]


def _segment_elems(bounds: Sequence[tuple[int, int]], element_size: int, steps: int) -> int:
    """Segment length in elements: about 1/SEGMENTS_PER_CHUNK of the longest chunk, clamped
    to [MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES], and never more segments than tags allow."""
    longest = max(b - a for a, b in bounds)
    target = min(
        max(longest * element_size // SEGMENTS_PER_CHUNK, MIN_SEGMENT_BYTES), MAX_SEGMENT_BYTES
    )
    seg = max(1, target // element_size)
    max_segments = max(1, TAGS_PER_BLOCK // max(steps, 1))
    return max(seg, math.ceil(longest / max_segments), 1)


def run_ring(
    comm: Transport,
    ranks: Sequence[int],
    src: torch.Tensor,
    out: torch.Tensor,
    bounds: Sequence[tuple[int, int]],
    plan: Sequence[RingStep],
    op: ReduceOp = ReduceOp.SUM,
    tag: int | None = None,
) -> torch.Tensor:
    """Execute ``plan``, reading this rank's contribution from ``src`` and writing ``out``.

    ``src`` and ``out`` are flat tensors of the same length (they may be the same
    tensor). ``src`` is never written. A chunk is sent from ``src`` until this rank
    has written it in ``out`` (by reducing into it or receiving it), and from
    ``out`` afterwards, so the input never needs a separate copy pass.

    ``ranks`` lists the global ranks of the ring in ring order; ``bounds[c]`` is the
    element range of chunk ``c``. Consecutive steps must chain: the chunk received
    at step s is the chunk sent at step s+1, which is what lets a segment be
    forwarded the moment it is ready. ``tag`` is the first of a block of tags from
    :meth:`Transport.tag_block`; by default a fresh block is taken.
    """
    if not plan:
        return out
    me = ranks.index(comm.rank)
    right, left = ranks[(me + 1) % len(ranks)], ranks[(me - 1) % len(ranks)]
    for a, b in itertools.pairwise(plan):
        assert b.send_chunk == a.recv_chunk, "ring plan steps do not chain"
    seg = _segment_elems(bounds, out.element_size(), len(plan))
    segs = {
        c: _segments(bounds[c], seg) for c in {s.recv_chunk for s in plan} | {plan[0].send_chunk}
    }
    base = comm.tag_block() if tag is None else tag
    per_step = TAGS_PER_BLOCK // len(plan)

    # Receives land in a reused workspace when they must be reduced, else straight in ``out``.
    scratch = comm.workspace(out.numel(), out.dtype) if any(s.reduces for s in plan) else out
    recvs: list[list[Work]] = []
    for i, step in enumerate(plan):
        target = scratch if step.reduces else out
        recvs.append(
            [
                comm.irecv(target[a:b], left, base + i * per_step + j)
                for j, (a, b) in enumerate(segs[step.recv_chunk])
            ]
        )
    sends = [
        comm.isend(src[a:b], right, base + j) for j, (a, b) in enumerate(segs[plan[0].send_chunk])
    ]

    for i, step in enumerate(plan):
        forward = i + 1 < len(plan)
        for j, (a, b) in enumerate(segs[step.recv_chunk]):
            recvs[i][j].wait()
            if (
                step.reduces
            ):  # each chunk is reduced at most once: own contribution (src) + incoming
                combine_into(out[a:b], src[a:b], scratch[a:b], op)
            if forward:
                sends.append(comm.isend(out[a:b], right, base + (i + 1) * per_step + j))
    for w in sends:
        w.wait()
    return out


def _flat(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A contiguous 1-D view of ``tensor`` on ``device``; copies only if it must (never writes it)."""
    return tensor.detach().to(device=device).contiguous().view(-1)


def all_reduce(
    comm: Transport,
    ranks: Sequence[int],
    tensor: torch.Tensor,
    op: ReduceOp,
    tag: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ring all-reduce of ``tensor`` over ``ranks``, into ``out`` or a new tensor of the same shape.

    ``out`` (contiguous, same shape and dtype; may be ``tensor`` itself) saves the
    allocation: a fresh buffer of tens of MiB costs page faults on every call.
    """
    n = len(ranks)
    src = _flat(tensor, comm.device)
    if n == 1 or src.numel() == 0:
        return src.clone().view(tensor.shape) if out is None else out.copy_(tensor)
    result = out
    out = torch.empty_like(src) if out is None else out.view(-1)
    plan = rank_plan(n, ranks.index(comm.rank))
    run_ring(comm, ranks, src, out, chunk_bounds(src.numel(), n), plan, op, tag)
    finish_(out, op, n)
    return out.view(tensor.shape) if result is None else result


def reduce_scatter(
    comm: Transport, ranks: Sequence[int], tensor: torch.Tensor, op: ReduceOp
) -> torch.Tensor:
    """Ring reduce-scatter: split dim 0 like ``torch.tensor_split`` and return this rank's part reduced."""
    n, me = len(ranks), ranks.index(comm.rank)
    if tensor.dim() == 0:
        raise ValueError("reduce_scatter needs a tensor with at least one dimension to split")
    rows = chunk_bounds(tensor.shape[0], n)
    row_elems = math.prod(tensor.shape[1:])
    bounds = [(a * row_elems, b * row_elems) for a, b in rows]
    src = _flat(tensor, comm.device)
    a, b = bounds[me]
    if n == 1 or src.numel() == 0:
        return src[a:b].clone().view(rows[me][1] - rows[me][0], *tensor.shape[1:])
    buf = torch.empty_like(src)
    run_ring(comm, ranks, src, buf, bounds, _reduce_scatter_steps(n, me, shift=-1), op)
    part = buf[a:b].view(rows[me][1] - rows[me][0], *tensor.shape[1:])
    return finish_(part.clone(), op, n)


def all_gather(comm: Transport, ranks: Sequence[int], tensor: torch.Tensor) -> list[torch.Tensor]:
    """Ring all-gather of equally shaped tensors; returns one tensor per rank, in rank order."""
    n, me = len(ranks), ranks.index(comm.rank)
    size = tensor.numel()
    buf = torch.empty(n * size, dtype=tensor.dtype, device=comm.device)
    bounds = [(i * size, (i + 1) * size) for i in range(n)]
    buf[bounds[me][0] : bounds[me][1]] = tensor.detach().reshape(-1)
    if n > 1 and size > 0:
        run_ring(comm, ranks, buf, buf, bounds, _all_gather_steps(n, me, own=me))
    return [buf[a:b].view(tensor.shape) for a, b in bounds]
