"""Gossip and D-PSGD against the single-process matrix recursion X_{k+1} = W X_k - lr G(X_k)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import ddtk
from ddtk.data import DataPartitioner, load_dataset
from ddtk.models import build_model
from ddtk.parallel.decentralized import Decentralized, mixing_matrix

pytestmark = pytest.mark.distributed

FEATURES, CLASSES, LOCAL, BATCH, LR, SEED = 5, 3, 12, 4, 0.3, 2


def _model(seed: int) -> torch.nn.Module:
    return build_model(
        "mlp", input_shape=(FEATURES,), num_classes=CLASSES, hidden_dims=(6,), seed=seed
    )


def _directed(n: int) -> np.ndarray:
    """0.6 I + 0.4 P: rank i hears only from rank i-1 (in- and out-neighbours differ for n >= 3)."""
    return 0.6 * np.eye(n) + 0.4 * np.roll(np.eye(n), 1, axis=1)


def _topologies(n: int) -> list:
    return ["ring", "complete", _directed(n)]


def _expected_w(topology, n: int) -> torch.Tensor:
    """The mixing matrices written out independently of the code under test."""
    if isinstance(topology, np.ndarray):
        return torch.tensor(topology)
    if topology == "complete":
        return torch.full((n, n), 1.0 / n, dtype=torch.float64)
    w = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        w[i, i] += 1 / 3
        w[i, (i + 1) % n] += 1 / 3
        w[i, (i - 1) % n] += 1 / 3
    return w


def _consensus(xs: torch.Tensor) -> float:
    xs = xs.double()
    return float(((xs - xs.mean(0)) ** 2).sum(1).mean())


def _all_reduce_calls(ctx) -> int:
    entry = ctx.stats.per_collective.get("all_reduce[ring]")
    return entry.calls if entry else 0


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(50 + rank)
    x = torch.randn(LOCAL, FEATURES, generator=g)
    return x, torch.randint(0, CLASSES, (LOCAL,), generator=g)


# -- what each rank runs ----------------------------------------------------------------------
GOSSIP_STEPS, EPOCHS = 6, 2


def _gossip(ctx, topology):
    node = Decentralized(ctx, _model(ctx.rank), topology=topology, track_consensus=True)
    dists = node.gossip(GOSSIP_STEPS)
    node.track_consensus = False
    calls = _all_reduce_calls(ctx)
    node.gossip(1)  # one more step, untracked: point-to-point only
    return dists, node.get_parameters(), _all_reduce_calls(ctx) - calls


def _train(ctx, topology):
    calls, messages = _all_reduce_calls(ctx), ctx.stats.messages_sent
    node = Decentralized(
        ctx, _model(ctx.rank), lr=LR, batch_size=BATCH, topology=topology, seed=SEED
    )
    for _ in range(EPOCHS):
        node.train_epoch(*_data(ctx.rank))
    return node.get_parameters(), _all_reduce_calls(ctx) - calls, ctx.stats.messages_sent - messages


def _run_all(ctx):
    tops = _topologies(ctx.world_size)
    return {"gossip": [_gossip(ctx, t) for t in tops], "dpsgd": [_train(ctx, t) for t in tops]}


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"world{n}")
def runs(request) -> list[dict]:
    """Per-rank results for ring, complete and a directed ring, world sizes 2..4 (one launch each)."""
    return ddtk.launch(_run_all, request.param, timeout=120)


# -- pure gossip -----------------------------------------------------------------------------
def test_gossip_is_w_to_the_k_times_x0(runs) -> None:
    n = len(runs)
    x0 = torch.stack([parameters_to_vector(_model(r).parameters()).detach() for r in range(n)])
    for t, topology in enumerate(_topologies(n)):
        w, xs, dists = _expected_w(topology, n), x0, [_consensus(x0)]
        for _ in range(GOSSIP_STEPS + 1):
            xs = (w @ xs.double()).float()  # the ranks hold float32 models between steps
            dists.append(_consensus(xs))
        for r in range(n):
            got_dists, params, untracked_all_reduces = runs[r]["gossip"][t]
            torch.testing.assert_close(params, xs[r])
            assert got_dists == pytest.approx(dists[:-1], rel=1e-5, abs=1e-9)
            assert untracked_all_reduces == 0
        assert all(b <= a * (1 + 1e-6) + 1e-12 for a, b in itertools.pairwise(dists))  # decays
        assert dists[GOSSIP_STEPS] < 0.1 * dists[0]


# -- D-PSGD -----------------------------------------------------------------------------------
def test_dpsgd_matches_single_process_recursion(runs) -> None:
    n, ref = len(runs), _model(0)
    for t, topology in enumerate(_topologies(n)):
        w = _expected_w(topology, n)
        xs = [parameters_to_vector(_model(r).parameters()).detach() for r in range(n)]
        for e in range(EPOCHS):
            order = torch.randperm(LOCAL, generator=torch.Generator().manual_seed(SEED + e))
            for s in range(0, LOCAL, BATCH):
                grads = []
                for r in range(n):  # gradient of each rank at its own model, before mixing
                    x, y = _data(r)
                    idx = order[s : s + BATCH]
                    vector_to_parameters(xs[r].clone(), ref.parameters())
                    loss = torch.nn.functional.cross_entropy(ref(x[idx]), y[idx])
                    grads.append(
                        parameters_to_vector(torch.autograd.grad(loss, list(ref.parameters())))
                    )
                mixed = (w @ torch.stack(xs).double()).float()
                xs = [mixed[r] - LR * grads[r] for r in range(n)]
        steps = EPOCHS * LOCAL // BATCH
        for r in range(n):
            params, all_reduces, messages = runs[r]["dpsgd"][t]
            torch.testing.assert_close(params, xs[r])
            assert all_reduces == 0  # the training path is point-to-point only
            out_neighbours = int((w[:, r] > 0).sum()) - 1
            assert messages == 2 * out_neighbours * steps  # a header and a payload per model


def _digits(ctx):
    ds = load_dataset("digits")
    idx = DataPartitioner(len(ds), ctx.world_size, "shuffled", seed=0).get_indices(ctx.rank)
    x, y = ds.subset(idx[: len(ds) // ctx.world_size // 16 * 16])  # 592 samples, 37 steps
    model = build_model("linear", seed=ctx.rank)  # different starting points: watch them agree
    node = Decentralized(ctx, model, lr=0.5, batch_size=16, topology="ring", track_consensus=True)
    node.gossip(0)  # records the initial consensus distance
    history = node.fit(x, y, epochs=2, eval_data=(x, y))
    return [h["accuracy"] for h in history], node.consensus


def test_dpsgd_trains_on_digits_and_reaches_consensus() -> None:
    res = ddtk.launch(_digits, 3, timeout=180)
    accuracy, consensus = res[0]
    assert accuracy[-1] > 0.85, accuracy
    assert len(consensus) == 1 + 2 * 37
    assert consensus[-1] < 0.1 * consensus[0], (consensus[0], consensus[-1])
    assert all(r[1] == consensus for r in res)  # the same measurement on every rank


# -- topologies ---------------------------------------------------------------------------------
def test_ring_and_complete_matrices() -> None:
    for n in (1, 2, 3, 5):
        for topology in ("ring", "complete"):
            w = mixing_matrix(topology, n)
            torch.testing.assert_close(
                w, _expected_w(topology, n) if n > 1 else torch.ones(1, 1, dtype=torch.float64)
            )
    torch.testing.assert_close(mixing_matrix(_directed(4), 4), torch.tensor(_directed(4)))


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        ([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5]], "column 0 sums to 1.5"),
        ([[0.5, 0.5, 0.0], [0.5, 0.2, 0.0], [0.0, 0.3, 1.0]], "row 1 sums to 0.7"),
        ([[1.5, -0.5, 0.0], [-0.5, 1.5, 0.0], [0.0, 0.0, 1.0]], "non-negative"),
        ([[0.5, 0.5], [0.5, 0.5]], "must be 3x3"),
        ([[float("nan")] * 3] * 3, "finite"),
        (np.eye(3), "not connected: ranks \\[1, 2\\]"),
        ("star", "unknown topology 'star'"),
    ],
)
def test_bad_topologies_are_rejected(matrix, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mixing_matrix(matrix, 3)


def test_bad_gossip_steps() -> None:
    ctx = type("Ctx", (), {"rank": 0, "world_size": 1})()
    with pytest.raises(ValueError, match="steps"):
        Decentralized(ctx, _model(0)).gossip(-1)
