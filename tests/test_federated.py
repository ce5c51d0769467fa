"""FedAvg, FedProx and FedSGD against a single-process simulation written here from the equations."""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import ddtk
from ddtk.models import build_model
from ddtk.parallel.federated import (
    FederatedAveraging,
    FederatedSGD,
    client_partition,
    compare_fedavg_fedsgd,
    round_bytes,
    sample_clients,
)

pytestmark = pytest.mark.distributed

SIZES = [3, 7, 12, 20, 5, 9]  # unequal client sizes, so weighting matters
FEATURES, CLASSES = 5, 3


def _data() -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
    g = torch.Generator().manual_seed(7)
    n = sum(SIZES)
    x = torch.randn(n, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    bounds = np.cumsum([0, *SIZES])
    return x, y, [np.arange(a, b) for a, b in itertools.pairwise(bounds)]


def _model() -> torch.nn.Module:
    return build_model(
        "mlp", input_shape=(FEATURES,), num_classes=CLASSES, hidden_dims=(6,), seed=3
    )


# -- single-process reference -------------------------------------------------------------
def _ref_client(w0, x, y, lr, epochs, batch, mu, seeds):
    """Plain SGD from w0 on (x, y): E epochs of shuffled batches, loss + mu/2 ||w - w0||^2.

    Returns the client's model and its mean data loss (without the proximal term).
    """
    model = _model()
    vector_to_parameters(w0.clone(), model.parameters())
    params = list(model.parameters())
    anchor = [p.detach().clone() for p in params]
    bs, loss_sum = batch or len(y), 0.0
    for e in range(epochs):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(int(seeds[e])))
        for s in range(0, len(y), bs):
            idx = order[s : s + bs]
            data_loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            prox = sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))
            grads = torch.autograd.grad(data_loss + 0.5 * mu * prox, params)
            loss_sum += data_loss.item() * len(idx)
            with torch.no_grad():
                for p, gr in zip(params, grads):
                    p -= lr * gr
    return parameters_to_vector(params).detach(), loss_sum / (epochs * len(y))


def _ref_fedavg(spec, rounds):
    """Per round: the global model, the mean client drift and the sample-weighted client loss."""
    x, y, parts = _data()
    w = parameters_to_vector(_model().parameters()).detach()
    history, drifts, losses = [], [], []
    for r in range(rounds):
        m = max(1, round(spec["client_fraction"] * len(parts)))
        rng = np.random.default_rng([spec["seed"], r])
        total, weight, loss, drift = torch.zeros_like(w, dtype=torch.float64), 0, 0.0, []
        for k in sorted(rng.choice(len(parts), m, replace=False)):
            seeds = np.random.SeedSequence([spec["seed"], r, int(k)]).generate_state(
                spec["local_epochs"]
            )
            args = (spec["lr"], spec["local_epochs"], spec["batch_size"], spec["mu"], seeds)
            wk, lk = _ref_client(w, x[parts[k]], y[parts[k]], *args)
            total += len(parts[k]) * wk.double()
            weight += len(parts[k])
            loss += len(parts[k]) * lk
            drift.append(float(((wk - w) ** 2).sum()))
        w = (total / weight).float()
        history.append(w)
        drifts.append(sum(drift) / len(drift))
        losses.append(loss / weight)
    return history, drifts, losses


# -- what each rank runs -------------------------------------------------------------------
def _run(ctx, spec, rounds):
    x, y, parts = _data()
    kw = {k: v for k, v in spec.items() if k in ("lr", "client_fraction", "seed")}
    if spec.get("fedsgd"):
        fed = FederatedSGD(ctx, _model(), parts, **kw)
    else:
        kw |= {k: spec[k] for k in ("local_epochs", "batch_size", "mu")}
        fed = FederatedAveraging(ctx, _model(), parts, **kw)
    out = []
    for _ in range(rounds):
        metrics = fed.train_epoch(x, y) | {"global_loss": fed.get_global_loss()}
        out.append((fed.get_parameters(), metrics))
    return out


FEDAVG = {
    "lr": 0.3,
    "local_epochs": 2,
    "batch_size": 4,
    "client_fraction": 0.5,
    "mu": 0.0,
    "seed": 11,
}
SPECS = {  # name: (settings, rounds); every world size runs all of them in one launch
    "fedavg": (FEDAVG, 3),
    "all_clients": (FEDAVG | {"client_fraction": 1.0, "batch_size": 5}, 1),
    "fedsgd": ({"fedsgd": True, "lr": 0.5, "client_fraction": 1.0, "seed": 0}, 3),
    "fedprox": (FEDAVG | {"mu": 2.0, "local_epochs": 3}, 2),
    "fedprox_mu0": (FEDAVG | {"mu": 0.0, "local_epochs": 3}, 2),
}


def _run_all(ctx):
    return {name: _run(ctx, spec, rounds) for name, (spec, rounds) in SPECS.items()}


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda n: f"world{n}")
def runs(request) -> list[dict]:
    """Per-rank results of every spec, for world sizes 1, 2 and 3 (one launch each)."""
    return ddtk.launch(_run_all, request.param, timeout=120)


def test_fedavg_matches_single_process_for_any_rank_count(runs) -> None:
    expected, drifts, losses = _ref_fedavg(FEDAVG, 3)
    for rank_out in runs:  # every rank holds the same global model, whatever the rank count
        for (params, m), want, drift, loss in zip(rank_out["fedavg"], expected, drifts, losses):
            torch.testing.assert_close(params, want)
            assert m["clients"] == 3  # max(1, round(0.5 * 6))
            assert m["client_drift"] == pytest.approx(drift, rel=1e-4)
            assert m["loss"] == m["global_loss"] == pytest.approx(loss, rel=1e-5)


def test_weighted_average_is_exact_with_unequal_clients(runs) -> None:
    spec = SPECS["all_clients"][0]
    x, y, parts = _data()
    w0 = parameters_to_vector(_model().parameters()).detach()
    clients = []
    for k, p in enumerate(parts):
        seeds = np.random.SeedSequence([spec["seed"], 0, k]).generate_state(2)
        clients.append(_ref_client(w0, x[p], y[p], spec["lr"], 2, 5, 0.0, seeds)[0])
    n = torch.tensor(SIZES, dtype=torch.float64)
    weighted = (torch.stack(clients).double() * n[:, None]).sum(0) / n.sum()
    params, metrics = runs[-1]["all_clients"][0]
    torch.testing.assert_close(params, weighted.float())
    assert not torch.allclose(params, torch.stack(clients).mean(0), atol=1e-4)  # not unweighted
    assert metrics["samples"] == sum(SIZES)


def test_fedsgd_is_full_batch_gradient_descent_on_the_union(runs) -> None:
    x, y, _ = _data()
    model = _model()
    for params, _metrics in runs[-1]["fedsgd"]:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p -= 0.5 * g
        torch.testing.assert_close(params, parameters_to_vector(model.parameters()).detach())


def test_fedprox_term_and_client_drift(runs) -> None:
    for name in ("fedprox", "fedprox_mu0"):  # mu = 0 is FedAvg: the reference drops the term
        expected, drifts, _ = _ref_fedavg(SPECS[name][0], 2)
        for (params, metrics), want, drift in zip(runs[0][name], expected, drifts):
            torch.testing.assert_close(params, want)
            assert metrics["client_drift"] == pytest.approx(drift, rel=1e-4)
    for (_, m_prox), (_, m_plain) in zip(runs[0]["fedprox"], runs[0]["fedprox_mu0"]):
        assert m_prox["client_drift"] < m_plain["client_drift"]


def test_byte_counts_follow_the_formula(runs) -> None:
    p = sum(q.numel() for q in _model().parameters())
    for r, (_, metrics) in enumerate(runs[0]["fedavg"], start=1):
        assert metrics["bytes_down"] == metrics["bytes_up"] == 3 * p * 4
        assert metrics["bytes"] == 2 * 3 * p * 4
        assert metrics["total_bytes"] == r * 2 * 3 * p * 4
    assert round_bytes(5, 100, torch.float64) == {
        "bytes_down": 4000,
        "bytes_up": 4000,
        "bytes": 8000,
    }


@pytest.mark.parametrize(
    ("k", "c", "m"), [(10, 0.1, 1), (10, 0.04, 1), (20, 0.25, 5), (7, 1.0, 7), (100, 0.1, 10)]
)
def test_client_sampling_count_and_seed(k: int, c: float, m: int) -> None:
    picks = [sample_clients(k, c, r, seed=3) for r in range(20)]
    assert all(len(p) == m == len(set(p)) and all(0 <= i < k for i in p) for p in picks)
    assert picks == [sample_clients(k, c, r, seed=3) for r in range(20)]
    if m < k:
        assert len({tuple(p) for p in picks}) > 1  # rounds draw different clients


def test_client_partition_schemes_cover_every_sample() -> None:
    y = torch.arange(200) % 10
    for scheme in ("iid", "dirichlet", "quantity"):
        parts = client_partition(y, 8, scheme, alpha=0.5, seed=1)
        assert len(parts) == 8
        assert sorted(np.concatenate(parts).tolist()) == list(range(200))


def test_fedavg_needs_fewer_rounds_than_fedsgd_on_digits() -> None:
    for scheme in ("iid", "dirichlet"):
        res = compare_fedavg_fedsgd(scheme=scheme)
        assert res["fedavg"]["rounds"] is not None
        assert res["ratio"] >= 3.0, (scheme, res["fedavg"]["rounds"], res["fedsgd"]["rounds"])


def test_bad_arguments_raise_clear_errors() -> None:
    ctx = types.SimpleNamespace(rank=0, world_size=1)
    _, _, parts = _data()
    bad = [
        ({"local_epochs": 0}, "local_epochs"),
        ({"batch_size": 0}, "batch_size"),
        ({"mu": -1.0}, "mu"),
        ({"client_fraction": 0.0}, "client_fraction"),
        ({"client_fraction": 1.5}, "client_fraction"),
        ({"lr": 0.0}, "lr"),
    ]
    for kwargs, word in bad:
        with pytest.raises(ValueError, match=word):
            FederatedAveraging(ctx, _model(), parts, **kwargs)
    with pytest.raises(ValueError, match="at least one client"):
        FederatedAveraging(ctx, _model(), [])
    with pytest.raises(ValueError, match="every client"):
        FederatedAveraging(ctx, _model(), [[0, 1], []])
    with pytest.raises(TypeError, match="fixes batch_size"):
        FederatedSGD(ctx, _model(), parts, batch_size=10)
    with pytest.raises(ValueError, match="partition scheme"):
        client_partition(torch.arange(10), 2, "weird")
    with pytest.raises(ValueError, match="target_accuracy"):
        compare_fedavg_fedsgd(target_accuracy=1.5)


def test_partition_beyond_the_data_is_rejected() -> None:
    ctx = types.SimpleNamespace(rank=0, world_size=1, broadcast=lambda t, root=0: t.clone())
    x, y, parts = _data()
    with pytest.raises(ValueError, match="exceed the 10 samples"):
        FederatedAveraging(ctx, _model(), parts).train_epoch(x[:10], y[:10])
