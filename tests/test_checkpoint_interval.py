"""Optimal checkpoint intervals: closed forms against brute-force minimisation of the models."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ddtk.checkpoint.interval import (
    daly_interval,
    daly_overhead,
    first_order_overhead,
    lost_work_per_failure,
    young_interval,
)

CASES = [(2.0, 3600.0), (30.0, 86_400.0), (60.0, 3600.0), (300.0, 3600.0), (0.5, 600.0)]


def _argmin(f, hi: float, n: int = 400_001) -> float:
    """The grid point of (0, hi] where ``f`` is smallest, refined once around it."""
    grid = np.linspace(hi / n, hi, n)
    best = grid[int(np.argmin([f(t) for t in grid]))]
    step = hi / n
    fine = np.linspace(max(best - step, step / 100), best + step, 2001)
    return float(fine[int(np.argmin([f(t) for t in fine]))])


@pytest.mark.parametrize("delta, mtbf", CASES)
def test_young_is_the_minimum_of_the_first_order_overhead(delta, mtbf):
    best = _argmin(lambda t: first_order_overhead(t, delta, mtbf, restart_s=10.0), 4 * mtbf)
    assert best == pytest.approx(young_interval(delta, mtbf), rel=1e-4)
    assert young_interval(delta, mtbf) == pytest.approx(math.sqrt(2 * delta * mtbf))


@pytest.mark.parametrize("delta, mtbf", CASES)
def test_daly_is_close_to_the_minimum_of_the_exponential_model(delta, mtbf):
    best = _argmin(lambda t: daly_overhead(t, delta, mtbf), 4 * mtbf)
    # Daly's series is an approximation of this optimum: within 1% over these cases
    assert daly_interval(delta, mtbf) == pytest.approx(best, rel=1e-2)
    # and the overhead at Daly's interval is within 0.01% of the true minimum
    at_best, at_daly = daly_overhead(best, delta, mtbf), daly_overhead(daly_interval(delta, mtbf), delta, mtbf)  # fmt: skip
    assert at_daly == pytest.approx(at_best, rel=1e-4)


def test_daly_is_below_young_and_converges_to_it_for_cheap_checkpoints():
    for delta, mtbf in CASES:
        assert daly_interval(delta, mtbf) < young_interval(delta, mtbf)
    ratio = daly_interval(1e-3, 1e6) / young_interval(1e-3, 1e6)
    assert ratio == pytest.approx(1.0, abs=1e-4)


def test_daly_interval_is_the_mtbf_when_checkpoints_cost_more_than_two_mtbf():
    assert daly_interval(10.0, 4.0) == 4.0
    assert daly_interval(8.0, 4.0) == 4.0
    assert daly_interval(7.9, 4.0) != 4.0


def test_overheads_by_hand():
    # delta / tau + ((tau + delta) / 2 + R) / M
    assert first_order_overhead(100.0, 5.0, 1000.0, 20.0) == pytest.approx(
        0.05 + (52.5 + 20) / 1000
    )
    assert lost_work_per_failure(100.0, 5.0, 20.0) == 72.5
    # Daly's model for tiny intervals/checkpoints tends to the first-order one
    d = daly_overhead(10.0, 0.1, 1e6)
    assert d == pytest.approx(first_order_overhead(10.0, 0.1, 1e6), rel=1e-3)
    # the restart multiplies by exp(R / M)
    ratio = (1 + daly_overhead(50.0, 1.0, 500.0, 100.0)) / (1 + daly_overhead(50.0, 1.0, 500.0))
    assert ratio == pytest.approx(math.exp(100.0 / 500.0))


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "30", None, True])
def test_bad_input_raises_value_error_naming_the_argument(bad):
    with pytest.raises(ValueError, match="checkpoint_s"):
        young_interval(bad, 3600.0)
    with pytest.raises(ValueError, match="mtbf_s"):
        daly_interval(1.0, bad)
    with pytest.raises(ValueError, match="interval_s"):
        daly_overhead(bad, 1.0, 3600.0)


def test_restart_may_be_zero_but_not_negative():
    assert first_order_overhead(10.0, 1.0, 100.0, restart_s=0) > 0
    with pytest.raises(ValueError, match="restart_s"):
        first_order_overhead(10.0, 1.0, 100.0, restart_s=-1)
    with pytest.raises(ValueError, match="restart_s"):
        daly_overhead(10.0, 1.0, 100.0, restart_s=float("nan"))
