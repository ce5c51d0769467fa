"""Tensor parallelism (Megatron-LM style): one layer's weight matrices split across ranks.

Data parallelism copies the whole model to every rank; when one layer's weights
do not fit, or one layer's matmul is too slow, the matrices themselves are cut:

* :class:`ColumnParallelLinear` splits the weight ``A`` (``out x in``) by output
  features: rank ``r`` holds rows ``r*out/n .. (r+1)*out/n`` and computes that
  slice of the output. Its input must be the full activation on every rank.
* :class:`RowParallelLinear` splits ``A`` by input features: rank ``r`` multiplies
  its slice of the input by its columns of ``A``, giving a partial sum of the
  full output; an all-reduce adds the partial sums, then the bias is added once.
* :class:`TensorParallelMLP` chains them, column then elementwise activation then
  row, so the hidden activation stays split and never travels: the block costs
  exactly one all-reduce forward (after the row layer) and one backward (of the
  input gradient, before the column layer), each of a ``tokens x hidden`` tensor.
  :func:`tp_mlp_comm_bytes` gives the bytes per rank per step this costs.

Every rank sees the same input batch. The collectives sit in autograd functions
(:mod:`ddtk.parallel.tensor_ops`), so ``loss.backward()`` leaves each rank with
the gradient of its own shard and any optimizer steps the shards as usual.
Layers built from sizes draw the full weight from a seeded generator on every
rank (:func:`seeded_linear`) and keep their shard, so all ranks agree.

>>> import ddtk, torch
>>> from ddtk.parallel.tensor import TensorParallelMLP, dense_mlp
>>> def work(ctx):
...     dense = dense_mlp(hidden=8, seed=0)                   # 8 -> 32 -> 8, as one process
...     tp = TensorParallelMLP.from_mlp(ctx, dense[0], dense[2])  # 8 -> 16 -> 8 on each rank
...     x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
...     return torch.allclose(tp(x), dense(x), atol=1e-6), tuple(tp.fc1.weight.shape)
>>> ddtk.launch(work, world_size=2, timeout=120)
[(True, (16, 8)), (True, (16, 8))]
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ddtk.parallel.tensor_ops import (
    copy_to_tensor_parallel,
    gather_from_tensor_parallel,
    reduce_from_tensor_parallel,
    scatter_to_tensor_parallel,
    split_along,
)

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TensorParallelMLP",
    "dense_mlp",
    "seeded_linear",
    "tp_mlp_comm_bytes",
]


def seeded_linear(
    in_features: int, out_features: int, bias: bool = True, seed: int = 0
) -> nn.Linear:
    """``nn.Linear`` initialised after ``torch.manual_seed(seed)``, leaving the global RNG untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(in_features, out_features, bias=bias)


def dense_mlp(
    hidden: int,
    ffn_hidden: int | None = None,
    bias: bool = True,
    activation: nn.Module | None = None,
    seed: int = 0,
) -> nn.Sequential:
    """The single-process MLP ``Linear -> activation -> Linear`` that :class:`TensorParallelMLP` shards.

    ``ffn_hidden`` defaults to ``4 * hidden``; the activation to GELU. ``TensorParallelMLP(ctx,
    hidden, ffn_hidden, bias, activation, seed)`` holds shards of exactly these weights.
    """
    ffn = 4 * hidden if ffn_hidden is None else ffn_hidden
    fc1 = seeded_linear(hidden, ffn, bias, seed)
    fc2 = seeded_linear(ffn, hidden, bias, seed + 1)
    return nn.Sequential(fc1, nn.GELU() if activation is None else activation, fc2)


def tp_mlp_comm_bytes(
    batch_tokens: int, hidden: int, world_size: int, dtype_bytes: int = 4
) -> float:
    """Bytes one rank sends in one forward + backward of :class:`TensorParallelMLP` (ring all-reduce).

    Two all-reduces of a ``batch_tokens x hidden`` activation (forward after the row
    layer, backward of the input gradient), each sending ``2(n-1)/n`` of the tensor
    per rank. Exact when ``batch_tokens * hidden`` is divisible by ``world_size``;
    otherwise ring chunks differ by one element and a rank's bytes differ slightly.
    """
    if min(batch_tokens, hidden, world_size, dtype_bytes) < 1:
        raise ValueError("batch_tokens, hidden, world_size and dtype_bytes must be positive")
    size = batch_tokens * hidden * dtype_bytes
    return 2 * 2 * (world_size - 1) * size / world_size


def _check_sizes(ctx: Any, split_name: str, **sizes: int) -> None:
    """Raise ValueError unless every size is a positive int and ``sizes[split_name]`` divides evenly."""
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if sizes[split_name] % ctx.world_size:
        raise ValueError(
            f"{split_name}={sizes[split_name]} is split across {ctx.world_size} ranks, "
            f"so it must be divisible by the world size {ctx.world_size}"
        )


def _check_input(x: torch.Tensor, width: int, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} expects a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0 or x.shape[-1] != width:
        raise ValueError(
            f"{what} expects inputs whose last dimension is {width}, got shape {tuple(x.shape)}"
        )


def _param(t: torch.Tensor, ctx: Any) -> nn.Parameter:
    return nn.Parameter(t.detach().to(ctx.device, copy=True).contiguous())


class _ShardedLinear(nn.Module):
    """What the column and row layers share: checked sizes, then a shard of a full linear."""

    _split: str  # the dimension split across ranks: "out_features" or "in_features"

    def _setup(
        self, ctx: Any, in_features: int, out_features: int, linear: Any, flag: bool
    ) -> None:
        """Check the sizes first, then build ``linear()`` and keep this rank's shard of it."""
        _check_sizes(ctx, self._split, in_features=in_features, out_features=out_features)
        self._load(ctx, linear(), flag)

    @classmethod
    def _from(cls, ctx: Any, linear: nn.Linear, flag: bool) -> Any:
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._setup(ctx, linear.in_features, linear.out_features, lambda: linear, flag)
        return layer

    def _load(self, ctx: Any, linear: nn.Linear, flag: bool) -> None:
        raise NotImplementedError


class ColumnParallelLinear(_ShardedLinear):
    """``Linear(in_features, out_features)`` with the output features split across ranks.

    Rank ``r`` holds ``weight`` rows and ``bias`` entries ``r*out/n .. (r+1)*out/n``
    and returns that slice of the output, or the full output with
    ``gather_output=True`` (an all-gather). The input gradient is all-reduced.

    >>> import ddtk, torch
    >>> from ddtk.parallel.tensor import ColumnParallelLinear, seeded_linear
    >>> def work(ctx):
    ...     full = seeded_linear(3, 4, seed=0)
    ...     col = ColumnParallelLinear.from_linear(ctx, full, gather_output=True)
    ...     x = torch.ones(2, 3)
    ...     return tuple(col.weight.shape), torch.allclose(col(x), full(x))
    >>> ddtk.launch(work, world_size=2, timeout=120)
    [((2, 3), True), ((2, 3), True)]
    """

    _split = "out_features"

    def __init__(
        self,
        ctx: Any,
        in_features: int,
        out_features: int,
        bias: bool = True,
        gather_output: bool = False,
        seed: int = 0,
    ):
        super().__init__()
        make = lambda: seeded_linear(in_features, out_features, bias, seed)  # noqa: E731
        self._setup(ctx, in_features, out_features, make, gather_output)

    @classmethod
    def from_linear(
        cls, ctx: Any, linear: nn.Linear, gather_output: bool = False
    ) -> ColumnParallelLinear:
        """This rank's shard of a full ``nn.Linear`` (the same ``linear`` on every rank)."""
        return cls._from(ctx, linear, gather_output)

    def _load(self, ctx: Any, linear: nn.Linear, gather_output: bool) -> None:
        self.ctx, self.gather_output = ctx, gather_output
        self.in_features, self.out_features = linear.in_features, linear.out_features
        n, r = ctx.world_size, ctx.rank
        self.weight = _param(split_along(linear.weight, 0, r, n), ctx)
        bias = None if linear.bias is None else _param(split_along(linear.bias, 0, r, n), ctx)
        self.register_parameter("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input(x, self.in_features, "ColumnParallelLinear")
        y = F.linear(copy_to_tensor_parallel(x, self.ctx), self.weight, self.bias)
        return gather_from_tensor_parallel(y, self.ctx) if self.gather_output else y

    def to_linear(self) -> nn.Linear:
        """The full ``nn.Linear``, gathered from every rank's shard (a collective: call on all ranks)."""
        return _full_linear(self, dim=0, bias_split=True)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features} "
            f"({self.weight.shape[0]} here), gather_output={self.gather_output}"
        )


class RowParallelLinear(_ShardedLinear):
    """``Linear(in_features, out_features)`` with the input features split across ranks.

    Rank ``r`` holds ``weight`` columns ``r*in/n .. (r+1)*in/n`` and expects that
    slice of the input (``input_is_parallel=True``, e.g. a column layer's output)
    or splits the full input itself. Partial products are all-reduced; the bias,
    the same on every rank, is added once after the reduction.

    >>> import ddtk, torch
    >>> from ddtk.parallel.tensor import RowParallelLinear, seeded_linear
    >>> def work(ctx):
    ...     full = seeded_linear(4, 3, seed=0)
    ...     row = RowParallelLinear.from_linear(ctx, full, input_is_parallel=False)
    ...     x = torch.ones(2, 4)
    ...     return tuple(row.weight.shape), torch.allclose(row(x), full(x))
    >>> ddtk.launch(work, world_size=2, timeout=120)
    [((3, 2), True), ((3, 2), True)]
    """

    _split = "in_features"

    def __init__(
        self,
        ctx: Any,
        in_features: int,
        out_features: int,
        bias: bool = True,
        input_is_parallel: bool = True,
        seed: int = 0,
    ):
        super().__init__()
        make = lambda: seeded_linear(in_features, out_features, bias, seed)  # noqa: E731
        self._setup(ctx, in_features, out_features, make, input_is_parallel)

    @classmethod
    def from_linear(
        cls, ctx: Any, linear: nn.Linear, input_is_parallel: bool = True
    ) -> RowParallelLinear:
        """This rank's shard of a full ``nn.Linear`` (the same ``linear`` on every rank)."""
        return cls._from(ctx, linear, input_is_parallel)

    def _load(self, ctx: Any, linear: nn.Linear, input_is_parallel: bool) -> None:
        self.ctx, self.input_is_parallel = ctx, input_is_parallel
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = _param(split_along(linear.weight, 1, ctx.rank, ctx.world_size), ctx)
        self.register_parameter("bias", None if linear.bias is None else _param(linear.bias, ctx))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_is_parallel:
            _check_input(x, self.weight.shape[1], "RowParallelLinear (input_is_parallel=True)")
        else:
            _check_input(x, self.in_features, "RowParallelLinear")
            x = scatter_to_tensor_parallel(x, self.ctx)
        y = reduce_from_tensor_parallel(F.linear(x, self.weight), self.ctx)
        return y if self.bias is None else y + self.bias

    def to_linear(self) -> nn.Linear:
        """The full ``nn.Linear``, gathered from every rank's shard (a collective: call on all ranks)."""
        return _full_linear(self, dim=1, bias_split=False)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features} ({self.weight.shape[1]} here), "
            f"out_features={self.out_features}, input_is_parallel={self.input_is_parallel}"
        )


def _full_linear(
    layer: ColumnParallelLinear | RowParallelLinear, dim: int, bias_split: bool
) -> nn.Linear:
    ctx, has_bias = layer.ctx, layer.bias is not None
    full = nn.Linear(layer.in_features, layer.out_features, bias=has_bias, device=ctx.device)
    with torch.no_grad():
        full.weight.copy_(torch.cat(ctx.all_gather(layer.weight.detach()), dim=dim))
        if has_bias:
            b = layer.bias.detach()
            full.bias.copy_(torch.cat(ctx.all_gather(b)) if bias_split else b)
    return full


class TensorParallelMLP(nn.Module):
    """The transformer MLP block ``Linear -> activation -> Linear``, tensor parallel.

    ``fc1`` is a :class:`ColumnParallelLinear` (``hidden -> ffn_hidden``, output
    kept split), ``fc2`` a :class:`RowParallelLinear` (``ffn_hidden -> hidden``,
    input already split). The activation must be elementwise (GELU by default),
    so applying it to each slice equals applying it to the whole. ``ffn_hidden``
    (default ``4 * hidden``) must be divisible by the world size. Built from sizes,
    it holds shards of ``dense_mlp(hidden, ffn_hidden, bias, activation, seed)``.
    """

    def __init__(
        self,
        ctx: Any,
        hidden: int,
        ffn_hidden: int | None = None,
        bias: bool = True,
        activation: nn.Module | None = None,
        seed: int = 0,
    ):
        super().__init__()
        ffn = 4 * hidden if ffn_hidden is None else ffn_hidden
        _check_sizes(ctx, "ffn_hidden", hidden=hidden, ffn_hidden=ffn)
        fc1, act, fc2 = dense_mlp(hidden, ffn, bias, activation, seed)
        self._load(ctx, fc1, act, fc2)

    @classmethod
    def from_mlp(
        cls, ctx: Any, fc1: nn.Linear, fc2: nn.Linear, activation: nn.Module | None = None
    ) -> TensorParallelMLP:
        """Shard a single-process MLP's two ``nn.Linear`` layers (the same on every rank)."""
        if fc1.out_features != fc2.in_features or fc2.out_features != fc1.in_features:
            raise ValueError(
                f"fc1 ({fc1.in_features} -> {fc1.out_features}) and fc2 ({fc2.in_features} -> "
                f"{fc2.out_features}) do not form a hidden -> ffn_hidden -> hidden MLP"
            )
        _check_sizes(ctx, "ffn_hidden", hidden=fc1.in_features, ffn_hidden=fc1.out_features)
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block._load(ctx, fc1, nn.GELU() if activation is None else activation, fc2)
        return block

    def _load(self, ctx: Any, fc1: nn.Linear, act: nn.Module, fc2: nn.Linear) -> None:
        self.ctx = ctx
        self.fc1 = ColumnParallelLinear.from_linear(ctx, fc1, gather_output=False)
        self.act = act
        self.fc2 = RowParallelLinear.from_linear(ctx, fc2, input_is_parallel=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def to_mlp(self) -> nn.Sequential:
        """The full single-process MLP, gathered from the shards (a collective: call on all ranks)."""
        return nn.Sequential(self.fc1.to_linear(), self.act, self.fc2.to_linear())
