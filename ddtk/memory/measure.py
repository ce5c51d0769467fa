"""Honest memory measurements on CPU: saved activations, tensors, optimiser state, peak.

What a training step keeps in memory has four parts: parameters, gradients,
optimiser state and the activations autograd saves for backward. The first
three are plain tensors that can be summed. Activations are measured with
``torch.autograd.graph.saved_tensors_hooks``: every tensor an operation saves
for backward passes through the pack hook, and :func:`record_saved_tensors`
notes its storage. A storage is counted once however many operations save it
(a ReLU output that the next Linear also saves costs its bytes once), and the
whole storage counts even when only a view of it is saved, because that is the
memory held. Parameters (and anything else passed as ``exclude``) are left
out: they are saved too, but they live anyway.

The peak of a forward and backward pass is measured by
:func:`peak_memory_bytes`: on CUDA with ``torch.cuda.max_memory_allocated``;
on CPU with the profiler (``profile_memory=True``), replaying every allocation
and free the CPU allocator reported during the step in time order, so the peak
is the largest sum of live bytes allocated during it (tensors that existed
before the step, such as the parameters, are not included; gradients created by
the step are).

>>> import torch
>>> from ddtk.memory.measure import saved_activation_bytes, tensor_bytes
>>> lin = torch.nn.Linear(100, 10)
>>> x = torch.randn(32, 100)
>>> saved_activation_bytes(lambda: torch.relu(lin(x)).sum(), exclude=lin.parameters())
14080
>>> 32 * 100 * 4 + 32 * 10 * 4   # the Linear keeps its input, the ReLU its output
14080
>>> tensor_bytes(lin.parameters())
4040
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "SavedTensor",
    "optimizer_state_bytes",
    "peak_memory_bytes",
    "record_saved_tensors",
    "retained_bytes",
    "saved_activation_bytes",
    "tensor_bytes",
    "timed",
]


@dataclass(frozen=True)
class SavedTensor:
    """One storage saved for backward: the shape and dtype of the first tensor seen on it, its bytes."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def record_saved_tensors(
    fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()
) -> tuple[Any, list[SavedTensor]]:
    """Run ``fn()`` and list the distinct storages autograd saved for backward during it.

    Returns ``(fn's result, saved)``. Keep the result alive if you want to call
    backward on it: the saved tensors are untouched (the hooks only look).
    Storages shared with a tensor in ``exclude`` (usually ``model.parameters()``)
    are not listed.
    """
    skip = {_storage_key(t) for t in exclude}
    seen: dict[tuple[str, int], SavedTensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in skip and key not in seen and t.untyped_storage().nbytes() > 0:
            seen[key] = SavedTensor(tuple(t.shape), t.dtype, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, list(seen.values())


def saved_activation_bytes(fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd saves for backward while running ``fn()``.

    Pass ``exclude=model.parameters()`` to leave the weights out (they are
    saved by the layers that use them, but are counted as parameters). Inside a
    ``torch.utils.checkpoint`` region the checkpoint's own hooks take over, so
    nothing saved there is seen; use :func:`retained_bytes` to measure checkpointed code.
    """
    return sum(s.nbytes for s in record_saved_tensors(fn, exclude)[1])


def _allocations(prof: Any) -> list[int]:
    """CPU allocation (+) and free (-) sizes recorded by a memory profile, in time order."""
    from torch._C._profiler import _EventType

    sizes: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    return [size for _, size in sorted(sizes)]


def retained_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``fn()`` on CPU; return its result and the bytes allocated during it that are still alive.

    Called on a forward pass (keeping the loss), this is everything the pass
    leaves behind for backward: the saved tensors, and also what
    ``torch.utils.checkpoint`` keeps outside autograd's saved-tensor hooks (the
    inputs of each checkpointed segment), which :func:`saved_activation_bytes` cannot see.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    return out, sum(_allocations(prof))


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Sum of ``numel * element_size`` over the tensors (``None`` entries, e.g. missing grads, count 0)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in an optimiser's per-parameter state (Adam's ``exp_avg`` and
    ``exp_avg_sq``, SGD's ``momentum_buffer``).

    Scalar step counters are left out: Adam keeps one 0-d ``step`` tensor per parameter,
    a few bytes that no memory formula counts.
    """
    return sum(
        tensor_bytes([v])
        for state in optimizer.state.values()
        for k, v in state.items()
        if isinstance(v, torch.Tensor) and v.dim() > 0 and k != "step"
    )


def peak_memory_bytes(step: Callable[[], Any], device: str | torch.device = "cpu") -> int:
    """Peak bytes allocated while running ``step()`` (e.g. forward + backward), above what lived before.

    CUDA: ``torch.cuda.max_memory_allocated`` minus the allocation at the start.
    CPU: replays, in time order, the allocation and free events the profiler
    records with ``profile_memory=True`` and returns the highest running total. Both count the bytes tensors asked for,
    not what the allocator reserved from the system.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    if device.type != "cpu":
        raise ValueError(f"peak memory is measured on cpu or cuda, not {device.type}")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    live = peak = 0
    for size in _allocations(prof):
        live += size
        peak = max(peak, live)
    return peak


def timed(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs, after ``warmup`` untimed ones."""
    import statistics

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
