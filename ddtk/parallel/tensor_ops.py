"""Communication ops of tensor parallelism, as autograd functions (Megatron's f and g).

A tensor-parallel layer keeps one slice of each weight matrix per rank. Its
forward pass needs a collective at the slice boundaries, and so does its
backward pass, mirrored: what is an identity going forward is an all-reduce
coming back, and the other way round. Each op below is one such pair, so the
layers in :mod:`ddtk.parallel.tensor` stay plain ``F.linear`` calls.

==============================  ========================  ==========================
op                              forward                   backward
==============================  ========================  ==========================
``copy_to_tensor_parallel``     identity (f)              all-reduce sum
``reduce_from_tensor_parallel`` all-reduce sum (g)        identity
``gather_from_tensor_parallel`` all-gather, concatenate   keep this rank's slice
``scatter_to_tensor_parallel``  keep this rank's slice    all-gather, concatenate
==============================  ========================  ==========================

The tensor-parallel group is every rank of the :class:`~ddtk.DistributedContext`;
with one rank every op is the identity and sends nothing. Slices are equal
parts along ``dim`` (its size must be divisible by the world size), rank ``r``
holding part ``r``. All-reduces use the ring algorithm (:data:`ALGORITHM`).

>>> import ddtk, torch
>>> from ddtk.parallel.tensor_ops import gather_from_tensor_parallel
>>> def work(ctx):
...     part = torch.full((1, 2), float(ctx.rank), requires_grad=True)
...     full = gather_from_tensor_parallel(part, ctx)  # (1, 4) on every rank
...     (full * torch.arange(4.0)).sum().backward()    # each rank gets its slice's gradient
...     return full.tolist(), part.grad.tolist()
>>> for full, grad in ddtk.launch(work, world_size=2, timeout=120):
...     print(full, grad)
[[0.0, 0.0, 1.0, 1.0]] [[0.0, 1.0]]
[[0.0, 0.0, 1.0, 1.0]] [[2.0, 3.0]]
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "ALGORITHM",
    "copy_to_tensor_parallel",
    "gather_from_tensor_parallel",
    "reduce_from_tensor_parallel",
    "scatter_to_tensor_parallel",
    "split_along",
]

ALGORITHM = "ring"
"""The all-reduce algorithm of the ops: the ring sends 2(n-1)/n of the tensor per rank."""


def split_along(x: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """Part ``rank`` of ``world_size`` equal parts of ``x`` along ``dim`` (contiguous copy)."""
    size = x.shape[dim]
    if size % world_size:
        raise ValueError(
            f"cannot split dimension {dim} of size {size} into {world_size} equal parts: "
            f"its size must be divisible by the world size"
        )
    return x.chunk(world_size, dim=dim)[rank].contiguous()


def _gather_along(x: torch.Tensor, dim: int, dctx: Any) -> torch.Tensor:
    """Every rank's ``x``, concatenated in rank order along ``dim``."""
    return torch.cat(dctx.all_gather(x.contiguous()), dim=dim)


class _CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, dctx: Any) -> torch.Tensor:
        fctx.dctx = dctx
        return x.view_as(x)

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return fctx.dctx.all_reduce(grad, algorithm=ALGORITHM), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, dctx: Any) -> torch.Tensor:
        return dctx.all_reduce(x, algorithm=ALGORITHM)

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, dctx: Any, dim: int) -> torch.Tensor:
        fctx.dctx, fctx.dim = dctx, dim
        return _gather_along(x, dim, dctx)

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        d = fctx.dctx
        return split_along(grad, fctx.dim, d.rank, d.world_size), None, None


class _ScatterToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, dctx: Any, dim: int) -> torch.Tensor:
        fctx.dctx, fctx.dim = dctx, dim
        return split_along(x, dim, dctx.rank, dctx.world_size)

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _gather_along(grad, fctx.dim, fctx.dctx), None, None


def copy_to_tensor_parallel(x: torch.Tensor, ctx: Any) -> torch.Tensor:
    """Identity forward, all-reduce sum of the gradient backward (f: enters a parallel region)."""
    return x if ctx.world_size == 1 else _CopyToTensorParallel.apply(x, ctx)


def reduce_from_tensor_parallel(x: torch.Tensor, ctx: Any) -> torch.Tensor:
    """All-reduce sum forward, identity backward (g: leaves a parallel region with partial sums)."""
    return x if ctx.world_size == 1 else _ReduceFromTensorParallel.apply(x, ctx)


def gather_from_tensor_parallel(x: torch.Tensor, ctx: Any, dim: int = -1) -> torch.Tensor:
    """All-gather the ranks' slices along ``dim`` forward; keep this rank's slice backward."""
    return x if ctx.world_size == 1 else _GatherFromTensorParallel.apply(x, ctx, dim)


def scatter_to_tensor_parallel(x: torch.Tensor, ctx: Any, dim: int = -1) -> torch.Tensor:
    """Keep this rank's slice along ``dim`` forward; all-gather the gradient slices backward."""
    return x if ctx.world_size == 1 else _ScatterToTensorParallel.apply(x, ctx, dim)
