"""Alpha-beta cost model of the all-reduce algorithms.

Sending a message of ``m`` bytes costs ``alpha + m * beta``: ``alpha`` is the
per-message latency (software overhead plus wire latency) and ``beta`` the
inverse bandwidth in seconds per byte. Every algorithm is then a number of
sequential message steps and a number of bytes each rank must push through its
link, both as functions of the world size n (Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", 2005):

=====================  ====================  ==========================
algorithm              latency steps         bandwidth factor (x S)
=====================  ====================  ==========================
ring                   2(n-1)                2(n-1)/n
tree (binomial)        2 ceil(log2 n)        2 ceil(log2 n)
recursive doubling     log2 p (+2 if n!=p)   log2 p (+2 if n!=p)
naive (flat)           2(n-1)                2(n-1)
hierarchical (g)       2 ceil(log2 g)+2(L-1) 2 ceil(log2 g) + 2(L-1)/L
hierarchical_rs (g)    2(g-1) + 2(L-1)       2(g-1)/g + 2(L-1)/(L g)
=====================  ====================  ==========================

where p is the largest power of two <= n and L = ceil(n/g) is the number of
groups. ``hierarchical`` reduces to a group leader, runs a ring among the L
leaders and broadcasts; ``hierarchical_rs`` (Horovod's hierarchical all-reduce)
reduce-scatters inside the group, all-reduces each 1/g shard among the L ranks
that own it, and all-gathers inside the group. In one link per rank, as here,
the g cross-group rings of ``hierarchical_rs`` run at the same time, so its
bandwidth term is the per-rank share. Reduction arithmetic is ignored: on real networks it overlaps with
communication. The ring's bandwidth factor 2(n-1)/n is the lower bound for
all-reduce, which is why nccl-tests reports *bus bandwidth*: algbw times that
factor, comparable across world sizes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

ALGORITHMS: tuple[str, ...] = (
    "ring",
    "tree",
    "recursive_doubling",
    "naive",
    "hierarchical",
    "hierarchical_rs",
    "torch",
)

_BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "all_to_all": lambda n: (n - 1) / n,
}


def _log2_ceil(n: int) -> int:
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def cost_terms(
    algorithm: str, world_size: int, group_size: int | None = None
) -> tuple[float, float]:
    """``(latency_steps, bandwidth_factor)`` so that time = steps * alpha + factor * nbytes * beta."""
    n = world_size
    if n < 1:
        raise ValueError(f"world_size must be >= 1, got {n}")
    if n == 1:
        return 0.0, 0.0
    if algorithm in ("ring", "torch"):
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if algorithm == "tree":
        return 2.0 * _log2_ceil(n), 2.0 * _log2_ceil(n)
    if algorithm == "recursive_doubling":
        p = 1 << (n.bit_length() - 1)
        rounds = math.log2(p) + (2 if p != n else 0)
        return rounds, rounds
    if algorithm == "naive":
        return 2.0 * (n - 1), 2.0 * (n - 1)
    if algorithm == "hierarchical":
        g = group_size or max(1, math.isqrt(n))
        groups = math.ceil(n / g)
        inner = 2.0 * _log2_ceil(g)
        return inner + 2.0 * (groups - 1), inner + (
            2.0 * (groups - 1) / groups if groups > 1 else 0.0
        )
    if algorithm == "hierarchical_rs":
        g = min(group_size or max(1, math.isqrt(n)), n)
        groups = math.ceil(n / g)
        cross = 2.0 * (groups - 1)
        return 2.0 * (g - 1) + cross, 2.0 * (g - 1) / g + (
            cross / groups / g if groups > 1 else 0.0
        )
    raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {', '.join(ALGORITHMS)}")


def predict_time(
    algorithm: str,
    nbytes: float,
    world_size: int,
    alpha: float,
    beta: float,
    group_size: int | None = None,
) -> float:
    """Predicted all-reduce time in seconds for a buffer of ``nbytes``."""
    steps, factor = cost_terms(algorithm, world_size, group_size)
    return steps * alpha + factor * nbytes * beta


def bus_factor(collective: str, world_size: int) -> float:
    """The nccl-tests factor that turns algorithm bandwidth into bus bandwidth."""
    if collective not in _BUS_FACTORS:
        raise ValueError(
            f"unknown collective {collective!r}; expected one of {', '.join(_BUS_FACTORS)}"
        )
    return _BUS_FACTORS[collective](world_size) if world_size > 1 else 0.0


def fit_alpha_beta(
    algorithm: str,
    world_size: int,
    nbytes_list: Sequence[float],
    seconds_list: Sequence[float],
    group_size: int | None = None,
) -> tuple[float, float]:
    """Least-squares ``(alpha, beta)`` from measured times of one algorithm at several sizes.

    Fits ``t = a + b * nbytes`` and divides by the algorithm's step count and
    bandwidth factor. Sizes should span small (latency-bound) and large
    (bandwidth-bound) messages, or one of the two is poorly determined.
    """
    if len(nbytes_list) != len(seconds_list) or len(nbytes_list) < 2:
        raise ValueError(
            "fit_alpha_beta needs at least two (nbytes, seconds) pairs of equal length"
        )
    steps, factor = cost_terms(algorithm, world_size, group_size)
    if steps == 0:
        raise ValueError("a world size of 1 sends nothing: there is no alpha or beta to fit")
    x = np.asarray(nbytes_list, dtype=float)
    y = np.asarray(seconds_list, dtype=float)
    # Weight by 1/t so that the microsecond-scale small messages count as much as the large ones.
    w = 1.0 / np.maximum(y, 1e-12)
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    return max(float(a), 0.0) / steps, max(float(b), 0.0) / factor
