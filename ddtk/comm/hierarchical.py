"""Hierarchical all-reduce: reduce inside groups, all-reduce across group leaders, broadcast back.

This is the shape of all-reduce on real clusters: ranks on one node share fast
links (NVLink, shared memory) and nodes share a slower network. Reducing inside
each node first means only one rank per node, the leader, puts data on the
network, and the inter-node ring has n/g members instead of n. Here the groups
are ``group_size`` consecutive ranks, the way ranks are numbered node by node
under torchrun; the last group may be smaller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ddtk.comm import ring, tree
from ddtk.comm.ops import ReduceOp, finish_, private_copy
from ddtk.comm.transport import Transport


def default_group_size(world_size: int) -> int:
    """A square-ish split when the caller does not say: about sqrt(n) ranks per group."""
    return max(1, math.isqrt(world_size))


def groups_of(ranks: Sequence[int], group_size: int) -> list[list[int]]:
    """Consecutive groups of ``group_size`` ranks (the last one may be smaller)."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return [list(ranks[i : i + group_size]) for i in range(0, len(ranks), group_size)]


def all_reduce(
    comm: Transport,
    ranks: Sequence[int],
    tensor: torch.Tensor,
    op: ReduceOp,
    group_size: int | None = None,
) -> torch.Tensor:
    """Two-level all-reduce; returns a new tensor of the same shape."""
    groups = groups_of(ranks, group_size or default_group_size(len(ranks)))
    mine = next(g for g in groups if comm.rank in g)
    leaders = [g[0] for g in groups]
    acc = private_copy(tensor, comm.device)
    # Every rank takes both tag blocks, leader or not, so tag counters stay in step across ranks.
    tag, ring_tag = comm.tag_block(), comm.tag_block()
    tree.reduce_(comm, mine, acc, op, 0, tag)
    if comm.rank == mine[0] and len(leaders) > 1:
        # The leaders' ring must not divide an AVERAGE yet: combine with SUM semantics.
        acc = ring.all_reduce(
            comm, leaders, acc, ReduceOp.SUM if op is ReduceOp.AVERAGE else op, ring_tag
        )
    tree.broadcast_(comm, mine, acc, 0, tag + 1)
    return finish_(acc, op, len(ranks))
