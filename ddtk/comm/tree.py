"""Binomial-tree reduce and broadcast, and the tree all-reduce built from them.

In a binomial tree over k ranks, the rank at relative position v talks to
v ± 2^i. A reduce finishes in ceil(log2 k) rounds, with the data halving the
number of active ranks each round; a broadcast runs the same tree backwards.
Latency grows as log2 k (the ring's grows as k), but every round moves the
whole buffer, so for large messages the tree moves log2 k times the data the
ring does. That trade-off is why NCCL and MPI switch algorithms by message size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ddtk.comm.ops import ReduceOp, combine_, finish_, private_copy
from ddtk.comm.transport import Transport


def reduce_(
    comm: Transport, ranks: Sequence[int], acc: torch.Tensor, op: ReduceOp, root: int, tag: int
) -> bool:
    """Reduce ``acc`` (modified in place) onto ``ranks[root]``. Returns True on the root.

    Non-root ranks send their partial result to their parent and are done; the
    root's ``acc`` ends up holding the reduction of every rank's input.
    """
    k = len(ranks)
    v = (ranks.index(comm.rank) - root) % k
    incoming = torch.empty_like(acc)
    mask = 1
    while mask < k:
        if v & mask:
            comm.isend(acc, ranks[(v - mask + root) % k], tag).wait()
            return False
        if v + mask < k:
            comm.irecv(incoming, ranks[(v + mask + root) % k], tag).wait()
            combine_(acc, incoming, op)
        mask <<= 1
    return True


def broadcast_(
    comm: Transport, ranks: Sequence[int], buf: torch.Tensor, root: int, tag: int
) -> torch.Tensor:
    """Broadcast ``buf`` from ``ranks[root]`` to every rank (received in place)."""
    k = len(ranks)
    v = (ranks.index(comm.rank) - root) % k
    mask = 1
    while mask < k:  # receive from the parent: the rank that differs in v's lowest set bit
        if v & mask:
            comm.irecv(buf, ranks[(v - mask + root) % k], tag).wait()
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:  # forward to children below that bit
        if v + mask < k:
            sends.append(comm.isend(buf, ranks[(v + mask + root) % k], tag))
        mask >>= 1
    for w in sends:
        w.wait()
    return buf


def reduce(
    comm: Transport, ranks: Sequence[int], tensor: torch.Tensor, op: ReduceOp, root: int
) -> torch.Tensor | None:
    """Tree reduce to ``ranks[root]``: a new tensor on the root, None elsewhere."""
    acc = private_copy(tensor, comm.device)
    if reduce_(comm, ranks, acc, op, root, comm.tag_block()):
        return finish_(acc, op, len(ranks))
    return None


def all_reduce(
    comm: Transport, ranks: Sequence[int], tensor: torch.Tensor, op: ReduceOp
) -> torch.Tensor:
    """Tree all-reduce: binomial reduce to the first rank, then binomial broadcast."""
    acc = private_copy(tensor, comm.device)
    tag = comm.tag_block()
    reduce_(comm, ranks, acc, op, 0, tag)
    broadcast_(comm, ranks, acc, 0, tag + 1)
    return finish_(acc, op, len(ranks))
