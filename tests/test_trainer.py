"""The shared trainer interface (ddtk.parallel.trainer) and its callbacks (ddtk.parallel.callbacks).

A tiny strategy, plain local SGD without any synchronisation, exercises the base class.
Tests of purely local behaviour use a stand-in context for one rank; everything that
communicates (evaluate, fit with eval_data, Report) runs on real ranks through ddtk.launch.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import ddtk
from ddtk.data import DataPartitioner, load_dataset
from ddtk.models import build_model
from ddtk.parallel.callbacks import History, Lambda, Report
from ddtk.parallel.trainer import DistributedTrainer, batches, loss_function

TIMEOUT = 120


class LocalSGD(DistributedTrainer):
    """One optimiser step per local batch, no communication."""

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss = self.local_loss(x, y)
        loss.backward()
        self.optimizer.step()
        return loss.item()


class Recorder(LocalSGD):
    """Also remembers the labels of every batch it saw."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[list[int]] = []

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        self.seen.append(y.tolist())
        return super().train_step(x, y)


def _one_rank(reports: list | None = None) -> SimpleNamespace:
    """A stand-in for the context of a single rank (only what local code paths touch)."""
    return SimpleNamespace(
        rank=0, world_size=1, report=(reports if reports is not None else []).append
    )


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    return ds.x[:301], ds.y[:301]


# -- evaluate: the global metric equals the metric over the concatenated data ------------------
def _evaluate(ctx, x, y, xr, yr):
    out = {}
    idx = DataPartitioner(len(y), ctx.world_size, "shuffled", seed=1).get_indices(ctx.rank)
    t = LocalSGD(ctx, build_model("mlp", seed=0))
    out["digits"] = t.evaluate(x[idx], y[idx])
    tiny = DataPartitioner(2, ctx.world_size).get_indices(ctx.rank)  # 3 ranks: rank 2 has none
    out["tiny"] = t.evaluate(x[:2][tiny], y[:2][tiny])
    ridx = DataPartitioner(len(yr), ctx.world_size, "contiguous").get_indices(ctx.rank)
    reg = LocalSGD(ctx, build_model("linear", input_shape=(10,), num_classes=1), loss="mse")
    out["regression"] = reg.evaluate(xr[ridx], yr[ridx])
    out["shares"] = len(idx)
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_evaluate_equals_single_process_metrics(world_size: int, digits) -> None:
    x, y = digits
    reg = load_dataset("synthetic_regression", n=101, seed=0)
    res = ddtk.launch(_evaluate, world_size, args=(x, y, reg.x, reg.y), timeout=TIMEOUT)
    assert sum(r["shares"] for r in res) == 301
    if world_size > 1:
        assert len({r["shares"] for r in res}) == 2  # uneven shares
    model = build_model("mlp", seed=0)
    with torch.no_grad():
        logits = model(x)
        ce = F.cross_entropy(logits.double(), y).item()
        acc = (logits.argmax(1) == y).double().mean().item()
        tiny = F.cross_entropy(logits[:2].double(), y[:2]).item()
        tiny_acc = (logits[:2].argmax(1) == y[:2]).double().mean().item()
        mse = F.mse_loss(build_model("linear", (10,), 1)(reg.x).double(), reg.y.double()).item()
    assert 0.02 < acc < 0.5  # an untrained model: some right, most wrong
    for r in res:
        assert r["digits"]["loss"] == pytest.approx(ce, rel=1e-6)
        assert r["digits"]["accuracy"] == pytest.approx(acc, abs=1e-12)
        assert r["digits"]["samples"] == 301
        assert r["tiny"]["loss"] == pytest.approx(tiny, rel=1e-6)
        assert r["tiny"]["accuracy"] == pytest.approx(tiny_acc, abs=1e-12)
        assert r["regression"]["loss"] == pytest.approx(mse, rel=1e-6)
        assert r["regression"]["accuracy"] != r["regression"]["accuracy"]  # NaN for regression


# -- fit, History, Lambda and live Report on real ranks ----------------------------------------
def _fit_with_reports(ctx, x, y, marker: str):
    idx = DataPartitioner(len(y), ctx.world_size, "shuffled", seed=2).get_indices(ctx.rank)
    hist, calls = History(), []
    lam = Lambda(on_epoch=lambda tr, m: calls.append((tr is trainer, m["epoch"])))
    trainer = LocalSGD(
        ctx,
        build_model("mlp", seed=0),
        lr=0.1,
        batch_size=50,
        callbacks=[hist, lam, Report(every=2)],
    )
    metrics = trainer.fit(x[idx], y[idx], epochs=3, eval_data=(x[idx], y[idx]))
    live = False
    if ctx.rank == 0:  # the parent creates the marker when it has received a report
        deadline = time.monotonic() + 30
        while not (live := Path(marker).exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
    return {
        "metrics": metrics,
        "history": hist.as_dict(),
        "lambda": calls,
        "live": live,
        "global_loss": trainer.get_global_loss(),
        "local_loss": trainer.get_local_loss(),
    }


@pytest.mark.distributed
def test_fit_callbacks_and_live_reports(digits, tmp_path: Path) -> None:
    x, y = digits
    marker = tmp_path / "report-received"
    reports: list[tuple[int, dict]] = []

    def on_report(rank: int, value: dict) -> None:
        reports.append((rank, value))
        marker.touch()

    res = ddtk.launch(
        _fit_with_reports, 2, args=(x, y, str(marker)), timeout=TIMEOUT, on_report=on_report
    )
    r0 = res[0]
    assert r0["live"], "rank 0's reports did not reach the parent while the ranks ran"
    for r in res:
        m = r["metrics"]
        assert [e["epoch"] for e in m] == [1, 2, 3]
        assert all({"loss", "samples", "seconds", "eval_loss", "accuracy"} <= set(e) for e in m)
        assert m[-1]["loss"] < m[0]["loss"] and m[-1]["eval_loss"] < m[0]["eval_loss"]
        assert r["history"]["epochs"]["loss"] == [e["loss"] for e in m]  # on_epoch got each dict
        assert r["lambda"] == [(True, 1), (True, 2), (True, 3)]
        assert r["local_loss"] == m[-1]["loss"]
        # the global loss is the per-sample mean over both ranks' last epoch
        n0, n1 = (q["metrics"][-1]["samples"] for q in res)
        mean = (res[0]["local_loss"] * n0 + res[1]["local_loss"] * n1) / (n0 + n1)
        assert r["global_loss"] == pytest.approx(mean, rel=1e-12)
    # eval metrics are global: the same on both ranks
    assert [e["accuracy"] for e in res[0]["metrics"]] == [e["accuracy"] for e in res[1]["metrics"]]

    # only rank 0 reports: every 2nd step, and every epoch, in the order they happened
    steps = r0["history"]["steps"]
    assert steps["step"] == list(range(1, len(steps["step"]) + 1))
    expected = []
    for epoch in range(3):
        for s, e, loss in zip(steps["step"], steps["epoch"], steps["loss"]):
            if e == epoch + 1 and s % 2 == 0:  # steps carry the 1-based epoch they belong to
                expected.append({"kind": "step", "step": s, "epoch": e, "loss": loss})
        expected.append({"kind": "epoch", **r0["metrics"][epoch]})
    assert [rank for rank, _ in reports] == [0] * len(expected)
    assert [v for _, v in reports] == expected


# -- local behaviour (one rank, stand-in context) ----------------------------------------------
def test_parameters_round_trip() -> None:
    a = LocalSGD(_one_rank(), build_model("mlp", seed=0))
    b = LocalSGD(_one_rank(), build_model("mlp", seed=1))
    flat = a.get_parameters()
    assert flat.shape == (6570,) and flat.dtype == torch.float32
    flat_copy = flat.clone()
    flat += 1.0  # a copy: changing it does not touch the model
    assert torch.equal(a.get_parameters(), flat_copy)
    b.set_parameters(flat_copy.double())  # converted to the model's dtype
    assert torch.equal(b.get_parameters(), flat_copy)
    x = torch.randn(4, 1, 8, 8)
    assert torch.equal(a.predict(x), b.predict(x))
    with pytest.raises(ValueError, match="expected a flat vector of 6570 parameters, got 6569"):
        b.set_parameters(torch.zeros(6569))


def test_one_full_batch_epoch_is_one_sgd_step() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 5, generator=g), torch.randint(0, 3, (12,), generator=g)
    trainer = LocalSGD(_one_rank(), build_model("linear", (5,), 3, seed=0), lr=0.3, batch_size=12)
    w, b = (p.detach().clone() for p in build_model("linear", (5,), 3, seed=0).parameters())
    # reference: the gradient of the mean cross-entropy of a linear model, by hand
    p = torch.softmax(x @ w.T + b, 1)
    delta = (p - F.one_hot(y, 3)) / len(y)
    loss = F.cross_entropy(x @ w.T + b, y).item()
    out = trainer.train_epoch(x, y)
    assert out["epoch"] == 1 and out["samples"] == 12
    assert out["loss"] == pytest.approx(loss, rel=1e-6)
    new_w, new_b = trainer.model.parameters()
    torch.testing.assert_close(new_w.detach(), w - 0.3 * delta.T @ x)
    torch.testing.assert_close(new_b.detach(), b - 0.3 * delta.sum(0))


def test_batches_cover_every_sample_once_and_are_seeded() -> None:
    x, y = torch.arange(10).float()[:, None], torch.arange(10)
    plain = list(batches(x, y, 4))
    assert [b[1].tolist() for b in plain] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(torch.equal(bx[:, 0].long(), by) for bx, by in plain)  # rows stay paired
    assert [b[1].tolist() for b in batches(x, y, 4, drop_last=True)] == [[0, 1, 2, 3], [4, 5, 6, 7]]

    def order(seed: int) -> list[int]:
        return [i for _, by in batches(x, y, 3, seed=seed) for i in by.tolist()]

    assert sorted(order(5)) == list(range(10)) and order(5) != list(range(10))
    assert order(5) == order(5) and order(5) != order(6)


def test_train_epoch_sees_every_sample_once_in_a_new_order_each_epoch() -> None:
    x, y = torch.randn(23, 64), torch.arange(23) % 10

    def run(seed: int) -> list[list[int]]:
        t = Recorder(_one_rank(), build_model("linear", (64,), 10), batch_size=5, seed=seed)
        per_epoch = []
        for _ in range(2):
            t.seen.clear()
            t.train_epoch(x, y)
            assert [len(b) for b in t.seen] == [5, 5, 5, 5, 3]
            per_epoch.append([v for b in t.seen for v in b])
        return per_epoch

    e1, e2 = run(seed=0)
    assert sorted(e1) == sorted(e2) == sorted(y.tolist())
    assert e1 != e2  # reshuffled every epoch
    assert run(seed=0) == [e1, e2] and run(seed=1) != [e1, e2]


def test_history_lambda_and_fit_without_eval() -> None:
    hist, steps, epochs = History(), [], []
    lam = Lambda(
        on_step=lambda t, m: steps.append(m["step"]), on_epoch=lambda t, m: epochs.append(m)
    )
    t = LocalSGD(
        _one_rank(), build_model("linear", (4,), 2), batch_size=4, callbacks=[hist, lam, Lambda()]
    )
    x, y = torch.randn(10, 4), torch.tensor([0, 1] * 5)
    out = t.fit(x, y, epochs=2)
    assert [m["epoch"] for m in out] == [1, 2] and "accuracy" not in out[0]
    assert epochs == out  # on_epoch received the dicts fit returned
    assert steps == [1, 2, 3, 4, 5, 6] and t.step_count == 6
    h = hist.as_dict()
    assert h["steps"]["step"] == steps and len(h["steps"]["loss"]) == 6
    assert h["epochs"]["epoch"] == [1, 2] and h["epochs"]["loss"] == [m["loss"] for m in out]
    step_epochs = h["steps"]["epoch"]  # the epoch in progress, the same for each of its 3 steps
    assert step_epochs[:3] == [step_epochs[0]] * 3 and step_epochs[3:] == [step_epochs[0] + 1] * 3
    # the epoch loss is the sample-weighted mean of its step losses (batches of 4, 4, 2)
    first = h["steps"]["loss"][:3]
    assert out[0]["loss"] == pytest.approx((4 * first[0] + 4 * first[1] + 2 * first[2]) / 10)


def test_report_every_and_all_ranks() -> None:
    sent: list = []
    ctx = _one_rank(sent)
    t = LocalSGD(ctx, build_model("linear", (4,), 2), batch_size=2, callbacks=[Report(every=3)])
    t.fit(torch.randn(10, 4), torch.tensor([0, 1] * 5), epochs=1)
    assert [(v["kind"], v.get("step")) for v in sent] == [("step", 3), ("epoch", None)]
    other = SimpleNamespace(ctx=SimpleNamespace(rank=1, report=sent.append))
    sent.clear()
    Report().on_epoch(other, {"epoch": 1})
    assert sent == []  # not rank 0
    Report(all_ranks=True).on_epoch(other, {"epoch": 1})
    assert sent == [{"kind": "epoch", "epoch": 1}]
    with pytest.raises(ValueError, match="every must be >= 1, got 0"):
        Report(every=0)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"lr": 0.0}, "lr must be a finite number > 0, got 0.0"),
        ({"lr": -1.0}, "lr must be a finite number > 0"),
        ({"lr": float("nan")}, "lr must be a finite number"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
        ({"loss": "hinge"}, "unknown loss 'hinge'; choose one of cross_entropy, mse"),
    ],
)
def test_bad_arguments(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        LocalSGD(_one_rank(), build_model("linear", (4,), 2), **kwargs)


def test_mismatched_data_and_labels() -> None:
    t = LocalSGD(_one_rank(), build_model("linear", (4,), 2))
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 0, 1])
    pattern = "data and labels differ in length: 5 samples, 4 labels"
    with pytest.raises(ValueError, match=pattern):
        t.train_epoch(x, y)
    with pytest.raises(ValueError, match=pattern):
        t.fit(x, y, epochs=1)
    assert t.step_count == 0  # raised before any step


def test_loss_functions() -> None:
    assert isinstance(loss_function("cross_entropy"), torch.nn.CrossEntropyLoss)
    assert isinstance(loss_function("mse"), torch.nn.MSELoss)


@pytest.mark.filterwarnings("ignore:Using a target size:UserWarning")
def test_evaluate_rejects_mismatched_lengths() -> None:
    ctx = SimpleNamespace(rank=0, world_size=1, all_reduce=lambda t, **kw: t.clone())
    t = LocalSGD(ctx, build_model("linear", (3,), 1), loss="mse")
    with pytest.raises(ValueError, match="data and labels differ in length"):
        t.evaluate(torch.zeros(5, 3), torch.zeros(4))  # MSE broadcasts (5, 1) with (4,) silently


def test_set_parameters_copies_the_vector() -> None:
    ctx = SimpleNamespace(rank=0, world_size=1, all_reduce=lambda t, **kw: t.clone())
    t = LocalSGD(ctx, build_model("linear", (3,), 2))
    vec = torch.arange(8.0)
    t.set_parameters(vec)
    with torch.no_grad():
        next(t.model.parameters()).add_(
            100.0
        )  # training the model must not change the caller's vector
    assert torch.equal(vec, torch.arange(8.0))
    assert torch.equal(t.get_parameters()[6:], torch.tensor([6.0, 7.0]))
