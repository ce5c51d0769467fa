"""Catch ranks that disagree about a collective before it hangs or returns garbage.

If rank 0 all-reduces a float32 tensor of 10 elements and rank 1 one of 12, a
hand-written collective either deadlocks or silently mixes bytes. Before each
collective every rank therefore publishes a fingerprint of what it is about to
do (which collective, algorithm, op, dtype, shape, root). The fast path costs
one tiny all-gather of 8-byte hashes (through the context's transport); only when hashes
differ are the full descriptions exchanged to build an error that names the
ranks and the fields that differ. Every rank raises the same error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist


class CollectiveMismatchError(RuntimeError):
    """Ranks called the same collective with incompatible arguments (or different collectives)."""


def fingerprint(desc: Mapping[str, Any]) -> int:
    """A stable signed 64-bit hash of a collective description."""
    text = repr(sorted(desc.items())).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)


def check(
    desc: Mapping[str, Any],
    world_size: int,
    device: torch.device,
    gather: Callable[[torch.Tensor], list[torch.Tensor]] | None = None,
) -> None:
    """Raise :class:`CollectiveMismatchError` on every rank if any rank's ``desc`` differs.

    ``gather`` all-gathers the one-element fingerprint tensor (default:
    ``torch.distributed.all_gather``); a context passes its own transport's.
    """
    if world_size == 1:
        return
    mine = torch.tensor([fingerprint(desc)], dtype=torch.int64, device=device)
    if gather is None:
        everyone = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(everyone, mine)
    else:
        everyone = gather(mine)
    if all(int(t) == int(mine) for t in everyone):
        return
    descs: list[Any] = [None] * world_size
    dist.all_gather_object(descs, dict(desc))
    raise CollectiveMismatchError(describe_mismatch(descs))


def describe_mismatch(descs: list[Mapping[str, Any]]) -> str:
    """Explain, field by field, which ranks disagree and how."""
    keys = sorted({k for d in descs for k in d}, key=lambda k: (k != "collective", k))
    lines = []
    for key in keys:
        by_value: dict[str, list[int]] = {}
        for rank, d in enumerate(descs):
            by_value.setdefault(repr(d.get(key, "<not given>")), []).append(rank)
        if len(by_value) > 1:
            parts = "; ".join(
                f"rank{'s' if len(r) > 1 else ''} {','.join(map(str, r))}: {v}"
                for v, r in by_value.items()
            )
            lines.append(f"  {key}: {parts}")
    what = descs[0].get("collective", "collective")
    return f"ranks disagree on the arguments of {what}:\n" + "\n".join(lines)
