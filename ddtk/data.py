"""Small real datasets, synthetic datasets, and how to split them across ranks.

Everything here runs offline: the real data ships inside scikit-learn, the
synthetic data comes from a seeded generator. Each rank can call the same
function and get the same arrays, then keep its own part.

>>> from ddtk.data import load_dataset, DataPartitioner
>>> ds = load_dataset("digits")                 # 1,797 8x8 images, 10 classes
>>> part = DataPartitioner(len(ds), world_size=4, strategy="shuffled", seed=0)
>>> x, y = ds.subset(part.get_indices(rank=1))  # rank 1's share: 449 samples
"""

from __future__ import annotations

import heapq
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ddtk.sklearn_tables import sklearn_table

__all__ = [
    "DATASETS",
    "DataPartitioner",
    "Dataset",
    "balance_workload",
    "dirichlet_label_split",
    "load_dataset",
    "quantity_skew_split",
    "sklearn_table",
    "train_test_split",
]

PARTITION_STRATEGIES = ("contiguous", "strided", "shuffled")


def _count(value: object, name: str, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (numpy integers accepted, bools and floats refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Dataset:
    """Features ``x`` (float32) and targets ``y`` (int64 classes, or float32 for regression)."""

    name: str
    x: torch.Tensor
    y: torch.Tensor
    num_classes: int  # 0 for regression

    def __len__(self) -> int:
        return len(self.y)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample, for example ``(1, 8, 8)`` for digits."""
        return tuple(self.x.shape[1:])

    def subset(
        self, indices: Sequence[int] | np.ndarray | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of the given sample indices."""
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return self.x[idx], self.y[idx]


def _digits() -> Dataset:
    data, target = sklearn_table("digits")
    # (N, 1, 8, 8), pixels 0..16 scaled to [0, 1]
    x = torch.tensor(data.reshape(-1, 1, 8, 8), dtype=torch.float32) / 16.0
    return Dataset("digits", x, torch.tensor(target, dtype=torch.int64), 10)


def _tabular(name: str) -> Dataset:
    """A scikit-learn table, standardised per feature so plain SGD trains on it."""
    data, target = sklearn_table(name)
    x = torch.tensor(data, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0).clamp_min(1e-6)
    classes = int(target.max()) + 1
    return Dataset(name, x, torch.tensor(target, dtype=torch.int64), classes)


def _synthetic_classification(n: int, seed: int, features: int = 20, classes: int = 4) -> Dataset:
    """Gaussian blobs around random class centres: linearly separable-ish, learnable in seconds."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=g) * 2.0
    y = torch.randint(0, classes, (n,), generator=g)
    x = centres[y] + torch.randn(n, features, generator=g)
    return Dataset("synthetic_classification", x, y, classes)


def _synthetic_regression(n: int, seed: int, features: int = 10, noise: float = 0.1) -> Dataset:
    """``y = x @ w + noise`` with a hidden ``w``: the least-squares optimum is known."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(features, generator=g)
    x = torch.randn(n, features, generator=g)
    y = x @ w + noise * torch.randn(n, generator=g)
    return Dataset("synthetic_regression", x, y.unsqueeze(1), 0)


DATASETS = (
    "digits",
    "iris",
    "wine",
    "breast_cancer",
    "synthetic_classification",
    "synthetic_regression",
)


def load_dataset(name: str = "digits", n: int = 2048, seed: int = 0) -> Dataset:
    """Load a dataset by name; ``n`` and ``seed`` apply to the synthetic ones.

    Real data (shipped with scikit-learn): ``digits`` (1,797 images, 1x8x8, 10
    classes), ``iris``, ``wine``, ``breast_cancer`` (standardised tables).
    Synthetic: ``synthetic_classification`` (20 features, 4 classes) and
    ``synthetic_regression`` (10 features, targets of shape (n, 1)).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if name == "digits":
        return _digits()
    if name in ("iris", "wine", "breast_cancer"):
        return _tabular(name)
    if n < 1:
        raise ValueError(f"n must be a positive number of samples, got {n}")
    if name == "synthetic_classification":
        return _synthetic_classification(n, seed)
    return _synthetic_regression(n, seed)


def train_test_split(
    ds: Dataset, test_fraction: float = 0.2, seed: int = 0
) -> tuple[Dataset, Dataset]:
    """A seeded random split into train and test sets (same on every rank for the same seed)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    n_test = max(1, round(len(ds) * test_fraction))
    if n_test >= len(ds):
        raise ValueError(
            f"{len(ds)} samples leave no training data with test_fraction={test_fraction}"
        )
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))
    cut = len(ds) - n_test
    tr, te = perm[:cut], perm[cut:]
    return (
        Dataset(ds.name, ds.x[tr], ds.y[tr], ds.num_classes),
        Dataset(ds.name, ds.x[te], ds.y[te], ds.num_classes),
    )


class DataPartitioner:
    """Split ``total_size`` sample indices across ``world_size`` ranks, as evenly as possible.

    Partition sizes differ by at most one: the first ``total_size % world_size``
    ranks get one extra sample. Strategies:

    * ``"contiguous"``: rank r gets one block ``[start, end)``, as in the
      reference design; cheap to slice, but keeps any ordering of the data.
    * ``"strided"``: rank r gets ``r, r + world_size, ...``, interleaving samples.
    * ``"shuffled"``: a seeded permutation cut into blocks, what
      ``DistributedSampler(shuffle=True)`` does; every rank computes the same
      permutation from the same seed, so no indices need to be sent.
    """

    def __init__(
        self, total_size: int, world_size: int, strategy: str = "contiguous", seed: int = 0
    ):
        total_size = _count(total_size, "total_size", 0)
        world_size = _count(world_size, "world_size", 1)
        if strategy not in PARTITION_STRATEGIES:
            raise ValueError(
                f"unknown strategy {strategy!r}; choose one of {', '.join(PARTITION_STRATEGIES)}"
            )
        self.total_size, self.world_size, self.strategy, self.seed = (
            total_size,
            world_size,
            strategy,
            seed,
        )
        self._perm = (
            np.random.default_rng(seed).permutation(total_size) if strategy == "shuffled" else None
        )

    def _check_rank(self, rank: int) -> None:
        if (
            isinstance(rank, bool)
            or not isinstance(rank, numbers.Integral)
            or not 0 <= rank < self.world_size
        ):
            raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")

    def partition_size(self, rank: int) -> int:
        """Number of samples of ``rank``: ``total // world`` plus one for the first ``total % world`` ranks."""
        self._check_rank(rank)
        base, extra = divmod(self.total_size, self.world_size)
        return base + (rank < extra)

    def get_partition(self, rank: int) -> tuple[int, int]:
        """``(start, end)`` of ``rank``'s block in the order the strategy uses (the index order for contiguous)."""
        self._check_rank(rank)
        base, extra = divmod(self.total_size, self.world_size)
        start = rank * base + min(rank, extra)
        return start, start + self.partition_size(rank)

    def get_indices(self, rank: int) -> np.ndarray:
        """The sample indices of ``rank`` (int64 array); all ranks' indices are disjoint and cover everything."""
        start, end = self.get_partition(rank)
        if self.strategy == "strided":
            return np.arange(rank, self.total_size, self.world_size, dtype=np.int64)
        if self._perm is not None:
            return self._perm[start:end].astype(np.int64)
        return np.arange(start, end, dtype=np.int64)


def dirichlet_label_split(
    labels: Sequence[int] | np.ndarray | torch.Tensor,
    clients: int,
    alpha: float,
    seed: int = 0,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Non-IID label skew: each class is spread over clients by proportions drawn from Dirichlet(alpha).

    Small ``alpha`` (0.1) gives each client a few dominant classes; large ``alpha``
    (100) approaches an IID split. Redraws (up to 100 times) until every client has at
    least ``min_size`` samples. Returns one index array per client; together they
    cover every sample exactly once.
    """
    y = np.asarray(labels)
    clients = _count(clients, "clients", 1)
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if min_size * clients > len(y):
        raise ValueError(f"{len(y)} samples cannot give {clients} clients {min_size} samples each")
    rng = np.random.default_rng(seed)
    for _ in range(100):
        parts: list[list[int]] = [[] for _ in range(clients)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet([alpha] * clients))[:-1] * len(idx)).astype(int)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ValueError(
        f"could not give every client {min_size} samples with alpha={alpha}; raise alpha or lower min_size"
    )


def quantity_skew_split(
    total_size: int, clients: int, alpha: float = 0.5, seed: int = 0, min_size: int = 1
) -> list[np.ndarray]:
    """Non-IID quantity skew: client sizes drawn from Dirichlet(alpha), labels left IID.

    Each client gets at least ``min_size`` samples; the rest is shared out by the
    Dirichlet proportions. Returns one index array per client over a seeded shuffle.
    """
    clients = _count(clients, "clients", 1)
    total_size = _count(total_size, "total_size", 0)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if min_size * clients > total_size:
        raise ValueError(
            f"{total_size} samples cannot give {clients} clients {min_size} samples each"
        )
    rng = np.random.default_rng(seed)
    spare = total_size - min_size * clients
    sizes = min_size + np.floor(rng.dirichlet([alpha] * clients) * spare).astype(int)
    sizes[: total_size - sizes.sum()] += 1  # hand out the rounding remainder
    perm = rng.permutation(total_size)
    return [np.sort(chunk.astype(np.int64)) for chunk in np.split(perm, np.cumsum(sizes)[:-1])]


def balance_workload(task_costs: Sequence[float], world_size: int) -> tuple[list[list[int]], float]:
    """Greedy LPT scheduling: assign tasks to ranks so the slowest rank (the makespan) is short.

    Longest Processing Time first: sort tasks by cost, largest first, and give each
    to the rank with the least work so far. Graham (1969) proved the makespan is at
    most 4/3 - 1/(3m) of the optimum. Returns ``(assignments, makespan)`` where
    ``assignments[r]`` lists the task indices of rank r.
    """
    world_size = _count(world_size, "world_size", 1)
    costs = [float(c) for c in task_costs]
    if any(not np.isfinite(c) or c < 0 for c in costs):
        raise ValueError("task costs must be finite and non-negative")
    heap = [(0.0, r) for r in range(world_size)]
    assignments: list[list[int]] = [[] for _ in range(world_size)]
    for task in sorted(range(len(costs)), key=lambda t: (-costs[t], t)):
        load, r = heapq.heappop(heap)
        assignments[r].append(task)
        heapq.heappush(heap, (load + costs[task], r))
    return assignments, max(load for load, _ in heap)
