"""The pieces of a sharded checkpoint: what a rank saves, what it loads, and who holds which range.

:class:`ShardedTensor` is one rank's contiguous range of a flat tensor,
:class:`ShardedState` everything one rank saves, :class:`ShardedCheckpoint` what
one rank of the (possibly different) loading world gets back. :func:`shard_range`
is the rule that splits a tensor over ranks and :func:`shard_name` the file each
rank writes. :mod:`ddtk.checkpoint.sharded` explains the format as a whole.

>>> shard_name(1, 4)
'shard-00001-of-00004.pt'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ddtk.checkpoint.atomic import CheckpointError
from ddtk.checkpoint.layout import SavedAt

__all__ = [
    "KIND",
    "ShardWriteError",
    "ShardedCheckpoint",
    "ShardedState",
    "ShardedTensor",
    "clone_tensors",
    "shard_name",
    "shard_range",
]

KIND = "sharded"
"""The manifest ``kind`` of a sharded checkpoint."""

# message tags of the save and load protocols between the ranks


TAG_READY, TAG_REPORT, TAG_OUTCOME, TAG_VERIFY = 7301, 7302, 7303, 7304


class ShardWriteError(CheckpointError):
    """A rank could not write its shard; nothing was committed and every rank raises this."""


def shard_name(rank: int, world_size: int) -> str:
    """The file name of ``rank``'s shard: ``shard-00001-of-00004.pt``."""
    return f"shard-{rank:05d}-of-{world_size:05d}.pt"


def shard_range(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """``[lo, hi)`` of a 1-D tensor of ``numel`` elements that ``rank`` holds.

    The rule of :class:`~ddtk.parallel.zero.ZeroOptimizer`: chunks of
    ``ceil(numel / world_size)``, the last ones shorter or empty (ZeRO pads
    instead; the padding is never saved).

    >>> [shard_range(10, 4, r) for r in range(4)]
    [(0, 3), (3, 6), (6, 9), (9, 10)]
    >>> [shard_range(2, 3, r) for r in range(3)]
    [(0, 1), (1, 2), (2, 2)]
    """
    if world_size < 1 or not 0 <= rank < world_size or numel < 0:
        raise ValueError(f"bad shard_range({numel}, {world_size}, {rank})")
    size = math.ceil(numel / world_size)
    return min(rank * size, numel), min((rank + 1) * size, numel)


@dataclass
class ShardedTensor:
    """Elements ``[offset, offset + local.numel())`` of a 1-D global tensor of ``numel`` elements.

    >>> t = ShardedTensor.from_full(torch.arange(10.0), rank=3, world_size=4)
    >>> t.local.tolist(), t.offset, t.numel
    ([9.0], 9, 10)
    """

    local: torch.Tensor
    offset: int
    numel: int

    def __post_init__(self) -> None:
        if not isinstance(self.local, torch.Tensor) or self.local.dim() != 1:
            raise TypeError("ShardedTensor.local must be a 1-D tensor")
        if not 0 <= self.offset <= self.offset + self.local.numel() <= self.numel:
            raise ValueError(
                f"piece [{self.offset}, {self.offset + self.local.numel()}) does not fit in a "
                f"tensor of {self.numel} elements"
            )

    @classmethod
    def from_full(cls, full: torch.Tensor, rank: int, world_size: int) -> ShardedTensor:
        """``rank``'s piece (:func:`shard_range`) of ``full``, flattened and copied."""
        flat = full.detach().reshape(-1)
        lo, hi = shard_range(flat.numel(), world_size, rank)
        return cls(flat[lo:hi].clone(), lo, flat.numel())


@dataclass
class ShardedState:
    """What one rank saves: flat pieces, replicated entries, per-rank entries and JSON metadata.

    ``replicated`` is written by rank 0 only (every rank should hold the same);
    ``per_rank`` is restored only at the same world size; ``meta`` must be JSON.

    >>> st = ShardedState(
    ...     flat={"w": ShardedTensor.from_full(torch.ones(5), rank=0, world_size=2)},
    ...     replicated={"lr": 0.1},
    ...     meta={"note": "warm-up done"},
    ... )
    >>> st.flat["w"].local.tolist(), st.per_rank
    ([1.0, 1.0, 1.0], {})
    """

    flat: dict[str, ShardedTensor] = field(default_factory=dict)
    replicated: dict[str, Any] = field(default_factory=dict)
    per_rank: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class ShardedCheckpoint(SavedAt):
    """A sharded checkpoint as loaded by one rank of the new world (see the module example).

    ``flat`` holds this rank's requested pieces, ``per_rank`` is None when the
    world size changed, and ``notes`` says what was not restored and why.
    """

    path: Path
    manifest: dict[str, Any]
    flat: dict[str, ShardedTensor]
    replicated: dict[str, Any]
    per_rank: dict[str, Any] | None
    meta: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def saved_world_size(self) -> int:
        """The number of ranks that wrote it."""
        return int(self.manifest["world_size"])


def clone_tensors(obj: Any) -> Any:
    """Copies of the tensors in nested dicts/lists/tuples, so no memory map stays open."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: clone_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(clone_tensors(v) for v in obj)
    return obj
