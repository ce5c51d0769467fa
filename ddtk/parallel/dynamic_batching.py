"""Dynamic batching: grow the batch as the gradient noise falls, guided by the gradient noise scale.

A mini-batch gradient of ``B`` samples is the true gradient ``G`` plus noise
of covariance ``Sigma / B``. McCandlish et al. (2018), "An Empirical Model of
Large-Batch Training", show that the batch size beyond which larger batches
stop paying off is about the *simple noise scale*

    B_simple = tr(Sigma) / |G|^2,

and that both terms can be estimated from the squared norms of gradients
taken at two batch sizes, ``B_small`` and ``B_big`` (their Appendix A.1)::

    |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)

With data parallelism the two come for free: each rank's local gradient is a
small-batch one, the all-reduced average a big-batch one (``n`` times larger).
On one process the batch is cut into micro-batches (as with gradient
accumulation) to get the same pair. The single-step estimates are noisy, so
:class:`GradientNoiseScale` keeps exponential moving averages of the two terms
and takes their ratio, as the paper does.

:class:`DynamicBatchController` turns the estimate into a batch size. The
relative variance of the current batch's gradient is
``E|g_B - G|^2 / |G|^2 = B_simple / B``; when it is above
``variance_threshold`` the gradient is still noise-dominated and the batch
doubles (clamped to ``max_batch``). The batch never shrinks and never goes
below ``min_batch``. :func:`enable_dynamic_batching` builds one with the
reference design's arguments; :func:`train_dynamic` trains a model on a
dataset with it (on one process, or on every rank of a launch) and returns the
batch-size trajectory; :func:`plot_batch_trajectory` draws it.

>>> from ddtk.parallel.dynamic_batching import enable_dynamic_batching, estimate_noise_scale
>>> est = estimate_noise_scale(small_sq_norm=3.0, big_sq_norm=1.5, b_small=8, b_big=32)
>>> round(est.grad_sq, 3), round(est.trace, 3), round(est.noise_scale, 2)
(1.0, 16.0, 16.0)
>>> ctrl = enable_dynamic_batching(min_batch=32, max_batch=512, variance_threshold=0.1, interval=1)
>>> [ctrl.update(est) for _ in range(4)]   # 16/32, 16/64, 16/128 > 0.1: double; 16/256 < 0.1: stay
[64, 128, 256, 256]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "DynamicBatchController",
    "GradientNoiseScale",
    "NoiseScaleEstimate",
    "enable_dynamic_batching",
    "estimate_noise_scale",
    "noise_scale_from_gradients",
    "plot_batch_trajectory",
    "train_dynamic",
]


@dataclass(frozen=True)
class NoiseScaleEstimate:
    """Unbiased estimates of ``|G|^2`` and ``tr(Sigma)`` from one pair of gradient norms."""

    grad_sq: float
    trace: float

    @property
    def noise_scale(self) -> float:
        """``B_simple = tr(Sigma) / |G|^2`` (infinite when ``|G|^2`` is estimated as <= 0)."""
        return self.trace / self.grad_sq if self.grad_sq > 0 else math.inf


def estimate_noise_scale(
    small_sq_norm: float, big_sq_norm: float, b_small: float, b_big: float
) -> NoiseScaleEstimate:
    """McCandlish et al.'s two-batch-size estimator (Appendix A.1).

    ``small_sq_norm`` is ``|G_small|^2`` for gradients over ``b_small`` samples
    (averaged over several such gradients, for less noise), ``big_sq_norm`` the
    same for ``b_big`` samples.
    """
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    grad_sq = (b_big * big_sq_norm - b_small * small_sq_norm) / (b_big - b_small)
    trace = (small_sq_norm - big_sq_norm) / (1 / b_small - 1 / b_big)
    return NoiseScaleEstimate(float(grad_sq), float(trace))


def noise_scale_from_gradients(grads: torch.Tensor, batch_per_grad: int) -> NoiseScaleEstimate:
    """Estimate from ``k`` gradients (rows of ``grads``), each the mean over ``batch_per_grad`` samples.

    The small batch is one row (``|G_small|^2`` = mean of the rows' squared
    norms), the big batch all ``k`` rows together (their mean).
    """
    if grads.dim() != 2 or grads.shape[0] < 2:
        raise ValueError(f"grads must be a (k >= 2, d) tensor, got shape {tuple(grads.shape)}")
    g = grads.double()
    small = g.pow(2).sum(1).mean().item()
    big = g.mean(0).pow(2).sum().item()
    return estimate_noise_scale(small, big, batch_per_grad, batch_per_grad * grads.shape[0])


class GradientNoiseScale:
    """Moving averages of ``|G|^2`` and ``tr(Sigma)``; ``noise_scale`` is the ratio of the averages.

    ``beta`` is the averaging weight of the past (bias-corrected, like Adam's moments).
    """

    def __init__(self, beta: float = 0.9):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        self.beta = beta
        self._g = self._s = 0.0
        self.updates = 0

    def update(self, est: NoiseScaleEstimate) -> float:
        """Fold in one estimate; return the smoothed noise scale."""
        self.updates += 1
        self._g = self.beta * self._g + (1 - self.beta) * est.grad_sq
        self._s = self.beta * self._s + (1 - self.beta) * est.trace
        return self.noise_scale

    @property
    def grad_sq(self) -> float:
        return self._g / (1 - self.beta**self.updates) if self.updates else math.nan

    @property
    def trace(self) -> float:
        return self._s / (1 - self.beta**self.updates) if self.updates else math.nan

    @property
    def noise_scale(self) -> float:
        """Smoothed ``B_simple`` (NaN before any update, infinite while ``|G|^2 <= 0``)."""
        if not self.updates:
            return math.nan
        return self.trace / self.grad_sq if self.grad_sq > 0 else math.inf


class DynamicBatchController:
    """Doubles the batch size while the gradient is noise-dominated.

    Every ``interval`` updates it compares the batch gradient's relative variance,
    ``noise_scale / batch_size``, with ``variance_threshold`` and doubles the batch
    (clamped to ``max_batch``) when it is above. The batch never shrinks.
    ``history`` holds ``(update, batch_size, noise_scale)`` after every update.

    >>> ctrl = DynamicBatchController(min_batch=16, max_batch=64, variance_threshold=1.0, interval=2)
    >>> low, high = NoiseScaleEstimate(1.0, 8.0), NoiseScaleEstimate(1.0, 1000.0)
    >>> ctrl.update(low), ctrl.update(low)       # 8 / 16 < 1: stay
    (16, 16)
    >>> [ctrl.update(high) for _ in range(6)]    # noisy: double on every second update, stop at 64
    [16, 32, 32, 64, 64, 64]
    """

    def __init__(
        self,
        min_batch: int = 32,
        max_batch: int = 512,
        variance_threshold: float = 0.01,
        interval: int = 10,
        growth: int = 2,
        beta: float = 0.9,
    ):
        for name, v in (("min_batch", min_batch), ("max_batch", max_batch), ("interval", interval)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if max_batch < min_batch:
            raise ValueError(f"max_batch ({max_batch}) must be >= min_batch ({min_batch})")
        if not (isinstance(variance_threshold, (int, float)) and variance_threshold > 0):
            raise ValueError(f"variance_threshold must be a number > 0, got {variance_threshold!r}")
        if isinstance(growth, bool) or not isinstance(growth, int) or growth < 2:
            raise ValueError(f"growth must be an integer >= 2, got {growth!r}")
        self.min_batch, self.max_batch = min_batch, max_batch
        self.variance_threshold, self.interval, self.growth = variance_threshold, interval, growth
        self.tracker = GradientNoiseScale(beta)
        self.batch_size = min_batch
        self.history: list[tuple[int, int, float]] = []

    @property
    def relative_variance(self) -> float:
        """``noise_scale / batch_size``: the current batch gradient's variance over ``|G|^2``."""
        return self.tracker.noise_scale / self.batch_size

    def update(self, est: NoiseScaleEstimate) -> int:
        """Fold in an estimate; every ``interval`` updates maybe grow. Returns the batch size to use next."""
        self.tracker.update(est)
        n = self.tracker.updates
        if n % self.interval == 0 and self.relative_variance > self.variance_threshold:
            self.batch_size = min(self.batch_size * self.growth, self.max_batch)
        self.history.append((n, self.batch_size, self.tracker.noise_scale))
        return self.batch_size


def enable_dynamic_batching(
    min_batch: int = 32, max_batch: int = 512, variance_threshold: float = 0.01, **kwargs: Any
) -> DynamicBatchController:
    """The reference design's entry point: a :class:`DynamicBatchController` (``kwargs``: interval, growth, beta)."""
    return DynamicBatchController(min_batch, max_batch, variance_threshold, **kwargs)


def _flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
        for p in model.parameters()
    ])  # fmt: skip


def _set_grad(model: nn.Module, flat: torch.Tensor) -> None:
    offset = 0
    for p in model.parameters():
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def train_dynamic(
    ctx: Any = None,
    dataset: str = "digits",
    model: str = "mlp",
    steps: int = 40,
    lr: float = 0.3,
    min_batch: int = 16,
    max_batch: int = 512,
    variance_threshold: float = 1.0,
    interval: int = 5,
    micro_batches: int = 2,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Train with SGD for ``steps`` steps under a dynamic batch size; return the trajectories.

    Without ``ctx`` (or with one rank) each step's batch is cut into
    ``micro_batches`` pieces whose gradients give the small/big pair. With a
    ``ctx`` of ``n > 1`` ranks, each rank draws its own batch of the current
    size from its share of the data; the local gradient is the small batch, the
    average over ranks (one all-reduce, which also applies the data-parallel
    update) the big one, and the squared norms are averaged with a second,
    one-number all-reduce. Every rank takes the same decisions. Returns
    ``{"batch_size", "noise_scale", "loss"}`` per step (the per-rank batch size).
    """
    from ddtk.data import DataPartitioner, load_dataset
    from ddtk.models import build_model

    world = 1 if ctx is None else ctx.world_size
    rank = 0 if ctx is None else ctx.rank
    if world == 1 and (micro_batches < 2 or min_batch < micro_batches):
        raise ValueError(f"micro_batches must be in [2, min_batch], got {micro_batches}")
    ctrl = DynamicBatchController(min_batch, max_batch, variance_threshold, interval=interval)
    ds = load_dataset(dataset)
    x, y = ds.subset(DataPartitioner(len(ds), world, "shuffled", seed).get_indices(rank))
    net = build_model(model, input_shape=ds.input_shape, num_classes=ds.num_classes, seed=seed)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + 1000 * rank)
    out: dict[str, list[float]] = {"batch_size": [], "noise_scale": [], "loss": []}
    for _ in range(steps):
        b = ctrl.batch_size
        idx = torch.randint(0, len(y), (b,), generator=g)
        xb, yb = x[idx], y[idx]
        opt.zero_grad()
        if world == 1:
            parts = []
            loss_sum = 0.0
            for mx, my in zip(
                torch.tensor_split(xb, micro_batches), torch.tensor_split(yb, micro_batches)
            ):
                net.zero_grad()
                loss = nn.functional.cross_entropy(net(mx), my)
                loss.backward()
                parts.append(_flat_grad(net))
                loss_sum += loss.item() * len(my)
            grads = torch.stack(parts)
            est = noise_scale_from_gradients(grads, b // micro_batches)
            _set_grad(net, grads.mean(0))
            loss_value = loss_sum / b
        else:
            loss = nn.functional.cross_entropy(net(xb), yb)
            loss.backward()
            local = _flat_grad(net)
            mean = ctx.all_reduce(local).div_(world)
            sums = ctx.all_reduce(
                torch.tensor([local.double().pow(2).sum().item(), loss.item()], dtype=torch.float64)
            )
            est = estimate_noise_scale(
                sums[0].item() / world, mean.double().pow(2).sum().item(), b, b * world
            )
            _set_grad(net, mean)
            loss_value = sums[1].item() / world
        opt.step()
        ctrl.update(est)
        out["batch_size"].append(b)
        out["noise_scale"].append(ctrl.tracker.noise_scale)
        out["loss"].append(loss_value)
    return out


def plot_batch_trajectory(trajectory: dict[str, list[float]] | list[int], ax: Any = None) -> Any:
    """Batch size per step (and the smoothed noise scale when given), on a log scale; returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    sizes = trajectory["batch_size"] if isinstance(trajectory, dict) else list(trajectory)
    ax.step(range(1, len(sizes) + 1), sizes, where="post", label="batch size")
    if isinstance(trajectory, dict) and trajectory.get("noise_scale"):
        noise = [v if math.isfinite(v) and v > 0 else math.nan for v in trajectory["noise_scale"]]
        ax.plot(range(1, len(noise) + 1), noise, alpha=0.6, label="noise scale B_simple")
    ax.set(xlabel="step", ylabel="samples", yscale="log", title="dynamic batch size")
    ax.legend()
    return ax
