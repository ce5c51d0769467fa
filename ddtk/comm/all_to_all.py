"""All-to-all: every rank sends a different piece to every other rank.

Rank r holds ``n`` chunks; chunk ``j`` goes to rank ``j``, and rank r ends with the
``n`` chunks addressed to it, one from each rank. It is the exchange at the heart
of mixture-of-experts layers (tokens travel to the rank holding their expert and
back) and of switching between sharding layouts (sequence- to head-parallel).

There is nothing to reduce and no data to share, so no ring or tree helps: each
byte must cross from its sender to its receiver once. This implementation does
what NCCL's does (a group of point-to-point calls): every rank posts its ``n - 1``
sends at once, so all links are busy together, then receives from each peer in
turn, starting with its left neighbour (``r - 1``, ``r - 2``, ...), whose message
was sent first. Chunks may differ in shape and dtype, as MoE token counts do: every
message describes itself. Each rank sends and receives ``(n - 1) / n`` of its data
when chunks are equal, which is why nccl-tests' busbw factor for all-to-all is
(n - 1) / n, and why a single NIC, not their sum, limits it across nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ddtk.comm.transport import Transport


def all_to_all(
    comm: Transport, ranks: Sequence[int], chunks: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """Send ``chunks[j]`` to ``ranks[j]``; return what each rank sent here, in rank order."""
    n, me = len(ranks), ranks.index(comm.rank)
    tag = comm.tag_block()
    sends = [
        w
        for k in range(1, n)
        for w in comm.send_tensor(chunks[(me + k) % n], ranks[(me + k) % n], tag)
    ]
    out: list[torch.Tensor | None] = [None] * n
    out[me] = chunks[me].detach().to(device=comm.device, copy=True)
    for k in range(1, n):
        src = (me - k) % n
        out[src] = comm.recv_any(ranks[src], tag).payload
    for w in sends:
        w.wait()
    return out  # type: ignore[return-value]
