"""Look inside PyTorch DDP: the Reducer's buckets, its flags, and its communication hooks.

Everything here runs the real ``torch.nn.parallel.DistributedDataParallel`` on
ranks started by :func:`ddtk.launch`, and observes it from the outside:

* :func:`bucket_trace` registers a communication hook that records every
  ``GradBucket`` the Reducer hands over (index, parameters, bytes) and then does
  the normal all-reduce, so the printed buckets are the ones really sent: one
  bucket in the first iteration (torch 2.x starts with a single bucket unless
  ``find_unused_parameters``), then the buckets rebuilt in the order gradients
  arrived, capped by ``bucket_cap_mb``.
* :func:`planned_buckets` asks ``torch.distributed._compute_bucket_assignment_by_size``
  (what DDP calls) for the assignment by size alone, without ranks.
* :func:`rebuilt_buckets` runs the same assignment in gradient-arrival order, as
  the Reducer's rebuild after the first iteration does (the figure of lecture 03).
  Both call a private torch function; ``tests/test_ddp_private_apis.py`` pins it.
* :func:`flag_demo` shows what ``gradient_as_bucket_view``, ``static_graph`` and
  ``find_unused_parameters`` change, measured on the live model.
* :func:`hook_benchmark` runs DDP with ``allreduce_hook``, ``fp16_compress_hook``,
  ``bf16_compress_hook`` (and PowerSGD on NCCL, see :data:`CPU_HOOKS`), counts the bytes each hook hands to
  ``torch.distributed.all_reduce`` and times the steps, next to the bytes the
  :mod:`ddtk.compression` compressors would send for the same gradients.

>>> [len(b) for b in planned_buckets([(100,), (100,), (300,)], cap_bytes=800)]
[1, 2]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "CPU_HOOKS",
    "HOOKS",
    "bucket_trace",
    "flag_demo",
    "hook_benchmark",
    "planned_buckets",
    "rebuilt_buckets",
    "run_bucket_trace",
    "run_flag_demo",
    "run_hook_benchmark",
    "run_tour",
    "tour",
]

HOOKS = ("allreduce", "fp16", "bf16", "powersgd")
# Run by default. With gloo on CPU (torch 2.13) powerSGD_hook blocked both ranks in a
# collective until the launch timed out, and batched_powerSGD_hook failed an assertion
# in _orthogonalize; it runs on NCCL, so it stays selectable for GPU runs.
CPU_HOOKS = ("allreduce", "fp16", "bf16")


def planned_buckets(shapes: Sequence[Sequence[int]], cap_bytes: int) -> list[list[int]]:
    """Parameter indices per bucket as DDP's size-based assignment makes them, last bucket first.

    DDP groups parameters in registration order by ``cap_bytes`` and reverses the
    bucket list, so bucket 0 holds the *last* layers: the gradients backward
    produces first. (Without ranks: float32 parameters of these shapes.)
    """
    params = [torch.empty(*s) for s in shapes]
    indices, _ = dist._compute_bucket_assignment_by_size(params, [cap_bytes], [False] * len(params))
    return list(reversed(indices))


def rebuilt_buckets(
    shapes: Sequence[Sequence[int]], cap_bytes: int, first_cap_bytes: int | None = None
) -> list[list[int]]:
    """Parameter indices per bucket after DDP's rebuild, bucket 0 first, for gradients arriving in reverse order.

    After the first iteration the Reducer re-runs the same size-based assignment on
    the parameters in the order their gradients arrived (here: reverse registration
    order, as a plain sequential backward produces them), with the first bucket
    capped at ``first_cap_bytes`` (1 MiB when ``bucket_cap_mb`` is left at its
    default, else ``cap_bytes``). Float32 parameters of these shapes.

    >>> rebuilt_buckets([(100,), (100,), (300,)], cap_bytes=800)
    [[2], [1, 0]]
    """
    first = cap_bytes if first_cap_bytes is None else first_cap_bytes
    arrival = list(reversed(range(len(shapes))))
    params = [torch.empty(*shapes[i]) for i in arrival]
    indices, _ = dist._compute_bucket_assignment_by_size(
        params, [first, cap_bytes], [False] * len(params)
    )
    return [[arrival[i] for i in bucket] for bucket in indices]


def _record_hook(log: list[dict]) -> Callable:
    """An all-reduce comm hook that also records the bucket it was given."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future:
        log.append({
            "index": bucket.index(),
            "numel": bucket.buffer().numel(),
            "bytes": bucket.buffer().numel() * bucket.buffer().element_size(),
            "params": [id(p) for p in bucket.parameters()],
        })  # fmt: skip
        return allreduce_hook(state, bucket)

    # DDP checks the annotations as objects; this module's are strings (PEP 563).
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}  # fmt: skip
    return hook


def _batch(seed: int, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    from ddtk.data import load_dataset

    ds = load_dataset("digits")
    idx = torch.randperm(len(ds.x), generator=torch.Generator().manual_seed(seed))[:n]
    return ds.x[idx], ds.y[idx]


def bucket_trace(
    ctx: Any, bucket_cap_mb: float = 0.02, steps: int = 2, model: str = "resnet"
) -> dict:
    """In a rank: the buckets DDP's Reducer really sent, per iteration, with parameter names."""
    from ddtk.models import build_model

    net = build_model(model, seed=0)
    names = {id(p): n for n, p in net.named_parameters()}
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=bucket_cap_mb)
    log: list[dict] = []
    ddp.register_comm_hook(None, _record_hook(log))
    x, y = _batch(ctx.rank)
    per_step = []
    for _ in range(steps):
        log.clear()
        ddp.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        per_step.append([
            {**b, "params": [names[i] for i in b["params"]]} for b in sorted(log, key=lambda b: b["index"])
        ])  # fmt: skip
    order = [n for n, _ in net.named_parameters()]
    return {
        "steps": per_step,
        "registration_order": order,
        "bucket_cap_bytes": ddp.bucket_bytes_cap,
    }


class _Branchy(nn.Module):
    """Two heads; ``use_b=False`` leaves head ``b`` out of the graph (an unused parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(64, 32)
        self.a = nn.Linear(32, 10)
        self.b = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor, use_b: bool = True) -> torch.Tensor:
        h = torch.relu(self.body(x.flatten(1)))
        return self.a(h) + (self.b(h) if use_b else 0)


def _grad_storage(model: nn.Module) -> tuple[int, int]:
    """(bytes of all gradients, number of distinct storages they live in)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    ptrs = {g.untyped_storage().data_ptr() for g in grads}
    return sum(g.numel() * g.element_size() for g in grads), len(ptrs)


def flag_demo(ctx: Any) -> dict:
    """In a rank: ``gradient_as_bucket_view``, ``find_unused_parameters``, ``static_graph``, live."""
    from ddtk.models import build_model

    out: dict[str, Any] = {}
    x, y = _batch(ctx.rank)
    for view in (False, True):
        net = build_model("resnet", seed=0)
        ddp = nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=view)
        for _ in range(2):
            ddp.zero_grad(set_to_none=False)
            nn.functional.cross_entropy(ddp(x), y).backward()
        out[f"gradient_as_bucket_view={view}"] = _grad_storage(net)
    # An unused parameter: without find_unused_parameters the Reducer waits for it forever
    # and the next iteration refuses to start.
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(_Branchy())
    try:
        for _ in range(2):
            ddp(x, use_b=False).sum().backward()
        out["unused_without_flag"] = "no error"
    except RuntimeError as e:
        out["unused_without_flag"] = str(e).split("\n")[0]
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(_Branchy(), find_unused_parameters=True)
    start = time.perf_counter()
    for _ in range(5):
        ddp.zero_grad()
        ddp(x, use_b=False).sum().backward()
    out["unused_with_flag_ms"] = 1e3 * (time.perf_counter() - start) / 5
    out["unused_grad_is_none"] = ddp.module.b.weight.grad is None
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(_Branchy(), static_graph=True)
    for _ in range(3):
        ddp.zero_grad()
        ddp(x, use_b=False).sum().backward()
    out["static_graph_ok"] = True
    return out


def _count_all_reduce(log: list[int]) -> Callable[[], None]:
    """Wrap ``dist.all_reduce`` to log the bytes of every tensor handed to it; returns the undo."""
    original = dist.all_reduce

    def counting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        log.append(tensor.numel() * tensor.element_size())
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting
    return lambda: setattr(dist, "all_reduce", original)


def _register(ddp: nn.parallel.DistributedDataParallel, name: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "allreduce":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
            min_compression_rate=1.0,
        )  # fmt: skip
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        raise ValueError(f"hook must be one of {HOOKS}, got {name!r}")


def hook_benchmark(
    ctx: Any, hooks: Sequence[str] = CPU_HOOKS, steps: int = 10, warmup: int = 3,
    specs: Sequence[str] = ("none", "int8", "powersgd:2"),
) -> dict:  # fmt: skip
    """In a rank: bytes handed to all_reduce and ms per step for each DDP comm hook.

    PowerSGD starts compressing at iteration ``start_powerSGD_iter`` = 2, so the
    warm-up covers its plain all-reduce phase. ``specs`` are :mod:`ddtk.compression`
    compressors applied to the same gradients (per tensor) for their wire bytes.
    """
    from ddtk.compression import get_compressor
    from ddtk.models import build_model

    x, y = _batch(ctx.rank, n=32)
    rows = []
    grads: list[torch.Tensor] = []
    for name in hooks:
        net = build_model("resnet", seed=0)
        ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.05)
        try:
            _register(ddp, name)
        except (TypeError, RuntimeError) as e:  # bf16 needs NCCL 2.10+ on CUDA: refused on gloo
            rows.append({"method": f"DDP hook: {name}", "bytes_per_step": None,
                         "ms_per_step": None, "loss": None, "error": str(e)})  # fmt: skip
            continue
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        log: list[int] = []
        undo = _count_all_reduce(log)
        try:
            for i in range(warmup + steps):
                if i == warmup:
                    log.clear()
                    start = time.perf_counter()
                opt.zero_grad()
                loss = nn.functional.cross_entropy(ddp(x), y)
                loss.backward()
                opt.step()
            seconds = time.perf_counter() - start
        finally:
            undo()
        if name == "allreduce":
            grads = [p.grad.detach().clone() for p in net.parameters()]
        rows.append({"method": f"DDP hook: {name}", "bytes_per_step": sum(log) / steps,
                     "ms_per_step": 1e3 * seconds / steps, "loss": loss.item()})  # fmt: skip
    for spec in specs:
        comp = get_compressor(spec)
        nbytes = sum(comp.compress(g, key=k).nbytes for k, g in enumerate(grads))
        rows.append({"method": f"ddtk.compression: {spec}", "bytes_per_step": float(nbytes),
                     "ms_per_step": None, "loss": None})  # fmt: skip
    return {"rows": rows, "parameters": sum(g.numel() for g in grads)}


def tour(ctx: Any, bucket_cap_mb: float = 0.02, steps: int = 10) -> dict:
    """In a rank: :func:`bucket_trace`, :func:`flag_demo` and :func:`hook_benchmark` in one launch."""
    return {"buckets": bucket_trace(ctx, bucket_cap_mb), "flags": flag_demo(ctx),
            "hooks": hook_benchmark(ctx, steps=steps)}  # fmt: skip


def run_tour(world_size: int = 2, bucket_cap_mb: float = 0.02, steps: int = 10) -> dict:
    """:func:`tour` on ``world_size`` local ranks (one start-up for all three demos); rank 0's result."""
    import ddtk

    return ddtk.launch(tour, world_size, kwargs={"bucket_cap_mb": bucket_cap_mb, "steps": steps},
                       backend="gloo", echo=False, timeout=180)[0]  # fmt: skip


def run_bucket_trace(world_size: int = 2, bucket_cap_mb: float = 0.02, steps: int = 2) -> dict:
    """:func:`bucket_trace` on ``world_size`` ranks; rank 0's result."""
    import ddtk

    return ddtk.launch(bucket_trace, world_size, kwargs={"bucket_cap_mb": bucket_cap_mb, "steps": steps},
                       backend="gloo", echo=False, timeout=120)[0]  # fmt: skip


def run_flag_demo(world_size: int = 2) -> dict:
    """:func:`flag_demo` on ``world_size`` ranks; rank 0's result."""
    import ddtk

    return ddtk.launch(flag_demo, world_size, backend="gloo", echo=False, timeout=120)[0]


def run_hook_benchmark(
    world_size: int = 2, steps: int = 10, hooks: Sequence[str] = CPU_HOOKS
) -> dict:
    """:func:`hook_benchmark` on ``world_size`` ranks; rank 0's result."""
    import ddtk

    return ddtk.launch(hook_benchmark, world_size, kwargs={"steps": steps, "hooks": tuple(hooks)},
                       backend="gloo", echo=False, timeout=180)[0]  # fmt: skip
