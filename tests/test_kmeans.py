"""DistributedKMeans against scikit-learn's Lloyd k-means and a NumPy reference, on 1, 2 and 3 ranks."""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

import ddtk
from ddtk.data import DataPartitioner, load_dataset
from ddtk.parallel.callbacks import History, Report
from ddtk.parallel.kmeans import DistributedKMeans, kmeans_plusplus, squared_distances

if TYPE_CHECKING:
    from sklearn.cluster import KMeans

pytestmark = pytest.mark.distributed

TIMEOUT = 120


def make_blobs(**kwargs) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's blobs, imported here only: the ranks import this module and need no sklearn."""
    from sklearn.datasets import make_blobs

    return make_blobs(**kwargs)


# -- data and single-process references ------------------------------------------------------
@functools.cache
def _blobs(n: int = 301, k: int = 4, std: float = 2.5) -> torch.Tensor:
    """Overlapping blobs: Lloyd needs many iterations and points change cluster along the way."""
    x, _ = make_blobs(n_samples=n, centers=k, n_features=3, cluster_std=std, random_state=0)
    return torch.tensor(x, dtype=torch.float64)


@functools.cache
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    """Digits as 64 features, and 10 data rows jittered as initial centroids.

    Digits take only 17 distinct values, so some point lies exactly halfway between two
    unjittered rows; such a tie is broken by rounding, differently by the distance formula of
    each implementation, and the two runs then take different (equally valid) paths.
    """
    x = load_dataset("digits").x.reshape(-1, 64).to(torch.float64)
    g = np.random.default_rng(0)
    init = x[g.choice(len(x), 10, replace=False)] + torch.tensor(g.normal(0, 0.01, (10, 64)))
    return x, init


def _sklearn(x: torch.Tensor, init: torch.Tensor, max_iter: int) -> KMeans:
    from sklearn.cluster import KMeans

    return KMeans(
        len(init), init=init.numpy(), n_init=1, algorithm="lloyd", max_iter=max_iter, tol=0
    ).fit(x.numpy())


def _lloyd_reference(x: np.ndarray, init: np.ndarray, max_iter: int) -> np.ndarray:
    """Plain Lloyd where an empty cluster keeps its centroid; stops when nothing moves."""
    c = init.copy()
    for _ in range(max_iter):
        labels = ((x[:, None, :] - c[None]) ** 2).sum(-1).argmin(1)
        new = np.array(
            [x[labels == j].mean(0) if (labels == j).any() else c[j] for j in range(len(c))]
        )
        moved = ((new - c) ** 2).sum()
        c = new
        if moved == 0:
            break
    return c


def _global_labels(results: list[dict], key: str = "labels") -> np.ndarray:
    """Put each rank's local labels back at their global sample indices."""
    n = sum(len(r["idx"]) for r in results)
    out = np.full(n, -1, dtype=np.int64)
    for r in results:
        out[r["idx"]] = r[key].numpy()
    assert (out >= 0).all()
    return out


def _assert_matches_sklearn(results: list[dict], run: str, sk: KMeans) -> None:
    fits = [r[run] for r in results]
    for f in fits[1:]:  # every rank holds bit-identical centroids and the same scalars
        assert torch.equal(f["centroids"], fits[0]["centroids"])
        assert (f["inertia"], f["n_iter"]) == (fits[0]["inertia"], fits[0]["n_iter"])
    assert all(e == 0 for e in fits[0]["empty"]), "an empty cluster would make sklearn relocate it"
    torch.testing.assert_close(fits[0]["centroids"], torch.tensor(sk.cluster_centers_))
    labels = _global_labels([{"idx": r["idx"], "labels": r[run]["labels"]} for r in results])
    np.testing.assert_array_equal(labels, sk.labels_)
    assert fits[0]["inertia"] == pytest.approx(sk.inertia_, rel=1e-12)
    assert fits[0]["n_iter"] == sk.n_iter_
    assert fits[0]["sizes"].tolist() == np.bincount(sk.labels_, minlength=sk.n_clusters).tolist()


# -- rank functions ----------------------------------------------------------------------------
def _summary(km: DistributedKMeans, ctx) -> dict:
    calls = {k: v["calls"] for k, v in ctx.stats.as_dict()["per_collective"].items()}
    return {
        "centroids": km.get_centroids(),
        "labels": km.labels,
        "inertia": km.inertia,
        "n_iter": km.n_iter,
        "converged": km.converged,
        "sizes": km.cluster_sizes,
        "empty": [h["empty_clusters"] for h in km.history],
        "initial": km.initial_centroids,
        "calls": calls,
    }


def _fit_runs(ctx, blobs, blob_init, digits, digits_init):
    out = {}
    idx = DataPartitioner(len(blobs), ctx.world_size, "shuffled", seed=1).get_indices(ctx.rank)
    out["idx"] = idx
    for name, max_it in (("converged", 100), ("capped", 3)):
        ctx.stats.reset()
        km = DistributedKMeans(ctx, 4, max_iterations=max_it, init=blob_init).fit(blobs[idx])
        out[name] = _summary(km, ctx)
    didx = DataPartitioner(len(digits), ctx.world_size, "contiguous").get_indices(ctx.rank)
    out["digits_idx"] = didx
    ctx.stats.reset()
    km = DistributedKMeans(ctx, 10, max_iterations=300, init=digits_init).fit(digits[didx])
    out["digits"] = _summary(km, ctx)
    # train_epoch is one Lloyd iteration: exactly one all-reduce and nothing else
    ctx.stats.reset()
    km = DistributedKMeans(ctx, 4, init=blob_init)
    km.set_parameters(blob_init.reshape(-1))
    steps = [km.train_epoch(blobs[idx]) for _ in range(3)]
    out["steps"] = {
        "calls": {k: v["calls"] for k, v in ctx.stats.as_dict()["per_collective"].items()},
        "centroids": km.get_centroids(),
        "epochs": [s["epoch"] for s in steps],
        "samples": [s["samples"] for s in steps],
    }
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_matches_sklearn_lloyd(world_size: int) -> None:
    blobs, (digits, digits_init) = _blobs(), _digits()
    init = blobs[:4].clone()
    res = ddtk.launch(
        _fit_runs, world_size, args=(blobs, init, digits, digits_init), timeout=TIMEOUT
    )
    sk = _sklearn(blobs, init, 100)
    assert res[0]["converged"]["converged"] and 5 < sk.n_iter_ < 100  # a real, multi-step run
    _assert_matches_sklearn(res, "converged", sk)

    capped = _sklearn(blobs, init, 3)
    assert not res[0]["capped"]["converged"] and res[0]["capped"]["n_iter"] == 3
    _assert_matches_sklearn(res, "capped", capped)

    dig = [{"idx": r["digits_idx"], "digits": r["digits"]} for r in res]
    _assert_matches_sklearn(dig, "digits", _sklearn(digits, digits_init, 300))

    # one all-reduce per Lloyd iteration plus the final inertia; one all-gather of the shapes
    for r in res:
        fit = r["converged"]
        assert fit["calls"] == {"all_gather": 1, "all_reduce[ring]": fit["n_iter"] + 1}
        assert r["digits"]["calls"]["all_reduce[ring]"] == r["digits"]["n_iter"] + 1
        assert r["steps"]["calls"] == {"all_reduce[ring]": 3}
        assert r["steps"]["epochs"] == [1, 2, 3]
        assert r["steps"]["samples"] == [301.0] * 3
    torch.testing.assert_close(
        res[0]["steps"]["centroids"], torch.tensor(_sklearn(blobs, init, 3).cluster_centers_)
    )


def _plusplus(ctx, x, parts, runs):
    lo, hi = parts[ctx.rank]
    out = {"idx": np.arange(lo, hi)}
    for name, init, seed, sample_size in runs:
        km = DistributedKMeans(
            ctx, 4, max_iterations=100, init=init, seed=seed, init_sample_size=sample_size
        ).fit(x[lo:hi])
        out[name] = _summary(km, ctx)
    return out


def _rows_of(centroids: torch.Tensor, x: torch.Tensor) -> list[int]:
    """Index in ``x`` of each centroid, which must be an exact copy of a data row."""
    hits = [torch.nonzero((x == c).all(1)).flatten().tolist() for c in centroids]
    assert all(hits), "an initial centroid is not a data point"
    return [h[0] for h in hits]


def test_kmeans_plusplus_and_random_init() -> None:
    # four well separated blobs: k-means++ must put one initial centroid in each
    x, truth = make_blobs(n_samples=200, centers=4, n_features=2, cluster_std=0.5, random_state=3)
    x = torch.tensor(x)
    bounds = {1: [(0, 200)], 3: [(0, 70), (70, 70), (70, 200)]}  # rank 1 of 3 holds no point
    whole = ("pp", "k-means++", 0, 10_000)  # all 200 points fit in the sample
    more = [
        ("pp_seed1", "k-means++", 1, 10_000),
        ("pp_sampled", "k-means++", 0, 50),  # each rank sends a seeded share of its points
        ("random", "random", 5, 50),
    ]
    res1 = ddtk.launch(_plusplus, 1, args=(x, bounds[1], [whole]), timeout=TIMEOUT)
    res3 = ddtk.launch(_plusplus, 3, args=(x, bounds[3], [whole, *more]), timeout=TIMEOUT)
    for res, run in [(res1, "pp"), (res3, "pp"), (res3, "pp_seed1"), (res3, "pp_sampled")]:
        init = res[0][run]["initial"]
        assert all(torch.equal(r[run]["initial"], init) for r in res)  # broadcast from rank 0
        assert sorted(truth[_rows_of(init, x)]) == [0, 1, 2, 3]
        _assert_matches_sklearn(res, run, _sklearn(x, init, 100))
    # the whole data set is gathered in rank order: the same seeding for any world size
    assert torch.equal(res1[0]["pp"]["initial"], res3[0]["pp"]["initial"])
    assert not torch.equal(res3[0]["pp"]["initial"], res3[0]["pp_seed1"]["initial"])
    rows = _rows_of(res3[0]["random"]["initial"], x)
    assert len(set(rows)) == 4
    assert all(torch.equal(r["random"]["initial"], res3[0]["random"]["initial"]) for r in res3)


def test_kmeans_plusplus_function() -> None:
    x = torch.tensor(make_blobs(n_samples=120, centers=3, cluster_std=0.3, random_state=1)[0])
    a = kmeans_plusplus(x, 3, torch.Generator().manual_seed(0))
    b = kmeans_plusplus(x, 3, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and len(set(_rows_of(a, x))) == 3
    # fewer distinct points than clusters: no error, every centroid is one of the points
    dup = torch.tensor([[0.0, 0.0], [1.0, 1.0]]).repeat(5, 1)
    assert len(_rows_of(kmeans_plusplus(dup, 4, torch.Generator().manual_seed(0)), dup)) == 4
    y = torch.randn(7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    c = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(squared_distances(y, c), torch.cdist(y, c) ** 2)


def _empty_cluster(ctx, x, init):
    idx = DataPartitioner(len(x), ctx.world_size, "strided").get_indices(ctx.rank)
    km = DistributedKMeans(ctx, len(init), max_iterations=50, init=init).fit(x[idx])
    return {"idx": idx, "fit": _summary(km, ctx)}


def test_empty_cluster_keeps_its_centroid() -> None:
    x = _blobs(n=100, k=2, std=1.0)
    far = torch.tensor([[1e3, 1e3, 1e3]], dtype=torch.float64)
    init = torch.cat([x[:2], far])  # nothing is ever closest to the third centroid
    ref = _lloyd_reference(x.numpy(), init.numpy(), 50)
    for ws in (3,):  # strided shares of 34, 33 and 33 points
        res = ddtk.launch(_empty_cluster, ws, args=(x, init), timeout=TIMEOUT)
        fit = res[0]["fit"]
        assert fit["converged"] and all(e == 1 for e in fit["empty"])
        assert torch.equal(fit["centroids"][2], far[0])
        torch.testing.assert_close(fit["centroids"], torch.tensor(ref))
        assert fit["sizes"].tolist()[2] == 0 and sum(fit["sizes"].tolist()) == 100


def _errors(ctx):
    def catch(fn):
        try:
            fn()
        except (ValueError, TypeError, RuntimeError) as e:
            return type(e).__name__, str(e)
        return None

    pts = torch.randn(2, 3, dtype=torch.float64)
    km = DistributedKMeans(ctx, 2, init=torch.zeros(2, 3, dtype=torch.float64))
    out = {
        "too_many_clusters": catch(lambda: DistributedKMeans(ctx, 5).fit(pts)),
        "rank_dims": catch(
            lambda: DistributedKMeans(ctx, 2).fit(torch.randn(4, 3 + ctx.rank, dtype=torch.float64))
        ),
        "init_dims": catch(lambda: DistributedKMeans(ctx, 2, init=torch.zeros(2, 4)).fit(pts)),
        "one_d": catch(lambda: DistributedKMeans(ctx, 2).fit(torch.zeros(6))),
        "ints": catch(lambda: DistributedKMeans(ctx, 2).fit(torch.zeros(6, 2, dtype=torch.int64))),
        "predict_unfitted": catch(lambda: km.predict(pts)),
        "labels_length": catch(lambda: km.train_epoch(pts, torch.zeros(5))),
    }
    km.fit(pts)  # the ranks are still in step after all those errors
    out["predict_dims"] = catch(lambda: km.predict(torch.zeros(3, 2, dtype=torch.float64)))
    out["step_dims"] = catch(lambda: km.train_epoch(torch.zeros(3, 2, dtype=torch.float64)))
    out["set_size"] = catch(lambda: km.set_parameters(torch.zeros(5, dtype=torch.float64)))
    out["ok"] = km.cluster_sizes.sum().item()
    return out


def test_errors_are_clear_and_raised_on_every_rank() -> None:
    res = ddtk.launch(_errors, 2, timeout=TIMEOUT)
    for r in res:
        assert r["too_many_clusters"] == (
            "ValueError",
            "n_clusters=5 is more than the 4 points on all ranks together",
        )
        assert r["rank_dims"] == (
            "ValueError",
            "ranks disagree on the number of features (rank 0: 3, rank 1: 4)",
        )
        assert r["init_dims"] == (
            "ValueError",
            "init has 4 features per centroid but the data has 3",
        )
        assert r["one_d"][0] == "ValueError" and "must be 2-D" in r["one_d"][1]
        assert r["ints"][0] == "TypeError" and "floating-point" in r["ints"][1]
        assert (
            r["predict_unfitted"][0] == "RuntimeError" and "call fit()" in r["predict_unfitted"][1]
        )
        assert r["labels_length"] == (
            "ValueError",
            "data and labels differ in length: 2 samples, 5 labels",
        )
        assert r["predict_dims"] == ("ValueError", "x has 2 features but the centroids have 3")
        assert (
            r["set_size"][0] == "ValueError"
            and "expected a flat vector of 6 values" in r["set_size"][1]
        )
        assert r["step_dims"] == (
            "ValueError",
            "local_data has 2 features but the centroids have 3",
        )
        assert r["ok"] == 4


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"n_clusters": 0}, "n_clusters must be an integer >= 1, got 0"),
        ({"n_clusters": 2.0}, "n_clusters must be an integer >= 1"),
        ({"n_clusters": 3, "max_iterations": 0}, "max_iterations must be an integer >= 1"),
        ({"n_clusters": 3, "tol": -1.0}, "tol must be a finite number >= 0"),
        ({"n_clusters": 3, "init": "kmeans"}, "unknown init 'kmeans'"),
        ({"n_clusters": 3, "init": torch.zeros(2, 4)}, r"init must have shape \(n_clusters=3"),
        ({"n_clusters": 3, "init": torch.zeros(3)}, r"init must have shape .* got \(3,\)"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict, pattern: str) -> None:
    # the constructor checks its arguments before it ever uses the context
    with pytest.raises(ValueError, match=pattern):
        DistributedKMeans(None, **kwargs)


def _interface(ctx, x, init):
    idx = DataPartitioner(len(x), ctx.world_size, "contiguous").get_indices(ctx.rank)
    hist = History()
    km = DistributedKMeans(ctx, 4, init=init, callbacks=[hist, Report()]).fit(x[idx])
    km2 = DistributedKMeans(ctx, 4)
    km2.set_parameters(km.get_parameters())
    km32 = DistributedKMeans(ctx, 4, init=init.float()).fit(x[idx].float())
    return {
        "history": hist.as_dict()["epochs"],
        "flat": km.get_parameters(),
        "centroids": km.get_centroids(),
        "same_predictions": torch.equal(km2.predict(x), km.predict(x)),
        "global_inertia": km2.global_inertia(x[idx]),
        "inertia": km.inertia,
        "f32": km32.get_centroids(),
    }


def test_trainer_interface_callbacks_and_float32() -> None:
    x, init = _blobs(), _blobs()[:4].clone()
    reports: list[tuple[int, dict]] = []
    res = ddtk.launch(
        _interface,
        2,
        args=(x, init),
        timeout=TIMEOUT,
        on_report=lambda r, v: reports.append((r, v)),
    )
    sk = _sklearn(x, init, 100)
    hist = res[0]["history"]
    assert hist["epoch"] == list(range(1, sk.n_iter_ + 1))
    assert hist["shift"][-1] == 0 and all(s > 0 for s in hist["shift"][:-1])
    assert all(a >= b for a, b in itertools.pairwise(hist["inertia"]))  # Lloyd never increases it
    # the first step's loss is the mean squared distance to the initial centroids
    d0 = squared_distances(x, init).min(1).values
    assert hist["loss"][0] == pytest.approx(float(d0.mean()), rel=1e-12)
    # rank 0's epoch reports arrive in the parent, in order, with the History content
    assert [r for r, _ in reports] == [0] * sk.n_iter_
    assert [v["kind"] for _, v in reports] == ["epoch"] * sk.n_iter_
    assert [v["inertia"] for _, v in reports] == hist["inertia"]
    for r in res:
        torch.testing.assert_close(r["flat"], torch.tensor(sk.cluster_centers_).reshape(-1))
        assert torch.equal(r["flat"], r["centroids"].reshape(-1)) and r["same_predictions"]
        assert r["global_inertia"] == pytest.approx(sk.inertia_, rel=1e-12) == r["inertia"]
        assert r["f32"].dtype == torch.float32
        torch.testing.assert_close(r["f32"], torch.tensor(sk.cluster_centers_, dtype=torch.float32))
