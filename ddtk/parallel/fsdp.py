"""The production peer of :mod:`ddtk.parallel.zero`: PyTorch's FSDP2 (``fully_shard``).

FSDP2 is ZeRO stage 3: parameters, gradients and optimizer state are all
sharded. Each parameter becomes a ``DTensor`` split along dim 0 over a
``DeviceMesh`` (uneven splits allowed, no padding to a flat buffer); forward and
backward all-gather a module's parameters just in time and free them after, and
gradients are reduce-scattered (averaged) straight into the shards. A plain
``torch.optim`` optimizer built over the sharded parameters then keeps sharded
state, so the training is the same as data parallelism with that optimizer.

Where it runs: in torch 2.13 FSDP2 runs on CPU with the gloo backend inside
:func:`ddtk.launch` (a one-dimensional mesh ``init_device_mesh("cpu", (world,))``
over the process group the launch set up), and on CUDA with NCCL. Earlier
torch releases (2.4, 2.5) have it as ``torch.distributed._composable.fsdp``;
:func:`fsdp_supported` finds either, and says why not when it cannot.

>>> import ddtk, torch
>>> from ddtk.parallel.fsdp import fsdp_supported, run_fsdp_peer
>>> fsdp_supported("cpu")[0]
True
>>> def peer(ctx):
...     torch.manual_seed(0)
...     model = torch.nn.Linear(4, 3)                      # 15 parameters
...     batches = [(torch.ones(2, 4) * (ctx.rank + 1), torch.tensor([0, 2]))]
...     run = run_fsdp_peer(ctx, model, batches, torch.optim.Adam, lr=0.1)
...     return run.parameters.numel(), run.parameter_bytes, run.state_bytes
>>> ddtk.launch(peer, world_size=2, echo=False, timeout=120)
[(15, 40, 88), (15, 20, 48)]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["FSDPRun", "fsdp_supported", "fully_shard_fn", "local_nbytes", "run_fsdp_peer"]


def fully_shard_fn() -> Callable[..., Any] | None:
    """PyTorch's ``fully_shard`` (FSDP2) from wherever this torch keeps it, or None."""
    try:
        from torch.distributed.fsdp import fully_shard

        return fully_shard
    except ImportError:
        pass
    try:
        from torch.distributed._composable.fsdp import fully_shard

        return fully_shard
    except ImportError:
        return None


def fsdp_supported(device: str | torch.device = "cpu") -> tuple[bool, str]:
    """Whether FSDP2 can run on ``device`` (``"cpu"`` with gloo, ``"cuda"`` with NCCL), and why (not).

    >>> fsdp_supported("cuda")[0] == torch.cuda.is_available()
    True
    """
    kind = torch.device(device).type
    import torch.distributed as dist

    if not dist.is_available():
        return False, f"torch {torch.__version__} was built without torch.distributed"
    if fully_shard_fn() is None:
        return False, f"torch {torch.__version__} has no FSDP2 fully_shard (it needs torch >= 2.4)"
    if kind == "cpu":
        if not dist.is_gloo_available():
            return False, f"torch {torch.__version__} was built without the gloo backend"
        return True, f"FSDP2 runs on CPU with gloo in torch {torch.__version__}"
    if kind == "cuda":
        if not torch.cuda.is_available():
            return False, "FSDP2 on cuda needs a CUDA GPU; this machine has none"
        if not dist.is_nccl_available():
            return False, f"torch {torch.__version__} was built without NCCL"
        return True, f"FSDP2 runs on CUDA with NCCL in torch {torch.__version__}"
    return False, f"device type {kind!r} is not covered here; use 'cpu' or 'cuda'"


def local_nbytes(tensors: Iterable[Any]) -> int:
    """Bytes this rank holds for ``tensors``: a DTensor counts its local shard only."""
    total = 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.nbytes
    return total


@dataclass
class FSDPRun:
    """What :func:`run_fsdp_peer` measured on one rank."""

    parameters: torch.Tensor  # the full parameters after training, flattened (same on every rank)
    parameter_bytes: int  # local shards of the parameters
    gradient_bytes: int  # local shards of the gradients after the last backward
    state_bytes: int  # local shards of the optimizer state
    step_seconds: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def run_fsdp_peer(
    ctx: Any,
    model: nn.Module,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    optimizer_cls: type[torch.optim.Optimizer] = torch.optim.Adam,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
    **optimizer_kwargs: Any,
) -> FSDPRun:
    """Shard ``model`` with FSDP2 over all ranks and take one optimiser step per local batch.

    ``model`` must hold the same initial weights on every rank (FSDP2 keeps each
    rank's slice of its local copy). It runs on ``ctx.device`` (CPU with gloo, or the
    rank's GPU with NCCL). Raises RuntimeError with the reason where FSDP2 cannot run.
    """
    ok, reason = fsdp_supported(ctx.device)
    if not ok:
        raise RuntimeError(f"FSDP2 cannot run here: {reason}")
    if not batches:
        raise ValueError("batches is empty: give at least one (inputs, targets) pair")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    model = model.to(ctx.device)
    fully_shard_fn()(model, mesh=mesh)
    opt = optimizer_cls(model.parameters(), **optimizer_kwargs)
    run = FSDPRun(torch.empty(0), 0, 0, 0)
    for x, y in batches:
        start = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x.to(ctx.device)), y.to(ctx.device))
        loss.backward()
        opt.step()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        run.step_seconds.append(time.perf_counter() - start)
        run.losses.append(float(loss.detach()))
    params = list(model.parameters())
    run.parameter_bytes = local_nbytes(params)
    run.gradient_bytes = local_nbytes(p.grad for p in params)
    run.state_bytes = local_nbytes(t for s in opt.state.values() for t in s.values())
    run.parameters = torch.cat([
        (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1) for p in params
    ]).cpu()  # fmt: skip
    return run
