"""What ZeRO and plain data-parallel ranks put in a sharded checkpoint, and how they take it back.

:func:`zero_state`/:func:`load_zero` save each rank's own part of a
:class:`~ddtk.parallel.zero.ZeroOptimizer`'s parameters and optimizer state;
:func:`dp_state`/:func:`load_dp` split a replicated model and optimizer 1/N per
rank, which spreads the writes, and read it all back on load. Both go through
:func:`~ddtk.checkpoint.sharded_save.save_sharded` and
:func:`~ddtk.checkpoint.sharded_load.load_sharded`, so they resume at any world size.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ddtk.checkpoint.sharded_load import load_sharded, restore_per_rank_rng
from ddtk.checkpoint.shards import (
    ShardedCheckpoint,
    ShardedState,
    ShardedTensor,
    clone_tensors,
    shard_range,
)
from ddtk.checkpoint.state import (
    CheckpointMismatchError,
    ResumableSampler,
    capture_rng,
    check_model_compatible,
)

__all__ = ["dp_state", "load_dp", "load_zero", "zero_state"]


def zero_state(
    opt: Any,
    *,
    rng: bool = True,
    replicated: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> ShardedState:
    """This rank's share of a :class:`~ddtk.parallel.zero.ZeroOptimizer`'s training state.

    Flat entries ``"params"`` (the unpadded flat parameters) and
    ``"optim.<key>"`` (each optimizer state tensor of the shard's size, e.g.
    Adam's ``exp_avg``); scalar state (Adam's ``step``) and the hyperparameters
    are replicated; the RNG states are per rank. Each rank saves the elements
    :func:`shard_range` gives it, which for stages 1 and 2 is the shard it owns.
    """
    ctx = opt.ctx
    lo, hi = shard_range(opt.numel, ctx.world_size, ctx.rank)
    own_lo = opt.shard_range[0]  # where the optimizer's state tensors start in the flat buffer
    flat = {"params": ShardedTensor(opt.flat[lo:hi].detach().clone(), lo, opt.numel)}
    scalars = {}
    sd = opt.optimizer.state_dict()
    for key, value in sd["state"].get(0, {}).items():
        if isinstance(value, torch.Tensor) and value.dim() == 1 and len(value) == opt.shard_numel:
            piece = value[lo - own_lo : hi - own_lo].detach().clone()
            flat[f"optim.{key}"] = ShardedTensor(piece, lo, opt.numel)
        else:
            scalars[key] = clone_tensors(value)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    shapes = [list(p.shape) for p in opt.params]
    rep = {"optim_scalars": scalars, "optim_groups": groups, **dict(replicated or {})}
    return ShardedState(
        flat=flat,
        replicated=rep,
        per_rank={"rng": capture_rng()} if rng else {},
        meta={"zero": {"stage": opt.stage, "shapes": shapes}, **dict(meta or {})},
    )


def load_zero(
    ctx: Any, source: str | os.PathLike[str], opt: Any, *, rng: bool = True
) -> ShardedCheckpoint:
    """Load :func:`zero_state`'s checkpoint into ``opt`` (any world size and stage).

    Every rank reads the full parameters and the optimizer state of its own
    shard. :class:`~ddtk.checkpoint.state.CheckpointMismatchError` names the
    parameters whose shapes differ.
    """
    lo, hi = opt.shard_range
    lo, hi = min(lo, opt.numel), min(hi, opt.numel)

    def ranges(name: str, numel: int) -> Any:
        return "full" if name == "params" else (min(lo, numel), min(hi, numel))

    ckpt = load_sharded(ctx, source, ranges=ranges)
    if "zero" not in ckpt.meta:
        raise CheckpointMismatchError(
            f"{ckpt.path} was not saved from a ZeroOptimizer (zero_state)"
        )
    saved = ckpt.meta["zero"]["shapes"]
    own = [list(p.shape) for p in opt.params]
    if saved != own:
        diff = [
            f"parameter {i}: checkpoint {_shape(a)} vs model {_shape(b)}"
            for i, (a, b) in enumerate(_zip_longest(saved, own))
            if a != b
        ]
        raise CheckpointMismatchError(
            "the checkpoint does not fit the optimizer's parameters: " + "; ".join(diff)
        )
    with torch.no_grad():
        opt.flat[: opt.numel].copy_(ckpt.flat["params"].local)
    state = dict(ckpt.replicated["optim_scalars"])
    for name, piece in ckpt.flat.items():
        if name.startswith("optim."):
            padded = torch.zeros(opt.shard_numel, dtype=piece.local.dtype)
            padded[: hi - lo] = piece.local
            state[name.removeprefix("optim.")] = padded
    groups = [dict(g, params=[0]) for g in ckpt.replicated["optim_groups"]]
    opt.optimizer.load_state_dict({"state": {0: state} if state else {}, "param_groups": groups})
    restore_per_rank_rng(ckpt, rng)
    return ckpt


def _shape(shape: list[int] | None) -> str:
    return "absent" if shape is None else str(tuple(shape))


def _zip_longest(a: list[Any], b: list[Any]) -> list[tuple[Any, Any]]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else None, b[i] if i < len(b) else None) for i in range(n)]


def dp_state(
    ctx: Any,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    sampler: ResumableSampler | None = None,
    *,
    rng: bool = True,
    meta: Mapping[str, Any] | None = None,
) -> ShardedState:
    """This rank's 1/N of a replicated (data-parallel) model and optimizer, for :func:`save_sharded`.

    Each tensor of the model's state dict becomes a flat entry ``"model.<key>"``
    and each optimizer state tensor shaped like its parameter ``"optim.<i>.<key>"``;
    rank ``r`` keeps only its :func:`shard_range` of each, so the N ranks write
    the model once between them. Scalar optimizer state, hyperparameters and the
    scheduler are replicated; the sampler position goes to ``meta``.
    """
    flat = {
        f"model.{k}": ShardedTensor.from_full(v, ctx.rank, ctx.world_size)
        for k, v in model.state_dict().items()
    }
    shapes = {f"model.{k}": list(v.shape) for k, v in model.state_dict().items()}
    rep: dict[str, Any] = {}
    if optimizer is not None:
        sd = optimizer.state_dict()
        scalars: dict[str, Any] = {}
        for i, st in sd["state"].items():
            for key, value in st.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    flat[f"optim.{i}.{key}"] = ShardedTensor.from_full(
                        value, ctx.rank, ctx.world_size
                    )
                    shapes[f"optim.{i}.{key}"] = list(value.shape)
                else:
                    scalars[f"{i}.{key}"] = clone_tensors(value)
        rep["optim_scalars"] = scalars
        rep["optim_groups"] = clone_tensors(sd["param_groups"])
    if scheduler is not None:
        rep["scheduler"] = clone_tensors(scheduler.state_dict())
    extra_meta = {"dp": {"shapes": shapes}, **dict(meta or {})}
    if sampler is not None:
        extra_meta["sampler"] = sampler.state_dict()
    return ShardedState(flat, rep, {"rng": capture_rng()} if rng else {}, extra_meta)


def load_dp(
    ctx: Any,
    source: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    sampler: ResumableSampler | None = None,
    *,
    rng: bool = True,
) -> ShardedCheckpoint:
    """Reassemble :func:`dp_state`'s checkpoint on every rank and restore it (any world size).

    Shapes are checked before anything changes:
    :class:`~ddtk.checkpoint.state.CheckpointMismatchError` names the keys.
    """
    ckpt = load_sharded(ctx, source, ranges="full")
    shapes = ckpt.meta["dp"]["shapes"]
    full = {n: t.local.reshape(shapes[n]) for n, t in ckpt.flat.items()}
    model_sd = {n.removeprefix("model."): t for n, t in full.items() if n.startswith("model.")}
    check_model_compatible(model, model_sd)
    for name, obj in (("optim_groups", optimizer), ("scheduler", scheduler)):
        if obj is not None and name not in ckpt.replicated:
            raise CheckpointMismatchError(
                f"the checkpoint holds no {name.removesuffix('_groups')} state"
            )
    model.load_state_dict(model_sd)
    if optimizer is not None:
        state: dict[int, dict[str, Any]] = {}
        for name, t in full.items():
            if name.startswith("optim."):
                i, key = name.removeprefix("optim.").split(".", 1)
                state.setdefault(int(i), {})[key] = t
        for ik, value in ckpt.replicated["optim_scalars"].items():
            i, key = ik.split(".", 1)
            state.setdefault(int(i), {})[key] = value
        optimizer.load_state_dict({"state": state, "param_groups": ckpt.replicated["optim_groups"]})
    if scheduler is not None:
        scheduler.load_state_dict(ckpt.replicated["scheduler"])
    if sampler is not None:
        sampler.load_state_dict(ckpt.meta["sampler"])
    restore_per_rank_rng(ckpt, rng)
    return ckpt
