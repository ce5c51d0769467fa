"""Mixed-precision training steps: autocast on CPU (bf16, fp16) and CUDA (fp16, bf16).

Autocast runs the matmul-heavy operations (linear layers, convolutions) in a
16-bit type while the parameters, their gradients and the optimizer state stay
in float32 (the "master weights"). Reductions such as the loss stay in float32.

* ``bfloat16`` keeps float32's 8 exponent bits: the same range, so gradients do
  not underflow and no loss scaler is needed. Its 8-bit significand (about 3
  significant digits) is the price.
* ``float16`` has 5 exponent bits: small gradients flush to zero unless the
  loss is scaled, so train it with a :class:`~ddtk.precision.DynamicLossScaler`.

CPU autocast accepts only ``bfloat16`` and ``float16`` (torch 2.13 supports
both on CPU; ``bfloat16`` is the one with fast kernels on CPUs that have
AVX512-BF16/AMX). Any other dtype raises a ValueError here rather than
torch's warning-and-silently-disable.

>>> import torch
>>> from ddtk.precision import amp_train_step, recommended_dtype
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> model = torch.nn.Linear(4, 2)
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> x, y = torch.randn(8, 4), torch.tensor([0, 1] * 4)
>>> dtype = recommended_dtype("cpu")
>>> dtype
torch.bfloat16
>>> loss = amp_train_step(model, opt, x, y, torch.nn.functional.cross_entropy, dtype)
>>> isinstance(loss, float), model.weight.dtype, model.weight.grad.dtype
(True, torch.float32, torch.float32)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from ddtk.precision.loss_scaler import DynamicLossScaler

__all__ = [
    "AUTOCAST_DTYPES",
    "amp_train_step",
    "autocast_context",
    "evaluate_accuracy",
    "parse_dtype",
    "recommended_dtype",
]

AUTOCAST_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "cpu": (torch.bfloat16, torch.float16),
    "cuda": (torch.float16, torch.bfloat16),
}

_NAMES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
          "float16": torch.float16, "half": torch.float16, "fp32": torch.float32,
          "float32": torch.float32}  # fmt: skip


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """Accept a torch dtype or a name (``"bf16"``, ``"fp16"``, ``"fp32"``, ``"bfloat16"``...)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _NAMES:
        return _NAMES[dtype.lower()]
    raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(_NAMES)}")


def _device_type(device: torch.device | str) -> str:
    kind = torch.device(device).type
    if kind not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast helpers support cpu and cuda devices, got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
    return kind


def recommended_dtype(device: torch.device | str) -> torch.dtype:
    """The 16-bit type to autocast to: bf16 on CPU; on CUDA bf16 where supported, else fp16."""
    kind = _device_type(device)
    if kind == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def autocast_context(
    device: torch.device | str, dtype: torch.dtype | str | None = None
) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for ``device`` and a 16-bit ``dtype``, or a no-op for ``float32``.

    ``dtype=None`` takes :func:`recommended_dtype`. An unsupported combination
    raises ValueError (torch itself would only warn and disable autocast).

    >>> import torch
    >>> from ddtk.precision import autocast_context
    >>> with autocast_context("cpu", "bf16"):
    ...     print((torch.ones(2, 2) @ torch.ones(2, 2)).dtype)
    torch.bfloat16
    >>> with autocast_context("cpu", torch.float32):
    ...     print((torch.ones(2, 2) @ torch.ones(2, 2)).dtype)
    torch.float32
    >>> autocast_context("cpu", torch.float64)
    Traceback (most recent call last):
    ...
    ValueError: cpu autocast supports torch.bfloat16, torch.float16 (or float32 for no autocast), not torch.float64
    """
    kind = _device_type(device)
    dtype = recommended_dtype(kind) if dtype is None else parse_dtype(dtype)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    if dtype not in AUTOCAST_DTYPES[kind]:
        allowed = ", ".join(str(d) for d in AUTOCAST_DTYPES[kind])
        raise ValueError(
            f"{kind} autocast supports {allowed} (or float32 for no autocast), not {dtype}"
        )
    if kind == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError("this GPU does not support bfloat16; use torch.float16 with a scaler")
    return torch.autocast(device_type=kind, dtype=dtype)


def amp_train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    dtype: torch.dtype | str | None = None,
    scaler: DynamicLossScaler | torch.amp.GradScaler | None = None,
) -> float:
    """One optimisation step with the forward pass under autocast; returns the (unscaled) loss.

    The forward pass and loss run under :func:`autocast_context`; backward runs
    outside it (autograd replays each operation in the dtype its forward used).
    With a ``scaler`` the loss is scaled, the step goes through
    ``scaler.step`` (skipped on inf/NaN) and ``scaler.update`` closes the
    iteration. ``float16`` without a scaler raises ValueError, since its small
    gradients would silently flush to zero.
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    device = params[0].device if params else x.device
    dtype = recommended_dtype(device) if dtype is None else parse_dtype(dtype)
    if dtype == torch.float16 and scaler is None:
        raise ValueError(
            "float16 training needs a loss scaler (DynamicLossScaler or torch.amp.GradScaler): "
            "without one, gradients below 2**-24 become zero"
        )
    optimizer.zero_grad(set_to_none=True)
    with autocast_context(device, dtype):
        loss = loss_fn(model(x), y)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return float(loss.detach().float())


def evaluate_accuracy(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: Any = torch.float32
) -> float:
    """Fraction of correct argmax predictions, with the forward pass in ``dtype`` (autocast)."""
    device = next(model.parameters()).device
    with torch.no_grad(), autocast_context(device, dtype):
        pred = model(x.to(device)).argmax(dim=1)
    return float((pred == y.to(device)).float().mean())
