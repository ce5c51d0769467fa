"""Dissemination barrier (Hensgen, Finkel and Manber, 1988).

In round i every rank signals rank (r + 2^i) mod n and waits for a signal from
rank (r - 2^i) mod n. After ceil(log2 n) rounds every rank has heard, directly
or through others, from every rank, so nobody can leave before everybody has
arrived. It works for any n and needs no root.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ddtk.comm.transport import Transport


def barrier(comm: Transport, ranks: Sequence[int]) -> None:
    """Block until every rank in ``ranks`` has entered the barrier."""
    n, me = len(ranks), ranks.index(comm.rank)
    token, got = torch.zeros(1, device=comm.device), torch.empty(1, device=comm.device)
    tag, dist = comm.tag_block(), 1
    while dist < n:
        recv = comm.irecv(got, ranks[(me - dist) % n], tag)
        comm.isend(token, ranks[(me + dist) % n], tag).wait()
        recv.wait()
        dist <<= 1
        tag += 1
