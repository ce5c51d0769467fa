"""Reduction operators and how to combine two tensors with them.

Every collective that reduces (reduce, reduce_scatter, all_reduce) does so with
:func:`combine_`, which folds an incoming tensor into an accumulator in place.
All the operators here are commutative and IEEE addition and multiplication are
commutative bit for bit, so two ranks that combine the same pair of partial
results get identical bits, whatever order they see them in.
"""

from __future__ import annotations

import enum

import torch


class ReduceOp(enum.Enum):
    """The reductions a collective can apply (the names torch.distributed uses)."""

    SUM = "sum"
    AVERAGE = "average"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"

    @classmethod
    def parse(cls, op: ReduceOp | str) -> ReduceOp:
        """Accept a ReduceOp or its name (``"sum"``, ``"AVG"``...); raise ValueError otherwise."""
        if isinstance(op, ReduceOp):
            return op
        if isinstance(op, str):
            key = op.strip().upper()
            key = {"AVG": "AVERAGE", "MEAN": "AVERAGE", "PROD": "PRODUCT"}.get(key, key)
            if key in cls.__members__:
                return cls[key]
        names = ", ".join(cls.__members__)
        raise ValueError(f"unknown reduce op {op!r}; expected one of {names}")


def check_op_dtype(op: ReduceOp, dtype: torch.dtype) -> None:
    """Refuse combinations that cannot be computed faithfully, before any message is sent."""
    if op is ReduceOp.AVERAGE and not (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(
            f"ReduceOp.AVERAGE needs a floating-point tensor, got {dtype}: an integer "
            "average would be silently truncated. Convert to float first, or use SUM."
        )
    if dtype is torch.bool and op in (ReduceOp.SUM, ReduceOp.PRODUCT):
        raise TypeError(
            f"ReduceOp.{op.name} is not defined for bool tensors; use MIN (and) or MAX (or)"
        )


def private_copy(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A contiguous copy of ``tensor`` on ``device``, outside autograd, for an algorithm to overwrite.

    The same as ``tensor.detach().to(device=device, copy=True).contiguous()``, which
    costs a microsecond more in argument parsing alone: that is a twentieth of a
    4-byte all-reduce over shared memory.
    """
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.device != device:
        return tensor.to(device=device).contiguous()
    return tensor.clone() if tensor.is_contiguous() else tensor.contiguous()


def combine_(acc: torch.Tensor, incoming: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """Fold ``incoming`` into ``acc`` in place and return ``acc``.

    AVERAGE combines like SUM; the division by the world size happens once, at
    the end (:func:`finish_`), so every algorithm rounds the same way.
    """
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        return acc.add_(incoming)
    if op is ReduceOp.PRODUCT:
        return acc.mul_(incoming)
    if op is ReduceOp.MIN:
        return torch.minimum(acc, incoming, out=acc)
    if op is ReduceOp.MAX:
        return torch.maximum(acc, incoming, out=acc)
    raise ValueError(f"unsupported op {op}")


def combine_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """Write ``a (op) b`` into ``out`` without touching ``a`` or ``b``: one pass over memory."""
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        return torch.add(a, b, out=out)
    if op is ReduceOp.PRODUCT:
        return torch.mul(a, b, out=out)
    if op is ReduceOp.MIN:
        return torch.minimum(a, b, out=out)
    if op is ReduceOp.MAX:
        return torch.maximum(a, b, out=out)
    raise ValueError(f"unsupported op {op}")


def finish_(result: torch.Tensor, op: ReduceOp, world_size: int) -> torch.Tensor:
    """Apply the last step of an op after all contributions are combined (AVERAGE divides)."""
    if op is ReduceOp.AVERAGE and world_size > 1:
        result.div_(world_size)
    return result


def reference_reduce(tensors: list[torch.Tensor], op: ReduceOp | str) -> torch.Tensor:
    """Single-process reference: reduce a list of tensors left to right.

    Tests compare every distributed algorithm with this function.
    """
    op = ReduceOp.parse(op)
    if not tensors:
        raise ValueError("reference_reduce needs at least one tensor")
    check_op_dtype(op, tensors[0].dtype)
    acc = tensors[0].clone()
    for t in tensors[1:]:
        combine_(acc, t, op)
    return finish_(acc, op, len(tensors))
