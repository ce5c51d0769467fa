"""Flat (root-centred) collectives: gather, scatter, and the naive all-reduce.

The root talks to every other rank directly, one after another. This is the
simplest correct design and the slowest at scale: the root's link carries
(n-1) times the buffer in each direction, so time grows linearly with n. The
naive all-reduce is here as the baseline that ring and tree are measured
against, and gather/scatter use the same flat pattern because their root must
touch every rank's data anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ddtk.comm.ops import ReduceOp, combine_, finish_, private_copy
from ddtk.comm.transport import Transport


def gather(
    comm: Transport, ranks: Sequence[int], tensor: torch.Tensor, root: int
) -> list[torch.Tensor] | None:
    """Collect every rank's tensor (any shapes) on ``ranks[root]``, in rank order."""
    tag = comm.tag_block()
    if comm.rank != ranks[root]:
        for w in comm.send_tensor(tensor, ranks[root], tag):
            w.wait()
        return None
    out = []
    for r in ranks:
        if r == comm.rank:
            out.append(tensor.detach().to(device=comm.device, copy=True))
        else:
            out.append(comm.recv_any(r, tag).payload)
    return out


def scatter(
    comm: Transport, ranks: Sequence[int], chunks: Sequence[torch.Tensor] | None, root: int
) -> torch.Tensor:
    """Send ``chunks[i]`` from ``ranks[root]`` to ``ranks[i]``; return this rank's chunk."""
    tag = comm.tag_block()
    if comm.rank != ranks[root]:
        return comm.recv_any(ranks[root], tag).payload
    assert chunks is not None
    sends = [
        w
        for r, chunk in zip(ranks, chunks)
        if r != comm.rank
        for w in comm.send_tensor(chunk, r, tag)
    ]
    for w in sends:
        w.wait()
    return chunks[ranks.index(comm.rank)].detach().to(device=comm.device, copy=True)


def all_reduce(
    comm: Transport, ranks: Sequence[int], tensor: torch.Tensor, op: ReduceOp
) -> torch.Tensor:
    """Naive all-reduce: everyone sends to the first rank, which reduces and sends the result back."""
    acc = private_copy(tensor, comm.device)
    root, tag = ranks[0], comm.tag_block()
    if comm.rank != root:
        comm.isend(acc, root, tag).wait()
        comm.irecv(acc, root, tag + 1).wait()
        return acc  # already finished by the root
    incoming = torch.empty_like(acc)
    for r in ranks[1:]:
        comm.irecv(incoming, r, tag).wait()
        combine_(acc, incoming, op)
    finish_(acc, op, len(ranks))
    sends = [comm.isend(acc, r, tag + 1) for r in ranks[1:]]
    for w in sends:
        w.wait()
    return acc
