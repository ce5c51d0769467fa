"""Hierarchical all-reduce by shards: reduce-scatter in each group, all-reduce each shard across
groups, all-gather in each group.

This is the form Horovod runs with ``HOROVOD_HIERARCHICAL_ALLREDUCE=1``
(``NCCLHierarchicalAllreduce`` in horovod/common/ops/nccl_operations.cc): an NCCL
reduce-scatter among the GPUs of a node, an MPI all-reduce of each GPU's shard with
the GPUs of the same local rank on the other nodes, and an NCCL all-gather inside
the node. Unlike :mod:`ddtk.comm.hierarchical` (reduce to one leader, leaders'
ring, broadcast) every rank of a group works across groups at once, each on 1/g of
the buffer: on a cluster with one NIC per GPU, all the NICs carry traffic, and the
bytes inside a group are a ring's 2(g-1)/g instead of a tree's whole buffer per
level.

Groups are ``group_size`` consecutive ranks (node by node, as torchrun numbers
them); the last may be smaller. The buffer is cut into ``g`` shards, ``g`` the size
of the first group. In a full group member ``j`` owns shard ``j``; in a smaller
group of ``h`` members, member ``j`` owns every shard ``s`` with ``s % h == j``, so
every shard has exactly one owner per group and the cross-group all-reduce of
shard ``s`` runs among those owners. (Horovod instead falls back to a leader form
when nodes differ in size, and sends the remainder of a buffer that ``g`` does not
divide through one local rank.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ddtk.comm import ring
from ddtk.comm.hierarchical import default_group_size, groups_of
from ddtk.comm.ops import ReduceOp, finish_
from ddtk.comm.transport import Transport


def shard_owners(group_len: int, shards: int) -> list[list[int]]:
    """``owners[j]``: the shards member ``j`` of a group of ``group_len`` owns, in order."""
    return [[s for s in range(shards) if s % group_len == j] for j in range(group_len)]


def _permuted_bounds(
    shard_bounds: Sequence[tuple[int, int]], owners: Sequence[Sequence[int]]
) -> tuple[list[int], list[tuple[int, int]], dict[int, tuple[int, int]]]:
    """Shard order with each member's shards adjacent, each member's range in that order,
    and each shard's range in that order."""
    order = [s for mine in owners for s in mine]
    where: dict[int, tuple[int, int]] = {}
    start = 0
    for s in order:
        a, b = shard_bounds[s]
        where[s] = (start, start + b - a)
        start += b - a
    member = []
    for mine in owners:
        first = where[mine[0]][0] if mine else start
        last = where[mine[-1]][1] if mine else start
        member.append((first, last))
    return order, member, where


def all_reduce(
    comm: Transport,
    ranks: Sequence[int],
    tensor: torch.Tensor,
    op: ReduceOp,
    group_size: int | None = None,
) -> torch.Tensor:
    """Reduce-scatter / cross-group all-reduce of each shard / all-gather; returns a new tensor."""
    n = len(ranks)
    groups = groups_of(ranks, group_size or default_group_size(n))
    mine = next(g for g in groups if comm.rank in g)
    me, h, shards = mine.index(comm.rank), len(mine), len(groups[0])
    # Every rank takes the same tag blocks, so tag counters stay in step across ranks. One
    # block serves every cross-group ring: two rings never share a pair of ranks.
    rs_tag, cross_tag, ag_tag = comm.tag_block(), comm.tag_block(), comm.tag_block()
    src = tensor.detach().to(device=comm.device).contiguous().view(-1)
    if n == 1 or src.numel() == 0:
        return src.clone().view(tensor.shape)
    combine = ReduceOp.SUM if op is ReduceOp.AVERAGE else op  # divide once, at the end
    shard_bounds = ring.chunk_bounds(src.numel(), shards)
    owners = shard_owners(h, shards)
    order, member, where = _permuted_bounds(shard_bounds, owners)
    identity = order == list(range(shards))
    data = src if identity else torch.cat([src[a:b] for a, b in (shard_bounds[s] for s in order)])

    # 1. reduce-scatter inside the group: member j ends with its shards reduced over the group.
    if h > 1:
        buf = torch.empty_like(data)
        plan = ring._reduce_scatter_steps(h, me, shift=-1)
        ring.run_ring(comm, mine, data, buf, member, plan, combine, rs_tag)
    else:
        buf = data.clone()
    # 2. all-reduce each owned shard with its owners in the other groups (one per group).
    for s in owners[me]:
        peers = [g[s % len(g)] for g in groups]
        a, b = where[s]
        buf[a:b] = ring.all_reduce(comm, peers, buf[a:b], combine, tag=cross_tag)
    # 3. all-gather inside the group.
    if h > 1:
        plan = ring._all_gather_steps(h, me, own=me)
        ring.run_ring(comm, mine, buf, buf, member, plan, tag=ag_tag)
    if identity:
        out = buf
    else:
        out = torch.empty_like(src)
        for s in order:
            (a, b), (x, y) = shard_bounds[s], where[s]
            out[a:b] = buf[x:y]
    return finish_(out, op, n).view(tensor.shape)
