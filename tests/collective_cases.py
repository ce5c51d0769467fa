"""Deterministic inputs for the collective tests, shared by the ranks and the reference.

Values are small integers so that sums and products are exact in every dtype,
including float16 and bfloat16: any difference from the single-process reference
is a real bug, not rounding.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from ddtk.comm.ops import ReduceOp

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64)


def shapes_for(world_size: int) -> dict[str, tuple[int, ...]]:
    """Edge-case shapes: empty, one element, fewer elements than ranks, non-divisible, multi-dim."""
    return {
        "empty": (0,),
        "one": (1,),
        "fewer": (max(world_size - 1, 0),),
        "nondiv": (world_size * 3 + 1,),
        "multidim": (3, 2, 5),
        "noncontig": (6, 4),  # made non-contiguous by a transpose in make_input
        "scalar": (),
    }


@dataclass(frozen=True)
class Case:
    collective: str
    shape_name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    op: ReduceOp = ReduceOp.SUM
    algorithm: str = "ring"
    root: int = 0
    group_size: int | None = None  # hierarchical all-reduces only

    @property
    def key(self) -> str:
        key = f"{self.collective}/{self.algorithm}/{self.op.name}/{self.dtype}/{self.shape_name}/root{self.root}"
        return key if self.group_size is None else f"{key}/g{self.group_size}"


def make_input(case: Case, rank: int) -> torch.Tensor:
    """The tensor rank ``rank`` contributes to ``case``."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.key}/{rank}".encode()))
    if case.op is ReduceOp.PRODUCT:
        values = torch.tensor([-1, 1, 2])[torch.randint(0, 3, case.shape, generator=gen)]
    else:
        values = torch.randint(-8, 9, case.shape, generator=gen)
    t = values.to(case.dtype)
    if case.shape_name == "noncontig":
        t = t.t()  # a transposed view: not contiguous
        assert not t.is_contiguous()
    return t


def run_cases(ctx, cases: list[Case]) -> dict[str, object]:
    """Rank body: run every case and return its output keyed by ``case.key``."""
    out: dict[str, object] = {}
    for c in cases:
        x = make_input(c, ctx.rank)
        before = x.clone()
        if c.collective == "all_reduce":
            extra = {} if c.group_size is None else {"group_size": c.group_size}
            res = ctx.all_reduce(x, op=c.op, algorithm=c.algorithm, **extra)
        elif c.collective == "reduce":
            res = ctx.reduce(x, root=c.root, op=c.op)
        elif c.collective == "reduce_scatter":
            res = ctx.reduce_scatter(x, op=c.op)
        elif c.collective == "broadcast":
            res = ctx.broadcast(x if ctx.rank == c.root else None, root=c.root)
        elif c.collective == "all_gather":
            res = ctx.all_gather(x)
        elif c.collective == "gather":
            res = ctx.gather(x, root=c.root)
        elif c.collective == "scatter":
            chunks = [make_input(c, 100 + i) for i in range(ctx.world_size)] if ctx.rank == c.root else None
            res = ctx.scatter(chunks, root=c.root)
        else:
            raise AssertionError(c.collective)
        assert torch.equal(x, before), f"{c.key}: input was modified"
        out[c.key] = res
    return out
