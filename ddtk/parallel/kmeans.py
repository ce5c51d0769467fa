"""Distributed k-means: Lloyd's algorithm with one all-reduce per iteration.

Every rank keeps its own points and a copy of the ``k`` centroids. One Lloyd
iteration is:

1. each rank assigns its local points to the nearest centroid;
2. each rank adds up its points per cluster (``k x d`` sums) and counts them (``k``);
3. one all-reduce of the packed vector ``[sums | counts | sum of squared distances]``
   gives every rank the global sums and counts;
4. new centroid = global sum / global count. A cluster that received no point
   anywhere keeps its previous centroid.

Because step 4 only uses reduced values, every rank computes bit-identical
centroids and the same centroid shift, so all ranks stop after the same
iteration without any further message. The result equals single-process Lloyd
on the concatenated data, whatever the world size and however unevenly the
points are spread (a rank may even hold none).

Empty clusters: keeping the previous centroid is the simplest rule that all
ranks agree on for free. scikit-learn's ``KMeans`` instead moves an empty
cluster's centroid onto a point far from its centre, so the two only agree
while no cluster becomes empty (the per-iteration metrics count empty clusters).

Initialisation: ``init`` may be a ``(k, d)`` tensor (used as is), ``"random"``
(``k`` distinct sample points) or ``"k-means++"`` (the default; the greedy variant
scikit-learn uses: at each step, ``2 + int(ln k)`` candidates are drawn with
probability proportional to D(x)², the one that lowers the potential most is
kept). Random and k-means++ run on rank 0 over a sample gathered from all ranks
(all the data when there are at most ``init_sample_size`` points, otherwise a
seeded random share of each rank proportional to its size); the centroids are
then broadcast.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from ddtk.parallel.callbacks import Callback

__all__ = ["INITS", "DistributedKMeans", "kmeans_plusplus", "squared_distances"]

INITS = ("k-means++", "random")

_CHUNK_ELEMENTS = 1 << 22  # bound on the (rows x k x d) temporary of one distance chunk


def squared_distances(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """``(n, k)`` squared Euclidean distances, from differences (no ``|x|² - 2x·c + |c|²`` cancellation)."""
    n, k = len(x), len(centroids)
    out = torch.empty(n, k, dtype=torch.promote_types(x.dtype, centroids.dtype), device=x.device)
    rows = max(1, _CHUNK_ELEMENTS // max(1, k * x.shape[1]))
    for s in range(0, n, rows):
        diff = x[s : s + rows, None, :] - centroids[None, :, :]
        out[s : s + rows] = (diff * diff).sum(-1)
    return out


def kmeans_plusplus(
    x: torch.Tensor, n_clusters: int, generator: torch.Generator, n_local_trials: int | None = None
) -> torch.Tensor:
    """Greedy k-means++ seeding on one process: ``n_clusters`` rows of ``x``, spread out.

    The first centroid is a uniformly random point; each next one is the best of
    ``n_local_trials`` candidates drawn with probability proportional to the squared
    distance to the nearest centroid so far. When all points already coincide with
    chosen centroids (fewer distinct points than clusters) candidates are drawn uniformly.
    """
    n = len(x)
    trials = n_local_trials or 2 + int(math.log(n_clusters))
    first = int(torch.randint(n, (1,), generator=generator))
    chosen = [first]
    closest = squared_distances(x, x[first : first + 1]).squeeze(1).double()
    for _ in range(1, n_clusters):
        pot = float(closest.sum())
        weights = closest if pot > 0 else torch.ones_like(closest)
        cand = torch.multinomial(weights, trials, replacement=True, generator=generator)
        new_closest = torch.minimum(closest, squared_distances(x[cand], x).double())
        best = int(new_closest.sum(1).argmin())
        chosen.append(int(cand[best]))
        closest = new_closest[best]
    return x[chosen].clone()


class DistributedKMeans:
    """k-means over data spread across ranks; one instance lives on each rank.

    It offers the small trainer interface of
    :class:`~ddtk.parallel.trainer.DistributedTrainer` where it makes sense
    (``train_epoch`` = one Lloyd iteration, ``get_parameters``/``set_parameters``
    on the flat centroids, ``predict``, ``on_epoch`` callbacks such as
    :class:`~ddtk.parallel.callbacks.History` and ``Report``) without subclassing
    it: that constructor builds a loss and an SGD optimiser over a model's
    parameters, and k-means has no model, no gradient and no loss to minimise by
    steps. Duck typing keeps both classes honest.

    Args:
        ctx: this rank's :class:`ddtk.DistributedContext`.
        n_clusters: number of clusters ``k`` (at least 1, at most the global number of points).
        max_iterations: the most Lloyd iterations :meth:`fit` runs.
        tol: :meth:`fit` stops once the centroid shift, the sum over clusters of
            the squared distance each centroid moved, is ``<= tol``. Absolute (scikit-learn
            scales its ``tol`` by the mean feature variance). The default 0 stops when the
            centroids no longer move, that is when no point changes cluster.
        init: ``None`` or ``"k-means++"``, ``"random"``, or a ``(k, d)`` tensor of initial centroids.
        seed: seed of the initialisation (the same result on every rank).
        init_sample_size: the most points gathered on rank 0 for the initialisation.
        callbacks: called with ``on_epoch(self, metrics)`` after every Lloyd iteration.

    After :meth:`fit`: :meth:`get_centroids`, ``inertia`` (global sum of squared
    distances to the nearest centroid), ``labels`` (this rank's cluster indices),
    ``cluster_sizes`` (global), ``n_iter``, ``converged`` and ``history`` (one metrics
    dict per iteration).

    >>> import ddtk, torch
    >>> from ddtk.data import DataPartitioner, load_dataset
    >>> from ddtk.parallel.kmeans import DistributedKMeans
    >>> def work(ctx):
    ...     ds = load_dataset("synthetic_classification", n=600, seed=0)
    ...     idx = DataPartitioner(len(ds), ctx.world_size).get_indices(ctx.rank)
    ...     km = DistributedKMeans(ctx, n_clusters=4, max_iterations=50).fit(ds.x[idx])
    ...     return km.get_centroids()
    >>> results = ddtk.launch(work, world_size=3, echo=False)
    >>> all(torch.equal(c, results[0]) for c in results)   # identical centroids on every rank
    True
    """

    def __init__(
        self,
        ctx: Any,
        n_clusters: int,
        max_iterations: int = 100,
        tol: float = 0.0,
        init: str | torch.Tensor | None = None,
        seed: int = 0,
        init_sample_size: int = 10_000,
        callbacks: Sequence[Callback] = (),
    ):
        _check_int(n_clusters, "n_clusters", 1)
        _check_int(max_iterations, "max_iterations", 1)
        _check_int(init_sample_size, "init_sample_size", 1)
        if not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
            raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
        self.ctx = ctx
        self.n_clusters, self.max_iterations, self.tol = n_clusters, max_iterations, float(tol)
        self.init = _check_init(init, n_clusters)
        self.seed, self.init_sample_size = seed, init_sample_size
        self.callbacks = list(callbacks)
        self._centroids: torch.Tensor | None = None
        self.initial_centroids: torch.Tensor | None = None
        self.inertia: float | None = None
        self.labels: torch.Tensor | None = None
        self.cluster_sizes: torch.Tensor | None = None
        self.history: list[dict[str, float]] = []
        self.n_iter = 0
        self.converged = False
        self.epoch = 0

    # -- the trainer-like interface -------------------------------------------------------
    def fit(self, local_data: torch.Tensor) -> DistributedKMeans:
        """Initialise, then run Lloyd iterations until the shift is ``<= tol`` or ``max_iterations``.

        Call on every rank with that rank's points, an ``(n_local, d)`` float tensor
        (``n_local`` may be 0). Collectives: one all-gather of the local shapes, the
        initialisation (a gather and a broadcast unless ``init`` is a tensor), one
        all-reduce per iteration and one final all-reduce for ``inertia``. Returns self.
        """
        x = self._check_data(local_data)
        self._setup(x)
        self.history, self.n_iter, self.converged, self.epoch = [], 0, False, 0
        for _ in range(self.max_iterations):
            metrics = self.train_epoch(x)
            self.n_iter += 1
            if metrics["shift"] <= self.tol:
                self.converged = True
                break
        self._final_statistics(x)
        return self

    def train_epoch(
        self, local_data: torch.Tensor, local_labels: torch.Tensor | None = None
    ) -> dict[str, float]:
        """One Lloyd iteration (exactly one all-reduce); ``local_labels`` is accepted and ignored.

        Initialises first if there are no centroids yet. Returns ``{"epoch", "loss"
        (mean squared distance at the assignment step), "inertia" (its sum), "shift",
        "empty_clusters", "samples" (global), "seconds"}`` and passes it to ``on_epoch``.
        ``inertia`` becomes None: it described the centroids before this step.
        """
        x = self._check_data(local_data)
        if local_labels is not None and len(local_labels) != len(x):
            raise ValueError(
                f"data and labels differ in length: {len(x)} samples, {len(local_labels)} labels"
            )
        if self._centroids is None:
            self._setup(x)
        t0 = time.perf_counter()
        old = self._require_centroids()
        k, d = old.shape
        if x.shape[1] != d:
            raise ValueError(f"local_data has {x.shape[1]} features but the centroids have {d}")
        total = self.ctx.all_reduce(_local_statistics(x, old).to(self.ctx.device)).to(x.device)
        sums, counts = total[: k * d].view(k, d), total[k * d : k * d + k]
        means = (sums / counts.clamp_min(1.0)[:, None]).to(old.dtype)
        new = torch.where((counts > 0)[:, None], means, old)
        shift = float(((new.double() - old.double()) ** 2).sum())
        self._centroids, self.inertia = new, None
        self.epoch += 1
        n = float(counts.sum())
        metrics = {
            "epoch": self.epoch,
            "loss": float(total[-1]) / max(n, 1.0),
            "inertia": float(total[-1]),
            "shift": shift,
            "empty_clusters": int((counts == 0).sum()),
            "samples": n,
            "seconds": time.perf_counter() - t0,
        }
        self.history.append(metrics)
        for cb in self.callbacks:
            cb.on_epoch(self, metrics)
        return metrics

    def get_centroids(self) -> torch.Tensor:
        """The ``(k, d)`` centroids (a copy)."""
        return self._require_centroids().clone()

    def get_parameters(self) -> torch.Tensor:
        """The centroids as one flat vector of ``k * d`` values (a copy)."""
        return self._require_centroids().reshape(-1).clone()

    def set_parameters(self, params: torch.Tensor) -> None:
        """Load flat centroids (from :meth:`get_parameters`); ``d`` is inferred before the first fit."""
        if not isinstance(params, torch.Tensor) or not params.is_floating_point():
            raise TypeError("params must be a floating-point torch.Tensor")
        k = self.n_clusters
        if self._centroids is not None:
            d = self._centroids.shape[1]
            if params.numel() != k * d:
                raise ValueError(
                    f"expected a flat vector of {k * d} values ({k} centroids x {d} features), "
                    f"got {params.numel()}"
                )
        elif params.numel() == 0 or params.numel() % k:
            raise ValueError(
                f"expected k * d values for k={k} centroids, got {params.numel()} (not a multiple of {k})"
            )
        self._centroids = params.detach().reshape(k, -1).clone()
        self.inertia = None

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Index (int64) of the nearest centroid for each row of ``x``; local, no communication."""
        c = self._require_centroids()
        x = self._check_data(x, "x")
        if x.shape[1] != c.shape[1]:
            raise ValueError(f"x has {x.shape[1]} features but the centroids have {c.shape[1]}")
        return squared_distances(x, c).argmin(1)

    def global_inertia(self, local_data: torch.Tensor) -> float:
        """Sum over all ranks' points of the squared distance to the nearest centroid (one all-reduce)."""
        return self._final_statistics(self._check_data(local_data))

    # -- internals -------------------------------------------------------------------------
    def _final_statistics(self, x: torch.Tensor) -> float:
        """Labels of the local points, global inertia and cluster sizes, by one all-reduce."""
        c = self._require_centroids()
        if x.shape[1] != c.shape[1]:
            raise ValueError(
                f"the data has {x.shape[1]} features but the centroids have {c.shape[1]}"
            )
        dist, labels = squared_distances(x, c).min(1)
        packed = torch.zeros(self.n_clusters + 1, dtype=torch.float64, device=x.device)
        packed[:-1] = torch.bincount(labels, minlength=self.n_clusters).to(torch.float64)
        packed[-1] = dist.sum().to(torch.float64)
        total = self.ctx.all_reduce(packed.to(self.ctx.device)).to(x.device)
        self.labels = labels
        self.cluster_sizes = total[:-1].round().to(torch.int64)
        self.inertia = float(total[-1])
        return self.inertia

    def _setup(self, x: torch.Tensor) -> None:
        """Agree on the global shape, then choose the initial centroids (same on every rank)."""
        d = x.shape[1]
        if isinstance(self.init, torch.Tensor) and self.init.shape[1] != d:
            raise ValueError(
                f"init has {self.init.shape[1]} features per centroid but the data has {d}"
            )
        n_total = self._agree_on_shape(x)
        if isinstance(self.init, torch.Tensor):
            centroids = self.init.detach().to(dtype=x.dtype, device=x.device).clone()
        else:
            centroids = self._seed_centroids(x, n_total)
        self._centroids = centroids
        self.initial_centroids = centroids.clone()
        self.inertia = None

    def _agree_on_shape(self, x: torch.Tensor) -> int:
        """All-gather ``(n_local, d)``: every rank checks the same facts and raises the same error."""
        mine = torch.tensor([len(x), x.shape[1]], dtype=torch.int64, device=self.ctx.device)
        shapes = [tuple(int(v) for v in t.tolist()) for t in self.ctx.all_gather(mine)]
        dims = [d for _, d in shapes]
        if len(set(dims)) > 1:
            per_rank = ", ".join(f"rank {r}: {d}" for r, d in enumerate(dims))
            raise ValueError(f"ranks disagree on the number of features ({per_rank})")
        n_total = sum(n for n, _ in shapes)
        if n_total < self.n_clusters:
            raise ValueError(
                f"n_clusters={self.n_clusters} is more than the {n_total} points on all ranks together"
            )
        return n_total

    def _seed_centroids(self, x: torch.Tensor, n_total: int) -> torch.Tensor:
        """Random or k-means++ centroids chosen on rank 0 from a gathered sample, then broadcast."""
        budget = max(self.init_sample_size, self.n_clusters)
        if n_total <= budget:
            sample = x
        else:
            g = torch.Generator().manual_seed(self.seed + 1 + self.ctx.rank)
            take = math.ceil(budget * len(x) / n_total)
            sample = x[torch.randperm(len(x), generator=g)[:take].to(x.device)]
        parts = self.ctx.gather(sample.to(self.ctx.device), root=0)
        centroids = None
        if self.ctx.rank == 0:
            assert parts is not None
            pool = torch.cat([p.to(x.dtype) for p in parts])
            g = torch.Generator().manual_seed(self.seed)
            if self.init == "random":
                centroids = pool[torch.randperm(len(pool), generator=g)[: self.n_clusters]].clone()
            else:
                centroids = kmeans_plusplus(pool.cpu(), self.n_clusters, g)
        return self.ctx.broadcast(centroids, root=0).to(dtype=x.dtype, device=x.device)

    def _require_centroids(self) -> torch.Tensor:
        if self._centroids is None:
            raise RuntimeError("no centroids yet: call fit() (or set_parameters()) first")
        return self._centroids

    @staticmethod
    def _check_data(x: Any, name: str = "local_data") -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2:
            raise ValueError(
                f"{name} must be 2-D (points x features), got shape {tuple(x.shape)}; "
                "a rank without points passes torch.empty(0, d)"
            )
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
        if x.shape[1] == 0:
            raise ValueError(f"{name} has no features (shape {tuple(x.shape)})")
        return x


def _local_statistics(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Assign the local points; pack ``[per-cluster sums (k*d) | counts (k) | sum of squared distances]``.

    float64 whatever the data's dtype, so the counts stay exact and the sums lose little.
    """
    k, d = centroids.shape
    dist, labels = squared_distances(x, centroids).min(1)
    packed = torch.zeros(k * d + k + 1, dtype=torch.float64, device=x.device)
    packed[: k * d].view(k, d).index_add_(0, labels, x.to(torch.float64))
    packed[k * d : k * d + k] = torch.bincount(labels, minlength=k).to(torch.float64)
    packed[-1] = dist.sum().to(torch.float64)
    return packed


def _check_int(value: Any, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_init(init: Any, n_clusters: int) -> str | torch.Tensor:
    if init is None:
        return "k-means++"
    if isinstance(init, str):
        if init not in INITS:
            raise ValueError(f"unknown init {init!r}; choose one of {', '.join(INITS)} or a tensor")
        return init
    if not isinstance(init, torch.Tensor):
        raise TypeError(f"init must be None, a string or a torch.Tensor, got {type(init).__name__}")
    if init.dim() != 2 or init.shape[0] != n_clusters or init.shape[1] == 0:
        raise ValueError(
            f"init must have shape (n_clusters={n_clusters}, n_features), got {tuple(init.shape)}"
        )
    if not init.is_floating_point():
        raise TypeError(f"init must be a floating-point tensor, got {init.dtype}")
    return init
