"""Dynamic loss scaling: keep small fp16 gradients from underflowing, and skip steps that overflow.

In float16 a gradient below 2**-24 rounds to zero. Multiplying the loss by a
large factor ``S`` multiplies every gradient by ``S`` (the chain rule is
linear), lifting them into fp16's range; dividing by ``S`` before the optimizer
step gives the true gradients back. Too large an ``S`` overflows to inf/NaN, so
the scale is tuned on the fly:

* a step whose gradients hold an inf or NaN is skipped (the weights stay
  untouched) and the scale is multiplied by ``backoff_factor``;
* after ``growth_interval`` consecutive good steps the scale is multiplied by
  ``growth_factor``, to probe for a larger scale that still fits.

:class:`DynamicLossScaler` follows the semantics of ``torch.amp.GradScaler``
step for step (same float32 scale, same reciprocal, same update rule), so the
two give identical scales, skipped steps and weights. It also keeps a record
of every step, and with ``ctx=`` it agrees across data-parallel ranks: an
overflow on any rank makes every rank skip the step.

>>> import torch
>>> from ddtk.precision import DynamicLossScaler
>>> w = torch.nn.Parameter(torch.ones(2))
>>> opt = torch.optim.SGD([w], lr=0.1)
>>> scaler = DynamicLossScaler(init_scale=1024.0, growth_interval=2)
>>> for bad in (False, True, False, False):
...     opt.zero_grad()
...     scaler.scale((w * w).sum()).backward()
...     if bad:
...         w.grad[0] = float("inf")  # an overflow in the backward pass
...     scaler.step(opt)
...     scaler.update()
>>> scaler.skipped_steps, scaler.scale_history, scaler.get_scale()
([1], [1024.0, 1024.0, 512.0, 512.0], 1024.0)
"""

from __future__ import annotations

import enum
from typing import Any

import torch

__all__ = ["DynamicLossScaler"]


class _Stage(enum.Enum):
    """Where an optimizer is in the current iteration (unscale_ and step may each run once)."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _float32(x: float) -> float:
    """Round a Python float to the nearest float32, as GradScaler's float32 scale tensor holds it."""
    return float(torch.tensor(x, dtype=torch.float32))


class DynamicLossScaler:
    """Scale the loss, unscale and check the gradients, skip bad steps, adapt the scale.

    Use it as ``torch.amp.GradScaler``::

        scaler.scale(loss).backward()
        scaler.step(optimizer)      # unscale_ (if not done yet), then step unless inf/NaN
        scaler.update()             # back off or grow the scale

    ``ctx`` (a :class:`ddtk.comm.context.DistributedContext`) makes the inf/NaN
    check global: the found-inf flags are combined with a max all-reduce in
    :meth:`unscale_`, so every rank skips the same steps and keeps the same
    scale. Every rank must then call :meth:`unscale_`/:meth:`step` the same
    number of times. ``enabled=False`` turns every method into a pass-through.

    After each :meth:`update`, :attr:`scale_history` holds the scale that step
    used and :attr:`skipped_steps` the indices (from 0) of the skipped steps.

    >>> import ddtk, torch
    >>> from ddtk.precision import DynamicLossScaler
    >>> def rank_fn(ctx):
    ...     w = torch.nn.Parameter(torch.ones(3))
    ...     opt = torch.optim.SGD([w], lr=0.1)
    ...     scaler = DynamicLossScaler(init_scale=8.0, ctx=ctx)
    ...     scaler.scale(w.sum()).backward()
    ...     if ctx.rank == 1:
    ...         w.grad[0] = float("nan")  # only rank 1 overflows
    ...     scaler.step(opt)
    ...     scaler.update()
    ...     return scaler.skipped_steps, scaler.get_scale(), w.tolist()
    >>> ddtk.launch(rank_fn, 2, timeout=120, echo=False)
    [([0], 4.0, [1.0, 1.0, 1.0]), ([0], 4.0, [1.0, 1.0, 1.0])]
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        ctx: Any = None,
    ) -> None:
        if not (isinstance(init_scale, (int, float)) and init_scale > 0):
            raise ValueError(f"init_scale must be a positive number, got {init_scale!r}")
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1.0, got {growth_factor!r}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if not (isinstance(growth_interval, int) and growth_interval >= 1):
            raise ValueError(f"growth_interval must be a positive int, got {growth_interval!r}")
        self.enabled = bool(enabled)
        self.ctx = ctx
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self._scale = _float32(float(init_scale))
        self._good_steps = 0  # consecutive steps without inf/NaN (GradScaler's growth tracker)
        self._stages: dict[int, _Stage] = {}
        self._found_inf: dict[int, bool] = {}
        self.scale_history: list[float] = []
        self.skipped_steps: list[int] = []

    # ---- the four calls of an iteration -------------------------------------------------------

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale`` (a float32 scale, so a bf16/fp16 loss is promoted to float32)."""
        if not self.enabled:
            return loss
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"scale() takes a tensor, got {type(loss).__name__}")
        return loss * torch.tensor(self._scale, dtype=torch.float32, device=loss.device)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale in place and note whether any is inf/NaN.

        Call it explicitly to clip or inspect true gradients before :meth:`step`;
        otherwise :meth:`step` calls it. At most once per optimizer per iteration.
        """
        if not self.enabled:
            return
        stage = self._stages.get(id(optimizer), _Stage.READY)
        if stage is _Stage.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since update()"
            )
        if stage is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step()")
        # The reciprocal in float64, rounded to float32, exactly as GradScaler computes it.
        inv_scale = torch.tensor(1.0 / self._scale, dtype=torch.float32)
        found_inf = False
        with torch.no_grad():
            for grad in _grads(optimizer):
                if grad.dtype == torch.float16:
                    raise ValueError(
                        "found float16 gradients: keep the parameters (master weights) in "
                        "float32 and let autocast produce float16 activations"
                    )
                found_inf |= not bool(torch.isfinite(grad).all())
                grad.mul_(inv_scale.to(grad.device))
        if self.ctx is not None:
            flag = torch.tensor([float(found_inf)])
            found_inf = bool(self.ctx.all_reduce(flag, op="max")[0] > 0)
        self._found_inf[id(optimizer)] = found_inf
        self._stages[id(optimizer)] = _Stage.UNSCALED

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscale (if not done yet), then ``optimizer.step()`` unless a gradient was inf/NaN.

        Returns what ``optimizer.step`` returns, or None when the step was skipped.
        """
        if not self.enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("closures are not supported with loss scaling")
        stage = self._stages.get(id(optimizer), _Stage.READY)
        if stage is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update()")
        if stage is _Stage.READY:
            self.unscale_(optimizer)
        self._stages[id(optimizer)] = _Stage.STEPPED
        if self._found_inf[id(optimizer)]:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: float | None = None) -> None:
        """End the iteration: back off after an overflow, grow after ``growth_interval`` good steps.

        An overflow (in any optimizer stepped this iteration) multiplies the scale
        by ``backoff_factor`` and resets the good-step counter. Otherwise the
        counter goes up; when it reaches ``growth_interval`` the scale is
        multiplied by ``growth_factor`` (kept only if still finite) and the counter
        restarts from 0. ``new_scale`` sets the scale by hand instead (the counter
        is left as it is, as GradScaler does).
        """
        if not self.enabled:
            return
        if new_scale is None and not self._found_inf:
            raise RuntimeError("update() without a step(): no inf/NaN check was recorded")
        overflow = any(self._found_inf.values())
        self.scale_history.append(self._scale)
        if overflow:
            self.skipped_steps.append(len(self.scale_history) - 1)
        if new_scale is not None:
            self._scale = _float32(float(new_scale))
        elif overflow:
            self._scale = _float32(self._scale * self.backoff_factor)
            self._good_steps = 0
        else:
            self._good_steps += 1
            if self._good_steps == self.growth_interval:
                grown = _float32(self._scale * self.growth_factor)
                if grown != float("inf"):
                    self._scale = grown
                self._good_steps = 0
        self._stages.clear()
        self._found_inf.clear()

    # ---- state ----------------------------------------------------------------------------------

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        return self._scale if self.enabled else 1.0

    @property
    def steps(self) -> int:
        """How many iterations :meth:`update` has closed."""
        return len(self.scale_history)

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state, with the same keys as GradScaler's (empty when disabled)."""
        if not self.enabled:
            return {}
        return {
            "scale": self._scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self._good_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (or from ``torch.amp.GradScaler.state_dict``)."""
        if not self.enabled:
            return
        if not state:
            raise RuntimeError("empty state dict: was it saved from a disabled scaler?")
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
        missing -= set(state)
        if missing:
            raise ValueError(f"state dict lacks {', '.join(sorted(missing))}")
        self._scale = _float32(float(state["scale"]))
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self._good_steps = int(state["_growth_tracker"])

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaler(scale={self.get_scale()}, steps={self.steps}, "
            f"skipped={len(self.skipped_steps)}, enabled={self.enabled})"
        )


def _grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients of an optimizer's parameters that have one (dense only)."""
    grads = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise TypeError("sparse gradients are not supported by DynamicLossScaler")
            grads.append(p.grad)
    return grads
