"""Local SGD and EASGD against single-process simulations written here from the update equations."""

from __future__ import annotations

import types

import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import ddtk
from ddtk.models import build_model
from ddtk.parallel.elastic import ElasticAveraging
from ddtk.parallel.local_sgd import LocalSGD

pytestmark = pytest.mark.distributed

LOCAL, BATCH, FEATURES, CLASSES, LR, SEED = 15, 3, 5, 3, 0.2, 4  # 5 steps per epoch


def _model() -> torch.nn.Module:
    return build_model(
        "mlp", input_shape=(FEATURES,), num_classes=CLASSES, hidden_dims=(6,), seed=1
    )


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(LOCAL, FEATURES, generator=g), torch.randint(
        0, CLASSES, (LOCAL,), generator=g
    )


# -- single-process reference -------------------------------------------------------------
def _w0() -> torch.Tensor:
    return parameters_to_vector(_model().parameters()).detach()


def _batch(rank: int, epoch: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch t of an epoch: the trainer shuffles with the seed ``seed + epoch``, the same on every rank."""
    x, y = _data(rank)
    order = torch.randperm(LOCAL, generator=torch.Generator().manual_seed(SEED + epoch))
    idx = order[t * BATCH : (t + 1) * BATCH]
    return x[idx], y[idx]


_REF_MODEL = _model()


def _sgd(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One plain SGD step from the flat parameters ``w`` on the batch ``(x, y)``."""
    params = list(_REF_MODEL.parameters())
    vector_to_parameters(w.clone(), params)
    loss = torch.nn.functional.cross_entropy(_REF_MODEL(x), y)
    return w - LR * parameters_to_vector(torch.autograd.grad(loss, params))


def _ref_sync_sgd(world: int, epochs: int) -> torch.Tensor:
    """Synchronous data-parallel SGD: one step per round on the concatenation of the ranks' batches."""
    w = _w0()
    for e in range(epochs):
        for t in range(LOCAL // BATCH):
            parts = [_batch(r, e, t) for r in range(world)]
            w = _sgd(w, torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
    return w


def _ref_local_sgd(
    world: int, epochs: int, h: int, warmup: int, at_end: bool
) -> tuple[torch.Tensor, int]:
    ws, pending, step, syncs = [_w0()] * world, 0, 0, 0
    for e in range(epochs):
        for t in range(LOCAL // BATCH):
            ws = [_sgd(ws[r], *_batch(r, e, t)) for r in range(world)]
            pending, step = pending + 1, step + 1
            if pending >= (1 if step <= warmup else h):
                ws, pending, syncs = [torch.stack(ws).mean(0)] * world, 0, syncs + 1
        if at_end and pending:
            ws, pending, syncs = [torch.stack(ws).mean(0)] * world, 0, syncs + 1
    return ws[0], syncs


def _ref_easgd(
    world: int, epochs: int, tau: int, alpha: float
) -> tuple[list[torch.Tensor], torch.Tensor]:
    ws, center, pending = [_w0()] * world, _w0(), 0
    for e in range(epochs):
        for t in range(LOCAL // BATCH):
            ws = [_sgd(ws[r], *_batch(r, e, t)) for r in range(world)]
            pending += 1
            if pending == tau:
                diffs = [w - center for w in ws]
                ws = [w - alpha * d for w, d in zip(ws, diffs)]
                center = center + alpha * torch.stack(diffs).sum(0)
                pending = 0
    return ws, center


# -- what each rank runs -------------------------------------------------------------------
EPOCHS, TAU = 2, 3
LOCAL_SPECS = [
    {"sync_every": 1},
    {"sync_every": 2, "warmup_steps": 0, "average_at_epoch_end": True},  # syncs at 2, 4, end
    {"sync_every": 4, "warmup_steps": 2, "average_at_epoch_end": False},  # crosses epochs
    {"sync_every": 5, "warmup_steps": 0, "average_at_epoch_end": False},
    {"sync_every": 10, "warmup_steps": 0, "average_at_epoch_end": False},
]
EASGD_SPECS = [{"tau": TAU}, {"tau": TAU, "rho": 0.5}]


def _train(ctx, cls, kw):
    x, y = _data(ctx.rank)
    before = ctx.stats.per_collective.get("all_reduce[ring]")
    calls0 = before.calls if before else 0
    trainer = cls(ctx, _model(), lr=LR, batch_size=BATCH, seed=SEED, **kw)
    for _ in range(EPOCHS):
        trainer.train_epoch(x, y)
    res = {"params": trainer.get_parameters()}
    res["all_reduces"] = ctx.stats.per_collective["all_reduce[ring]"].calls - calls0
    if cls is LocalSGD:
        return res | {"syncs": trainer.sync_count}
    res |= {"center": trainer.get_center(), "exchanges": trainer.exchanges, "alpha": trainer.alpha}
    return res | {"eval_center": trainer.evaluate(x, y)["loss"]}


def _run_all(ctx):
    return {
        "local": [_train(ctx, LocalSGD, kw) for kw in LOCAL_SPECS],
        "easgd": [_train(ctx, ElasticAveraging, kw) for kw in EASGD_SPECS],
    }


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda n: f"world{n}")
def runs(request) -> list[dict]:
    """Per-rank results of every spec, for world sizes 1, 2 and 3 (one launch each)."""
    return ddtk.launch(_run_all, request.param, timeout=120)


def test_local_sgd_with_h1_is_synchronous_sgd(runs) -> None:
    sync = _ref_sync_sgd(len(runs), EPOCHS)  # one step on the concatenated batch per round
    for rank_out in runs:
        got = rank_out["local"][0]
        torch.testing.assert_close(got["params"], sync)
        assert got["syncs"] == got["all_reduces"] == EPOCHS * LOCAL // BATCH


def test_local_sgd_matches_independent_steps_then_averaging(runs) -> None:
    for k, spec in enumerate(LOCAL_SPECS[1:], start=1):
        want, syncs = _ref_local_sgd(
            len(runs),
            EPOCHS,
            spec["sync_every"],
            spec["warmup_steps"],
            spec["average_at_epoch_end"],
        )
        for rank_out in runs:
            got = rank_out["local"][k]
            torch.testing.assert_close(got["params"], want)
            assert got["syncs"] == got["all_reduces"] == syncs
    counts = [r["all_reduces"] for r in runs[0]["local"]]
    # 10 steps: H=1 -> 10; H=2 + epoch ends -> 6; warm-up 2 then H=4 -> 4; steps / H for 5, 10
    assert counts == [10, 6, 4, 2, 1]


def test_easgd_matches_reference(runs) -> None:
    world = len(runs)
    for k, alpha in enumerate((0.9 / world, LR * 0.5)):  # the default beta = 0.9, and rho = 0.5
        workers, center = _ref_easgd(world, EPOCHS, TAU, alpha)
        for r in range(world):
            got = runs[r]["easgd"][k]
            assert got["alpha"] == pytest.approx(alpha)
            torch.testing.assert_close(got["params"], workers[r])
            torch.testing.assert_close(got["center"], center)
            assert got["exchanges"] == got["all_reduces"] == 3  # steps 3, 6, 9 of 10
        model = _model()
        vector_to_parameters(center.clone(), model.parameters())
        xs, ys = zip(*(_data(r) for r in range(world)))
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).item()
        assert runs[0]["easgd"][k]["eval_center"] == pytest.approx(loss, rel=1e-5)


def test_bad_arguments_raise_clear_errors() -> None:
    ctx = types.SimpleNamespace(rank=0, world_size=2)
    for kwargs, word in [
        ({"sync_every": 0}, "sync_every"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"sync_every": 2.5}, "sync_every"),
    ]:
        with pytest.raises(ValueError, match=word):
            LocalSGD(ctx, _model(), **kwargs)
    for kwargs, word in [
        ({"tau": 0}, "tau"),
        ({"rho": 1.0, "alpha": 0.1}, "not both"),
        ({"rho": -1.0}, "rho"),
        ({"alpha": 0.6}, "beta"),
        ({"alpha": 0.0}, "alpha"),
    ]:
        with pytest.raises(ValueError, match=word):
            ElasticAveraging(ctx, _model(), **kwargs)
