"""Dynamic batching: the noise-scale estimator against known noise, the controller, training on digits."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import ddtk
from ddtk.parallel.dynamic_batching import (
    DynamicBatchController,
    GradientNoiseScale,
    NoiseScaleEstimate,
    enable_dynamic_batching,
    estimate_noise_scale,
    noise_scale_from_gradients,
    plot_batch_trajectory,
    train_dynamic,
)

pytestmark = pytest.mark.distributed


def test_estimator_is_exact_on_expected_norms() -> None:
    """E|G_B|^2 = |G|^2 + tr(Sigma)/B: plugging the expectations in returns the true values."""
    g2, trace = 2.5, 40.0
    for b_small, b_big in ((4, 8), (3, 24), (1, 5)):
        est = estimate_noise_scale(g2 + trace / b_small, g2 + trace / b_big, b_small, b_big)
        assert est.grad_sq == pytest.approx(g2) and est.trace == pytest.approx(trace)
        assert est.noise_scale == pytest.approx(trace / g2)


@pytest.mark.parametrize("k", [2, 3, 8])
def test_estimator_recovers_a_known_noise_scale(k: int) -> None:
    """Synthetic per-sample gradients G + N(0, sigma^2 I): B_simple = d sigma^2 / |G|^2."""
    gen = torch.Generator().manual_seed(k)
    d, sigma, b = 2000, 0.5, 16
    true_grad = torch.randn(d, generator=gen) * 0.1
    analytic = d * sigma**2 / true_grad.pow(2).sum().item()
    tracker = GradientNoiseScale(beta=0.95)
    for _ in range(100):
        per_sample = true_grad + sigma * torch.randn(k, b, d, generator=gen)
        tracker.update(noise_scale_from_gradients(per_sample.mean(1), b))
    assert tracker.noise_scale == pytest.approx(analytic, rel=0.05)
    assert tracker.trace == pytest.approx(d * sigma**2, rel=0.05)


def test_estimator_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="b_small < b_big"):
        estimate_noise_scale(1.0, 1.0, 8, 8)
    with pytest.raises(ValueError, match="k >= 2"):
        noise_scale_from_gradients(torch.zeros(1, 5), 4)
    assert math.isinf(NoiseScaleEstimate(grad_sq=-1.0, trace=1.0).noise_scale)
    assert math.isnan(GradientNoiseScale().noise_scale)


def test_controller_respects_min_max_and_threshold() -> None:
    quiet, noisy = NoiseScaleEstimate(1.0, 4.0), NoiseScaleEstimate(1.0, 10_000.0)
    ctrl = enable_dynamic_batching(
        min_batch=8, max_batch=40, variance_threshold=1.0, interval=1, beta=0.0
    )
    assert ctrl.batch_size == 8
    assert [ctrl.update(quiet) for _ in range(3)] == [8, 8, 8]  # 4 / 8 <= 1: never below min_batch
    assert [ctrl.update(noisy) for _ in range(4)] == [
        16,
        32,
        40,
        40,
    ]  # doubled, clamped to max_batch
    assert [ctrl.update(quiet) for _ in range(2)] == [40, 40]  # never shrinks
    # exactly at the threshold: no growth (strictly above is needed)
    at = DynamicBatchController(8, 64, variance_threshold=0.5, interval=1, beta=0.0)
    assert at.update(NoiseScaleEstimate(1.0, 4.0)) == 8
    assert at.update(NoiseScaleEstimate(1.0, 4.01)) == 16
    assert [h[1] for h in at.history] == [8, 16]
    for kwargs, match in (({"min_batch": 0}, "min_batch"), ({"max_batch": 4}, "max_batch"),
                          ({"variance_threshold": 0}, "variance_threshold"), ({"growth": 1}, "growth"),
                          ({"interval": 0}, "interval")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            DynamicBatchController(**({"min_batch": 8, "max_batch": 64} | kwargs))


def _check_trajectory(sizes: list[int], lo: int, hi: int) -> None:
    assert all(a <= b for a, b in itertools.pairwise(sizes)), f"batch size went down: {sizes}"
    assert sizes[0] == lo and lo < sizes[-1] <= hi


def test_digits_trajectory_grows_on_one_process() -> None:
    out = train_dynamic(steps=25, min_batch=16, max_batch=128, variance_threshold=0.5, interval=4)
    _check_trajectory(out["batch_size"], 16, 128)
    assert len(out["loss"]) == 25 and all(math.isfinite(v) for v in out["loss"])


def _ranks(ctx) -> dict:
    torch.set_num_threads(1)
    return train_dynamic(
        ctx, steps=20, min_batch=8, max_batch=64, variance_threshold=0.5, interval=4
    )


def test_digits_trajectory_grows_on_two_ranks() -> None:
    out = ddtk.launch(_ranks, 2, timeout=120)
    assert out[0]["batch_size"] == out[1]["batch_size"]  # every rank takes the same decisions
    _check_trajectory(out[0]["batch_size"], 8, 64)


def test_plot(tmp_path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    ax = plot_batch_trajectory({"batch_size": [8, 8, 16], "noise_scale": [math.inf, 30.0, 40.0]})
    assert len(ax.lines) == 2
    assert len(plot_batch_trajectory([8, 16, 32]).lines) == 1
