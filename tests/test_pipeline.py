"""Pipeline parallelism: gradients, losses and optimiser steps against one process; schedules, timelines, plots."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import ddtk
from ddtk.parallel.pipeline import PipelineParallel, partition
from ddtk.parallel.pipeline_schedules import (
    Timeline,
    bubble_fraction,
    schedule_order,
    simulate,
    theoretical_bubble,
)

pytestmark = pytest.mark.distributed

BATCH = 10  # 4 micro-batches of 3, 3, 2, 2 samples: uneven on purpose
CONFIGS = [("naive", 1), ("gpipe", 1), ("gpipe", 2), ("gpipe", 4), ("1f1b", 1), ("1f1b", 2),
           ("1f1b", 3), ("1f1b", 4)]  # fmt: skip
OPT_STEPS = 3


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 3)
    ).double()


def _batch(step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 6, generator=g, dtype=torch.float64), torch.randint(
        0, 3, (BATCH,), generator=g
    )


def _optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _pipeline_runs(ctx) -> dict:
    """Every configuration on this rank: its layers, loss, gradients and timeline; then SGD steps."""
    first, last = ctx.rank == 0, ctx.rank == ctx.world_size - 1
    out: dict = {}
    for k, (schedule, m) in enumerate(CONFIGS):
        pipe = PipelineParallel(ctx, _model(), nn.CrossEntropyLoss(), m, schedule)
        x, y = _batch()
        if k % 2:  # x and y only where they are needed
            x, y = (x if first else None), (y if last else None)
        loss = pipe.train_step(x, y)
        grads = [p.grad.clone() for p in pipe.stage.parameters()]
        out[(schedule, m)] = {"layers": pipe.layers, "loss": loss, "grads": grads,
                              "timeline": pipe.timeline}  # fmt: skip
    split = [2, 5][: ctx.world_size - 1]
    pipe = PipelineParallel(ctx, _model(), nn.CrossEntropyLoss(), 2, "1f1b", split_points=split)
    opt = _optimizer(pipe.stage.parameters())
    losses = [pipe.train_step(*_batch(step), optimizer=opt) for step in range(OPT_STEPS)]
    out["sgd"] = {"layers": pipe.layers, "losses": losses,
                  "params": [p.detach().clone() for p in pipe.stage.parameters()]}  # fmt: skip
    return out


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda p: f"p{p}")
def runs(request) -> tuple[int, list[dict]]:
    p = request.param
    return p, ddtk.launch(_pipeline_runs, p, timeout=120, echo=False)


def _reference_grads() -> tuple[float, nn.Sequential]:
    model = _model()
    x, y = _batch()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.item(), model


@pytest.mark.parametrize("schedule,m", CONFIGS)
def test_loss_and_gradients_equal_one_process(runs, schedule, m) -> None:
    _p, results = runs
    ref_loss, ref = _reference_grads()
    covered = []
    for res in results:
        r = res[(schedule, m)]
        a, b = r["layers"]
        covered += range(a, b)
        expected = [q.grad for q in ref[a:b].parameters()]
        assert len(r["grads"]) == len(expected)
        for got, want in zip(r["grads"], expected):
            torch.testing.assert_close(got, want)
        assert r["loss"] == pytest.approx(ref_loss, rel=1e-12)  # broadcast to every rank
    assert covered == list(range(len(ref)))  # the stages tile the model


def test_optimizer_steps_equal_one_process(runs) -> None:
    _, results = runs
    model = _model()
    opt = _optimizer(model.parameters())
    ref_losses = []
    for step in range(OPT_STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())
    for res in results:
        a, b = res["sgd"]["layers"]
        for got, want in zip(res["sgd"]["params"], model[a:b].parameters(), strict=True):
            torch.testing.assert_close(got, want.detach())
        assert res["sgd"]["losses"] == pytest.approx(ref_losses, rel=1e-12)
    assert [r["sgd"]["layers"] for r in results] == [[(0, 6)], [(0, 2), (2, 6)],
                                                     [(0, 2), (2, 5), (5, 6)]][len(results) - 1]  # fmt: skip


def test_1f1b_holds_at_most_p_microbatches_and_gpipe_holds_m(runs) -> None:
    p, results = runs
    for m in (1, 2, 4):
        gpipe = [res[("gpipe", m)]["timeline"].peak_in_flight for res in results]
        assert gpipe == [m] * p
        one_f_one_b = [res[("1f1b", m)]["timeline"].peak_in_flight for res in results]
        assert one_f_one_b == [min(p - r, m) for r in range(p)]
        assert max(one_f_one_b) <= p
    for res in results:  # every micro-batch's activations are released by the end of the step
        assert all(res[c]["timeline"].in_flight[-1][1] == 0 for c in CONFIGS)


EXPECTED_ORDERS = {  # (schedule, p, m) -> per-rank order, written out by hand
    ("1f1b", 3, 4): [
        "F0 F1 F2 B0 F3 B1 B2 B3", "F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"],
    ("1f1b", 2, 4): ["F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"],
    ("1f1b", 3, 2): ["F0 F1 B0 B1", "F0 F1 B0 B1", "F0 B0 F1 B1"],
    ("gpipe", 3, 4): ["F0 F1 F2 F3 B0 B1 B2 B3"] * 3,
    ("naive", 2, 1): ["F0 B0"] * 2,
    ("1f1b", 1, 4): ["F0 B0 F1 B1 F2 B2 F3 B3"],
    ("gpipe", 1, 2): ["F0 F1 B0 B1"],
}  # fmt: skip


def test_recorded_order_matches_the_schedule(runs) -> None:
    p, results = runs
    keys = [key for key in EXPECTED_ORDERS if key[1] == p]
    assert keys
    for schedule, _, m in keys:
        recorded = [" ".join(res[(schedule, m)]["timeline"].order) for res in results]
        assert recorded == EXPECTED_ORDERS[(schedule, p, m)]
        assert recorded == [" ".join(map(str, schedule_order(schedule, s, p, m))) for s in range(p)]


def test_timeline_events_are_ordered_and_measured(runs) -> None:
    for res in runs[1]:
        events = res[("gpipe", 4)]["timeline"].events
        assert all(0 <= e.start <= e.end for e in events)
        assert all(a.end <= b.start for a, b in itertools.pairwise(events))
        assert 0.0 <= bubble_fraction([r[("gpipe", 4)]["timeline"] for r in runs[1]]) < 1.0


# -- schedules and bubbles without processes ----------------------------------------------
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 4), (3, 3), (4, 8)])
@pytest.mark.parametrize("backward_time", [1.0, 2.0])
def test_simulated_bubble_is_the_textbook_formula(schedule, p, m, backward_time) -> None:
    timelines = simulate(schedule, p, m, 1.0, backward_time)
    assert bubble_fraction(timelines) == pytest.approx((p - 1) / (m + p - 1))
    total = max(e.end for t in timelines for e in t.events)
    assert total == pytest.approx((m + p - 1) * (1.0 + backward_time))
    assert theoretical_bubble(p, m) == pytest.approx((p - 1) / (m + p - 1))


def test_bubble_fraction_counts_gaps_as_idle() -> None:
    a, b = Timeline(0), Timeline(1)
    a.record("F", 0, 0.0, 1.0)
    a.record("B", 0, 3.0, 4.0)  # idle from 1 to 3
    b.record("F", 0, 1.0, 2.0)
    b.record("B", 0, 2.0, 3.0)  # idle from 0 to 1 and from 3 to 4
    assert bubble_fraction([a, b]) == pytest.approx(1 - 4 / 8)
    assert a.in_flight == [(1.0, 1), (4.0, 0)] and a.peak_in_flight == 1
    with pytest.raises(ValueError, match="at least one event"):
        bubble_fraction([Timeline(0)])


# -- partitions and bad input ----------------------------------------------------------
def test_partition_balances_parameters_or_layers() -> None:
    model = _model()  # parameters per layer: 56, 0, 72, 0, 72, 27
    assert partition(model, 2) == [(0, 3), (3, 6)]  # 128 | 99
    assert partition(model, 3) == [(0, 2), (2, 4), (4, 6)]  # 56 | 72 | 99
    assert partition(model, 3, by="layers") == [(0, 2), (2, 4), (4, 6)]
    assert partition(model, 6, by="layers") == [(i, i + 1) for i in range(6)]
    assert partition(model, 2, balance=[1, 5]) == [(0, 1), (1, 6)]
    assert partition(model, 3, split_points=[1, 4]) == [(0, 1), (1, 4), (4, 6)]


def _ctx(world_size: int, rank: int = 0) -> SimpleNamespace:
    return SimpleNamespace(rank=rank, world_size=world_size, device=torch.device("cpu"))


def test_stage_keeps_its_layers_of_a_sequential_subclass() -> None:
    from ddtk.models import build_model

    model = build_model("mlp", input_shape=(4,), hidden_dims=(8, 8), num_classes=3)  # an MLP class
    stages = [PipelineParallel(_ctx(3, r), model, nn.CrossEntropyLoss()).stage for r in range(3)]
    assert [type(s) for s in stages] == [nn.Sequential] * 3
    assert [m for s in stages for m in s] == list(model)  # the same module objects, in order


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"world_size": 7}, ValueError, "6 layers into 7 stages"),
        ({"num_microbatches": 0}, ValueError, "num_microbatches must be >= 1"),
        ({"num_microbatches": 2.0}, TypeError, "num_microbatches must be an int"),
        ({"schedule": "interleaved"}, ValueError, "unknown schedule"),
        ({"schedule": "naive", "num_microbatches": 4}, ValueError, "whole batch as one"),
        ({"balance": [3, 2]}, ValueError, "balance must list 2 positive layer counts summing to 6"),
        ({"split_points": [0]}, ValueError, "split_points must be 1 increasing"),
        ({"balance": [3, 3], "split_points": [3]}, ValueError, "not both"),
        ({"partition_by": "flops"}, ValueError, "unknown partition"),
        ({"model": nn.Linear(2, 2)}, TypeError, "needs an nn.Sequential"),
        ({"loss_fn": "mse"}, TypeError, "loss_fn must be callable"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, match) -> None:
    args = {"model": _model(), "loss_fn": nn.CrossEntropyLoss(), "num_microbatches": 2,
            "schedule": "1f1b"}  # fmt: skip
    ctx = _ctx(kwargs.pop("world_size", 2))
    args.update(kwargs)
    with pytest.raises(error, match=match):
        PipelineParallel(ctx, **args)


def test_bad_batches_raise_before_any_message() -> None:
    first = PipelineParallel(_ctx(2, 0), _model(), nn.CrossEntropyLoss(), 4, "gpipe")
    with pytest.raises(ValueError, match="3 samples; it cannot be split into num_microbatches=4"):
        first.train_step(torch.randn(3, 6, dtype=torch.float64), None)
    with pytest.raises(TypeError, match="stage 0 needs x"):
        first.train_step(None, torch.zeros(4, dtype=torch.long))
    last = PipelineParallel(_ctx(2, 1), _model(), nn.CrossEntropyLoss(), 4, "gpipe")
    with pytest.raises(TypeError, match="stage 1 needs y"):
        last.train_step(torch.randn(4, 6), None)


# -- pictures --------------------------------------------------------------------------
def test_plots_draw_measured_and_logical_timelines(runs, tmp_path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddtk.viz.pipeline import plot_in_flight, plot_schedule, plot_timeline

    p, results = runs
    fig, axes = plt.subplots(3, 1)
    timelines = [res[("1f1b", 4)]["timeline"] for res in results]
    plot_timeline(timelines, ax=axes[0])
    assert axes[0].get_title().startswith("bubble ")
    assert len(axes[0].patches) == 2 * 4 * p  # one block per forward and backward
    plot_schedule("gpipe", p, 4, ax=axes[1])
    labels = [t.get_text() for t in axes[1].texts]
    assert labels == ["0", "1", "2", "3"] * (2 * p)
    plot_in_flight(timelines, ax=axes[2])
    fig.savefig(tmp_path / "pipe.png")
    plt.close(fig)
    assert (tmp_path / "pipe.png").stat().st_size > 0


# -- the benchmark -----------------------------------------------------------------------
def _bench(*argv: str) -> int:
    import argparse

    from ddtk.bench import pipeline as bench

    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["pipeline", *argv])
    return args.func(args)


def test_bench_runs_on_a_tiny_configuration(tmp_path) -> None:
    import json

    argv = ["-p", "2", "-m", "1,2", "--stage-ms", "8", "--steps", "1", "--batch", "8",
            "--json", str(tmp_path / "p.json"), "--plot", str(tmp_path / "p.png")]  # fmt: skip
    assert _bench(*argv) == 0
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    got = [(r["schedule"], r["microbatches"], r["peak_in_flight"]) for r in rows]
    assert got == [
        ("naive", 1, 1),
        ("gpipe", 1, 1),
        ("gpipe", 2, 2),
        ("1f1b", 1, 1),
        ("1f1b", 2, 2),
    ]
    for r in rows:
        assert r["bubble_theory"] == pytest.approx(1 / (r["microbatches"] + 1))
        assert 0.0 < r["bubble"] < 1.0 and r["step_ms"] > 0
        assert r["ideal_step_ms"] == pytest.approx((r["microbatches"] + 1) / r["microbatches"] * 24)
        assert len(r["timeline"]) == 2 and len(r["timeline"][0]) == 2 * r["microbatches"]
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize(
    "argv",
    [
        ["-p", "0"],
        ["-p", "9"],
        ["-m", "0"],
        ["--schedules", "zigzag"],
        ["--stage-ms", "-1"],
        ["-m", "a"],
        ["-m", "16", "--batch", "8"],
    ],
)
def test_bench_rejects_bad_arguments(argv, capsys) -> None:
    assert _bench(*argv) == 2
    assert "ddtk bench pipeline: " in capsys.readouterr().out
