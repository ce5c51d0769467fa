"""ddtk.data: partitioners, non-IID splits, LPT workload balancing, datasets and train/test splits."""

from __future__ import annotations

import importlib.machinery
import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from ddtk.data import (
    DATASETS,
    DataPartitioner,
    Dataset,
    balance_workload,
    dirichlet_label_split,
    load_dataset,
    quantity_skew_split,
    train_test_split,
)
from ddtk.sklearn_tables import SKLEARN_FILES, sklearn_table

STRATEGIES = ("contiguous", "strided", "shuffled")
SHAPES = [(10, 3), (1797, 4), (7, 7), (3, 5), (0, 4), (1, 1), (100, 1), (11, 2)]


def _expected_sizes(total: int, world: int) -> list[int]:
    """The first ``total % world`` ranks get one extra sample (written out, not divmod-derived)."""
    sizes = [0] * world
    for i in range(total):  # deal the samples out one by one, like cards
        sizes[i % world] += 1
    return sizes


# -- DataPartitioner -------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("total", "world"), SHAPES)
def test_partitions_are_balanced_disjoint_and_complete(
    strategy: str, total: int, world: int
) -> None:
    p = DataPartitioner(total, world, strategy, seed=3)
    shares = [p.get_indices(r) for r in range(world)]
    sizes = [len(s) for s in shares]
    assert sizes == _expected_sizes(total, world)
    assert sizes == [p.partition_size(r) for r in range(world)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == total
    assert all(s.dtype == np.int64 for s in shares)
    everything = np.concatenate(shares)
    assert len(np.unique(everything)) == total  # disjoint
    np.testing.assert_array_equal(np.sort(everything), np.arange(total))  # complete


@pytest.mark.parametrize(("total", "world"), SHAPES)
def test_contiguous_blocks_tile_the_range_in_rank_order(total: int, world: int) -> None:
    p = DataPartitioner(total, world, "contiguous")
    end = 0
    for r in range(world):
        start, stop = p.get_partition(r)
        assert start == end  # each block starts where the previous one ended
        np.testing.assert_array_equal(p.get_indices(r), np.arange(start, stop))
        end = stop
    assert end == total


def test_examples_written_out() -> None:
    c = DataPartitioner(10, 3, "contiguous")
    assert [c.get_indices(r).tolist() for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [c.get_partition(r) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]
    s = DataPartitioner(10, 3, "strided")
    assert [s.get_indices(r).tolist() for r in range(3)] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    # the module docstring: digits on 4 ranks, rank 1 holds 449 samples
    assert len(DataPartitioner(1797, 4, "shuffled").get_indices(1)) == 449


@pytest.mark.parametrize(("total", "world"), SHAPES)
def test_strided_pattern(total: int, world: int) -> None:
    p = DataPartitioner(total, world, "strided")
    for r in range(world):
        idx = p.get_indices(r)
        assert (idx % world == r).all()
        if len(idx) > 1:
            assert (np.diff(idx) == world).all()
        if len(idx):
            assert idx[0] == r


def test_shuffled_is_seeded() -> None:
    def split(seed: int, world: int = 4) -> list[list[int]]:
        p = DataPartitioner(200, world, "shuffled", seed=seed)
        return [p.get_indices(r).tolist() for r in range(world)]

    assert split(7) == split(7)  # every rank computes the same split without talking
    assert split(7) != split(8)
    order = list(itertools.chain(*split(7)))
    assert order != list(range(200))  # really shuffled
    assert sorted(order) == list(range(200))
    # one rank is one contiguous block of one permutation, whatever the world size
    assert list(itertools.chain(*split(7, world=3))) == order


def test_edge_cases() -> None:
    few = DataPartitioner(2, 5, "shuffled")
    assert [len(few.get_indices(r)) for r in range(5)] == [1, 1, 0, 0, 0]
    assert [few.get_partition(r) for r in range(2, 5)] == [(2, 2)] * 3
    none = DataPartitioner(0, 3, "strided")
    assert all(len(none.get_indices(r)) == 0 for r in range(3))
    one = DataPartitioner(5, 1, "shuffled", seed=1)
    assert sorted(one.get_indices(0).tolist()) == [0, 1, 2, 3, 4]
    assert DataPartitioner(5, 1).get_indices(0).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ((-1, 2), "total_size must be an integer >= 0"),
        ((2.5, 2), "total_size must be an integer >= 0"),
        ((True, 2), "total_size must be an integer >= 0"),
        (("10", 2), "total_size must be an integer >= 0"),
        ((10, 0), "world_size must be an integer >= 1"),
        ((10, -2), "world_size must be an integer >= 1"),
        ((10, True), "world_size must be an integer >= 1"),
        (
            (10, 2, "random"),
            "unknown strategy 'random'; choose one of contiguous, strided, shuffled",
        ),
    ],
)
def test_partitioner_rejects_bad_arguments(args: tuple, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        DataPartitioner(*args)


@pytest.mark.parametrize("rank", [-1, 3])
def test_partitioner_rejects_bad_ranks(rank: int) -> None:
    p = DataPartitioner(10, 3)
    for method in (p.get_indices, p.get_partition, p.partition_size):
        with pytest.raises(ValueError, match=rf"rank {rank} is outside 0\.\.2"):
            method(rank)


# -- non-IID splits --------------------------------------------------------------------------
def _mean_label_entropy(labels: np.ndarray, parts: list[np.ndarray], classes: int) -> float:
    """Mean over clients of the entropy (nats) of the client's label histogram."""
    out = []
    for p in parts:
        q = np.bincount(labels[p], minlength=classes) / len(p)
        q = q[q > 0]
        out.append(float(-(q * np.log(q)).sum()))
    return float(np.mean(out))


def _assert_covers_once(parts: list[np.ndarray], n: int) -> None:
    everything = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(everything), np.arange(n))
    for p in parts:
        assert p.dtype == np.int64 and (np.diff(p) > 0).all()  # sorted, no repeats


LABELS = np.repeat(np.arange(10), 60)  # 600 samples, 10 balanced classes


@pytest.mark.parametrize("alpha", [0.1, 1.0, 100.0])
def test_dirichlet_covers_every_sample_once(alpha: float) -> None:
    parts = dirichlet_label_split(LABELS, clients=6, alpha=alpha, seed=2)
    assert len(parts) == 6
    _assert_covers_once(parts, len(LABELS))
    assert min(len(p) for p in parts) >= 1


def test_dirichlet_small_alpha_skews_labels() -> None:
    def entropy(alpha: float) -> float:
        return np.mean(
            [
                _mean_label_entropy(LABELS, dirichlet_label_split(LABELS, 5, alpha, seed=s), 10)
                for s in range(3)
            ]
        )

    skewed, mild, iid = entropy(0.1), entropy(1.0), entropy(100.0)
    assert skewed < mild < iid
    assert skewed < 0.5 * math.log(10)  # a few dominant classes per client
    assert iid > 0.95 * math.log(10)  # close to the uniform label mix


def test_dirichlet_min_size_seed_and_tensor_labels() -> None:
    parts = dirichlet_label_split(LABELS, 8, alpha=0.5, seed=4, min_size=40)
    assert min(len(p) for p in parts) >= 40
    _assert_covers_once(parts, len(LABELS))
    again = dirichlet_label_split(torch.tensor(LABELS), 8, alpha=0.5, seed=4, min_size=40)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = dirichlet_label_split(LABELS, 8, alpha=0.5, seed=5, min_size=40)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"clients": 0, "alpha": 1.0}, "clients must be an integer >= 1, got 0"),
        ({"clients": 2, "alpha": 0.0}, "alpha must be > 0, got 0.0"),
        ({"clients": 2, "alpha": -1.0}, "alpha must be > 0"),
        (
            {"clients": 7, "alpha": 1.0, "min_size": 2},
            "10 samples cannot give 7 clients 2 samples each",
        ),
        # one class and a tiny alpha: nearly everything lands on one client, on every redraw
        ({"clients": 5, "alpha": 1e-3, "min_size": 2}, "could not give every client 2 samples"),
    ],
)
def test_dirichlet_errors(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        dirichlet_label_split(np.zeros(10, dtype=np.int64), **kwargs)


def test_quantity_skew_split() -> None:
    for seed in range(20):
        parts = quantity_skew_split(1000, 5, alpha=0.5, seed=seed, min_size=10)
        _assert_covers_once(parts, 1000)
        assert min(len(p) for p in parts) >= 10
    sizes = [len(p) for p in quantity_skew_split(1000, 5, alpha=0.5, seed=0)]
    assert max(sizes) > 2 * min(sizes)  # skewed, unlike the balanced partitioner
    even = [len(p) for p in quantity_skew_split(1000, 5, alpha=1000.0, seed=0)]
    assert max(even) - min(even) < 100  # large alpha: nearly equal shares
    a, b = quantity_skew_split(100, 3, seed=1), quantity_skew_split(100, 3, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert [len(p) for p in quantity_skew_split(6, 3, min_size=2)] == [2, 2, 2]  # no room to skew


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ((10, 0), "clients must be an integer >= 1"),
        ((10, 2, 0.0), "alpha must be > 0"),
        ((10, 3, 1.0, 0, 4), "10 samples cannot give 3 clients 4 samples each"),
    ],
)
def test_quantity_skew_errors(args: tuple, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        quantity_skew_split(*args)


# -- LPT workload balancing ------------------------------------------------------------------
def _optimal_makespan(costs: list[float], m: int) -> float:
    """Brute force over all m**n assignments of tasks to ranks."""
    every = np.array(list(itertools.product(range(m), repeat=len(costs))))
    loads = np.stack([(every == r) @ np.asarray(costs) for r in range(m)], axis=1)
    return float(loads.max(1).min())


def _check_assignment(costs: list[float], m: int, assignments: list[list[int]], makespan: float):
    assert len(assignments) == m
    assert sorted(itertools.chain(*assignments)) == list(range(len(costs)))  # each task once
    assert makespan == max(sum(costs[t] for t in a) for a in assignments)


def test_lpt_against_brute_force_optimum() -> None:
    rng = np.random.default_rng(0)
    worse = 0
    for _ in range(60):
        n, m = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        costs = [float(c) for c in rng.integers(1, 20, size=n)]
        assignments, makespan = balance_workload(costs, m)
        _check_assignment(costs, m, assignments, makespan)
        opt = _optimal_makespan(costs, m)
        assert opt <= makespan <= (4 / 3 - 1 / (3 * m)) * opt + 1e-9  # Graham's bound
        worse += makespan > opt
    assert worse > 0  # the random cases include some where greedy is not optimal


def test_lpt_known_suboptimal_case() -> None:
    costs = [3.0, 3.0, 2.0, 2.0, 2.0]
    assignments, makespan = balance_workload(costs, 2)
    _check_assignment(costs, 2, assignments, makespan)
    assert makespan == 7.0  # {3, 2, 2} and {3, 2}
    assert _optimal_makespan(costs, 2) == 6.0  # {3, 3} and {2, 2, 2}
    assert makespan == pytest.approx((4 / 3 - 1 / 6) * 6.0)  # Graham's bound is tight here


def test_lpt_small_cases() -> None:
    assert balance_workload([], 3) == ([[], [], []], 0.0)
    assert balance_workload([5.0, 1.0], 4)[1] == 5.0
    assert balance_workload([2, 2, 2, 2], 2) == ([[0, 2], [1, 3]], 4.0)
    with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
        balance_workload([1.0], 0)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="task costs must be finite and non-negative"):
            balance_workload([1.0, bad], 2)


# -- datasets --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "x_shape", "classes"),
    [
        ("digits", (1797, 1, 8, 8), 10),
        ("iris", (150, 4), 3),
        ("wine", (178, 13), 3),
        ("breast_cancer", (569, 30), 2),
        ("synthetic_classification", (300, 20), 4),
        ("synthetic_regression", (300, 10), 0),
    ],
)
def test_load_dataset_shapes_and_dtypes(name: str, x_shape: tuple, classes: int) -> None:
    ds = load_dataset(name, n=300, seed=0)
    assert ds.name == name and len(ds) == x_shape[0]
    assert tuple(ds.x.shape) == x_shape and ds.input_shape == x_shape[1:]
    assert ds.x.dtype == torch.float32 and torch.isfinite(ds.x).all()
    assert ds.num_classes == classes
    if classes:
        assert ds.y.dtype == torch.int64 and ds.y.shape == (x_shape[0],)
        assert sorted(ds.y.unique().tolist()) == list(range(classes))  # every class present
    else:
        assert ds.y.dtype == torch.float32 and ds.y.shape == (x_shape[0], 1)
    if name in ("iris", "wine", "breast_cancer"):  # standardised per feature
        torch.testing.assert_close(ds.x.mean(0), torch.zeros(x_shape[1]), atol=1e-5, rtol=0)
        torch.testing.assert_close(ds.x.std(0), torch.ones(x_shape[1]), atol=1e-4, rtol=0)
    if name == "digits":
        assert ds.x.min() == 0.0 and ds.x.max() == 1.0
    x, y = ds.subset([3, 0, 3])
    assert torch.equal(x, ds.x[[3, 0, 3]]) and torch.equal(y, ds.y[[3, 0, 3]])


def test_all_dataset_names_are_covered() -> None:
    assert set(DATASETS) == {
        "digits",
        "iris",
        "wine",
        "breast_cancer",
        "synthetic_classification",
        "synthetic_regression",
    }


@pytest.mark.parametrize("name", sorted(SKLEARN_FILES))
def test_sklearn_tables_read_from_their_files_equal_sklearns_loaders(name: str) -> None:
    import sklearn.datasets

    data, target = sklearn_table(name)
    bunch = getattr(sklearn.datasets, f"load_{name}")()
    np.testing.assert_array_equal(data, bunch.data)
    np.testing.assert_array_equal(target, bunch.target)
    assert data.dtype == np.float64 and target.dtype == np.int64


def test_loading_a_real_dataset_does_not_import_sklearn() -> None:
    probe = (
        "import sys; from ddtk.data import load_dataset; "
        "[load_dataset(n) for n in ('digits', 'iris', 'wine', 'breast_cancer')]; "
        "from ddtk.examples.digits_data import digits_split; digits_split(); "
        "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_a_moved_sklearn_file_falls_back_to_sklearns_loader(monkeypatch, tmp_path) -> None:
    from ddtk import sklearn_tables

    fake = importlib.machinery.ModuleSpec("sklearn", None, is_package=True)
    fake.submodule_search_locations = [str(tmp_path)]  # no datasets/data/ under it
    monkeypatch.setattr(sklearn_tables.importlib.util, "find_spec", lambda name: fake)
    data, target = sklearn_table("iris")
    assert data.shape == (150, 4) and target.dtype == np.int64
    monkeypatch.setattr(sklearn_tables.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="ships with scikit-learn, which is not installed"):
        sklearn_table("digits")
    with pytest.raises(ValueError, match="not a scikit-learn table"):
        sklearn_table("mnist")


def test_digits_are_sklearn_digits() -> None:
    from sklearn.datasets import load_digits

    d, ds = load_digits(), load_dataset("digits")
    np.testing.assert_array_equal(ds.y.numpy(), d.target)
    np.testing.assert_allclose(ds.x.numpy().reshape(-1, 64), d.data / 16.0, rtol=0, atol=1e-7)


@pytest.mark.parametrize("name", ["synthetic_classification", "synthetic_regression"])
def test_synthetic_sets_are_seeded(name: str) -> None:
    a, b, c = (load_dataset(name, n=64, seed=s) for s in (1, 1, 2))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.x, c.x)


def test_synthetic_regression_has_a_linear_target() -> None:
    ds = load_dataset("synthetic_regression", n=500, seed=0)
    w = torch.linalg.lstsq(ds.x.double(), ds.y.double()).solution
    residual = ds.y.double() - ds.x.double() @ w
    assert 0.08 < float(residual.std()) < 0.12  # the documented noise level 0.1


def test_load_dataset_errors() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'mnist'; choose one of digits, iris"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match="n must be a positive number of samples, got 0"):
        load_dataset("synthetic_classification", n=0)


def _indexed(n: int) -> Dataset:
    """A dataset whose features are the sample indices, so splits can be traced."""
    return Dataset("indexed", torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n), 0)


def test_train_test_split() -> None:
    train, test = train_test_split(_indexed(1797), test_fraction=0.2, seed=0)
    assert (len(train), len(test)) == (1438, 359)  # round(0.2 * 1797) = 359
    ids_tr, ids_te = train.x[:, 0].long(), test.x[:, 0].long()
    assert torch.equal(train.y, ids_tr) and torch.equal(test.y, ids_te)  # rows stay paired
    assert not set(ids_tr.tolist()) & set(ids_te.tolist())
    assert sorted(ids_tr.tolist() + ids_te.tolist()) == list(range(1797))
    again = train_test_split(_indexed(1797), 0.2, seed=0)[1]
    other = train_test_split(_indexed(1797), 0.2, seed=1)[1]
    assert torch.equal(again.x, test.x) and not torch.equal(other.x, test.x)
    assert len(train_test_split(_indexed(10), 0.01)[1]) == 1  # at least one test sample
    assert train.name == "indexed" and train.num_classes == 0


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_train_test_split_rejects_bad_fractions(fraction: float) -> None:
    with pytest.raises(ValueError, match="test_fraction must be between 0 and 1"):
        train_test_split(_indexed(10), fraction)


def test_numpy_integers_accepted_and_non_integer_ranks_refused() -> None:
    p = DataPartitioner(np.int64(10), np.int32(3))
    assert p.partition_size(np.int64(0)) == 4
    for bad in (1.5, True):
        with pytest.raises(ValueError, match="outside"):
            p.get_indices(bad)


def test_split_and_load_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'bogus'"):
        load_dataset("bogus", n=0)
    tiny = load_dataset("synthetic_classification", n=2)
    with pytest.raises(ValueError, match="no training data"):
        train_test_split(tiny, test_fraction=0.9)
