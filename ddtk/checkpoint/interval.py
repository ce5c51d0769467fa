"""How often to checkpoint: Young's and Daly's optimal intervals and the overhead they minimise.

Checkpointing every ``tau`` seconds of work costs ``delta`` seconds per checkpoint
(the time training is blocked). Failures arrive at random, on average once per
``M`` seconds (the MTBF of the whole job, not of one node). Each failure loses the
work since the last commit, on average half a period, plus the ``R`` seconds it
takes to restart. Checkpointing often wastes time writing; rarely, recomputing.

* :func:`first_order_overhead`: the fraction of time lost,
  ``delta / tau + ((tau + delta) / 2 + R) / M``; its minimum is Young's interval.
* :func:`young_interval`: ``sqrt(2 * delta * M)`` (Young, 1974).
* :func:`daly_overhead`: the expected wall-clock overhead for exponentially
  distributed failures (Daly, 2006, the model with restart time ``R``):
  ``M * exp(R / M) * (exp((tau + delta) / M) - 1) / tau - 1``.
* :func:`daly_interval`: Daly's higher-order estimate of that model's optimum,
  ``sqrt(2 delta M) * (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta``
  for ``delta < 2M``, and ``M`` otherwise.
* :func:`lost_work_per_failure`: ``(tau + delta) / 2 + R``.

All times are in seconds (any unit works if used consistently).

>>> round(young_interval(checkpoint_s=30, mtbf_s=86_400))
2277
>>> round(daly_interval(checkpoint_s=30, mtbf_s=86_400))
2257
>>> round(first_order_overhead(2277, checkpoint_s=30, mtbf_s=86_400), 4)
0.0265
>>> young_interval(0, 3600)
Traceback (most recent call last):
...
ValueError: checkpoint_s must be a finite number > 0 (seconds), got 0
"""

from __future__ import annotations

import math

__all__ = [
    "daly_interval",
    "daly_overhead",
    "first_order_overhead",
    "lost_work_per_failure",
    "young_interval",
]


def _positive(name: str, value: object) -> float:
    """``value`` as a float; ValueError unless it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a finite number > 0 (seconds), got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0 (seconds), got {value!r}")
    return float(value)


def _non_negative(name: str, value: object) -> float:
    """``value`` as a float; ValueError unless it is a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a finite number >= 0 (seconds), got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0 (seconds), got {value!r}")
    return float(value)


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimal compute time between checkpoints: ``sqrt(2 * checkpoint_s * mtbf_s)``.

    >>> young_interval(checkpoint_s=2.0, mtbf_s=3600.0)
    120.0
    """
    delta = _positive("checkpoint_s", checkpoint_s)
    mtbf = _positive("mtbf_s", mtbf_s)
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimal compute time between checkpoints (Daly, 2006, eq. 37).

    Close to :func:`young_interval` when the checkpoint cost is small against the
    MTBF, smaller when it is not; ``mtbf_s`` itself once ``checkpoint_s >= 2 * mtbf_s``.

    >>> round(daly_interval(checkpoint_s=2.0, mtbf_s=3600.0), 2)
    118.67
    >>> daly_interval(checkpoint_s=10.0, mtbf_s=4.0)
    4.0
    """
    delta = _positive("checkpoint_s", checkpoint_s)
    mtbf = _positive("mtbf_s", mtbf_s)
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def lost_work_per_failure(interval_s: float, checkpoint_s: float, restart_s: float = 0.0) -> float:
    """Expected seconds lost per failure: half a period of work and checkpoint, plus the restart.

    >>> lost_work_per_failure(interval_s=100.0, checkpoint_s=2.0, restart_s=30.0)
    81.0
    """
    tau = _positive("interval_s", interval_s)
    delta = _non_negative("checkpoint_s", checkpoint_s)
    restart = _non_negative("restart_s", restart_s)
    return (tau + delta) / 2.0 + restart


def first_order_overhead(
    interval_s: float, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0
) -> float:
    """Fraction of time lost to checkpoints and failures, to first order in ``1 / mtbf_s``.

    ``checkpoint_s / interval_s`` (writing) plus ``lost_work_per_failure / mtbf_s``
    (recomputing and restarting). Minimised by :func:`young_interval`.

    >>> first_order_overhead(interval_s=120.0, checkpoint_s=2.0, mtbf_s=3600.0)
    0.03361111111111111
    """
    tau = _positive("interval_s", interval_s)
    delta = _positive("checkpoint_s", checkpoint_s)
    mtbf = _positive("mtbf_s", mtbf_s)
    return delta / tau + lost_work_per_failure(tau, delta, restart_s) / mtbf


def daly_overhead(
    interval_s: float, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0
) -> float:
    """Expected wall-clock time per unit of useful work, minus one, for exponential failures.

    Daly's (2006) model: ``mtbf * exp(R / mtbf) * (exp((tau + delta) / mtbf) - 1) / tau - 1``.
    Exact under its assumptions (failures a Poisson process, also during checkpoints
    and restarts); :func:`daly_interval` approximates its minimum.

    >>> round(daly_overhead(interval_s=120.0, checkpoint_s=2.0, mtbf_s=3600.0), 5)
    0.03409
    """
    tau = _positive("interval_s", interval_s)
    delta = _positive("checkpoint_s", checkpoint_s)
    mtbf = _positive("mtbf_s", mtbf_s)
    restart = _non_negative("restart_s", restart_s)
    return mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf) / tau - 1.0
