"""Mixed precision: dynamic loss scaling, autocast training steps, and the numerics behind them.

* :mod:`ddtk.precision.loss_scaler`: :class:`DynamicLossScaler`, GradScaler's
  semantics in readable form, with a record of scales and skipped steps and an
  optional cross-rank inf/NaN agreement.
* :mod:`ddtk.precision.autocast`: :func:`autocast_context`,
  :func:`amp_train_step`, :func:`recommended_dtype`.
* :mod:`ddtk.precision.numerics`: underflow, loss-scaling sweeps, rounding and
  accumulation in fp16, bf16 and fp32.

>>> from ddtk.precision import DynamicLossScaler, recommended_dtype
>>> DynamicLossScaler().get_scale(), recommended_dtype("cpu")
(65536.0, torch.bfloat16)
"""

from ddtk.precision.autocast import (
    amp_train_step,
    autocast_context,
    evaluate_accuracy,
    parse_dtype,
    recommended_dtype,
)
from ddtk.precision.loss_scaler import DynamicLossScaler

__all__ = [
    "DynamicLossScaler",
    "amp_train_step",
    "autocast_context",
    "evaluate_accuracy",
    "parse_dtype",
    "recommended_dtype",
]
