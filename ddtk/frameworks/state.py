"""Bytes of model state a rank holds: parameters, gradients and optimizer state, found by walking.

Frameworks keep their state in different places: DDP and Horovod in the
parameters, their ``.grad`` and the torch optimizer's ``state``; DeepSpeed's
ZeRO optimizers in flat fp32 partitions, their own gradient partitions and, at
stage 3, in a ``ds_tensor`` attribute of every parameter (whose ``.data`` is
then an empty placeholder). :func:`state_bytes` walks the objects it is given
(attributes, containers, tensor attributes) and sums every distinct storage it
reaches once, so the number is what the rank really holds, whatever the
framework's layout. Communication buffers that nothing keeps a reference to
between steps are not counted.

>>> import torch
>>> p = torch.nn.Parameter(torch.zeros(10)); p.grad = torch.zeros(10)
>>> state_bytes(p, {"alias": p})
80
"""

from __future__ import annotations

from typing import Any

import torch

_SKIP_MODULES = ("torch.distributed", "torch._C", "threading", "concurrent", "logging")


def _walkable(obj: Any) -> bool:
    """Objects whose attributes may hold state: framework objects, not process groups or locks."""
    module = type(obj).__module__ or ""
    if module.startswith(_SKIP_MODULES) or module == "builtins":
        return False
    return hasattr(obj, "__dict__")


def state_bytes(*roots: Any, max_depth: int = 6) -> int:
    """Sum the bytes of every distinct tensor storage reachable from ``roots``."""
    seen_storage: set[int] = set()
    seen_obj: set[int] = set()
    total = 0
    stack = [(r, 0) for r in roots]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen_obj or depth > max_depth:
            continue
        seen_obj.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in seen_storage and storage.nbytes() > 0:
                seen_storage.add(storage.data_ptr())
                total += storage.nbytes()
            if obj.grad is not None:
                stack.append((obj.grad, depth + 1))
            stack.extend((v, depth + 1) for v in vars(obj).values())
        elif isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
        elif isinstance(obj, list | tuple | set):
            stack.extend((v, depth + 1) for v in obj)
        elif isinstance(obj, torch.nn.Module):
            stack.extend((t, depth + 1) for t in obj.parameters())
            stack.extend((t, depth + 1) for t in obj.buffers())
        elif isinstance(obj, torch.optim.Optimizer):
            stack.extend((v, depth + 1) for v in obj.state.values())
            stack.extend((g["params"], depth + 1) for g in obj.param_groups)
        elif _walkable(obj):
            stack.extend((v, depth + 1) for v in vars(obj).values())
    return total
