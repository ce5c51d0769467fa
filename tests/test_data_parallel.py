"""DataParallel: equals one process on the concatenated batch, equals torch DDP, buckets once per step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ddtk
from ddtk.models import build_model
from ddtk.parallel.data_parallel import DataParallel, assign_buckets

pytestmark = pytest.mark.distributed

STEPS, LOCAL_BATCH, LR = 3, 6, 0.2


def _global_batches(world_size: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    n = LOCAL_BATCH * world_size
    return [
        (torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))
        for _ in range(STEPS)
    ]


def _local(
    batch: tuple[torch.Tensor, torch.Tensor], rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's contiguous share of a global batch."""
    x, y = batch
    return x[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH], y[
        rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH
    ]


def _reference(world_size: int) -> torch.Tensor:
    """One process, plain SGD, on the concatenated global batches."""
    model = build_model("cnn", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for x, y in _global_batches(world_size):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return nn.utils.parameters_to_vector(model.parameters()).detach()


def _ddtk_and_ddp(ctx, bucket_mb: float, overlap: bool, algorithm: str) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Different initial weights on every rank: DataParallel must broadcast rank 0's.
    dp = DataParallel(
        ctx, build_model("cnn", seed=ctx.rank), lr=LR, momentum=0.9,
        bucket_mb=bucket_mb, overlap=overlap, algorithm=algorithm,
    )  # fmt: skip
    ddp = DDP(build_model("cnn", seed=0))
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    ctx.stats.reset()
    for batch in _global_batches(ctx.world_size):
        x, y = _local(batch, ctx.rank)
        dp.train_step(x, y)
        ddp_opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        ddp_opt.step()
    reduce_calls = sum(
        s.calls for k, s in ctx.stats.per_collective.items() if k.startswith("all_reduce")
    )
    return {
        "dp": dp.get_parameters(),
        "ddp": nn.utils.parameters_to_vector(ddp.parameters()).detach(),
        "reductions": dp.stats["reductions"],
        "reduce_calls": reduce_calls,
        "buckets": len(dp.buckets),
    }


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_matches_single_process_and_ddp(world_size: int) -> None:
    results = ddtk.launch(_ddtk_and_ddp, world_size, args=(0.02, True, "ring"), timeout=120)
    expected = _reference(world_size)
    for r in results:
        torch.testing.assert_close(r["dp"], expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r["dp"], r["ddp"], rtol=1e-5, atol=1e-6)
        assert torch.equal(r["dp"], results[0]["dp"]), "replicas drifted apart"


@pytest.mark.parametrize(
    ("bucket_mb", "overlap", "algorithm"),
    [(25.0, False, "ring"), (0.005, True, "tree"), (0.005, False, "recursive_doubling")],
)
def test_each_bucket_reduced_once_per_step(bucket_mb: float, overlap: bool, algorithm: str) -> None:
    results = ddtk.launch(_ddtk_and_ddp, 3, args=(bucket_mb, overlap, algorithm), timeout=120)
    expected = _reference(3)
    for r in results:
        assert r["reductions"] == [STEPS] * r["buckets"]
        assert (
            r["reduce_calls"] == STEPS * r["buckets"]
        )  # counted by the context, not by DataParallel
        torch.testing.assert_close(r["dp"], expected, rtol=1e-5, atol=1e-6)
    assert (results[0]["buckets"] == 1) == (bucket_mb == 25.0)


def _accumulate(ctx, micro: int) -> dict:
    dp = DataParallel(ctx, build_model("mlp", seed=0), lr=LR, bucket_mb=0.01)
    for batch in _global_batches(ctx.world_size):
        x, y = _local(batch, ctx.rank)
        dp.optimizer.zero_grad()
        xs, ys = x.chunk(micro), y.chunk(micro)
        with dp.no_sync():
            for xm, ym in zip(xs[:-1], ys[:-1]):
                (dp.local_loss(xm, ym) / micro).backward()
        (dp.local_loss(xs[-1], ys[-1]) / micro).backward()
        dp.optimizer.step()
    return {"params": dp.get_parameters(), "reductions": dp.stats["reductions"]}


def test_no_sync_accumulation_equals_one_large_batch() -> None:
    results = ddtk.launch(_accumulate, 2, args=(3,), timeout=120)
    model = build_model("mlp", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in _global_batches(2):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    expected = nn.utils.parameters_to_vector(model.parameters()).detach()
    for r in results:
        torch.testing.assert_close(r["params"], expected, rtol=1e-5, atol=1e-6)
        assert r["reductions"] == [STEPS] * len(
            r["reductions"]
        )  # once per step, not per micro-batch


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, use_b: bool = False) -> torch.Tensor:
        return self.b(x) if use_b else self.a(x)


def _unused(ctx) -> torch.Tensor:
    model = _TwoHeads()
    dp = DataParallel(ctx, model, lr=0.5, bucket_mb=1e-5)
    x = torch.ones(3, 4) * (ctx.rank + 1)
    dp.optimizer.zero_grad()
    # rank 1 uses head b, rank 0 head a: each rank lacks some gradients, and must not hang
    model(x, use_b=ctx.rank == 1).sum().backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def test_unused_parameters_contribute_zeros() -> None:
    g0, g1 = ddtk.launch(_unused, 2, timeout=60)
    assert torch.equal(g0, g1)
    # head a: only rank 0 (inputs of ones) contributes; head b: only rank 1 (inputs of twos); mean over 2
    grad_a = torch.cat([torch.full((8,), 3.0), torch.full((2,), 3.0)]) / 2
    grad_b = torch.cat([torch.full((8,), 6.0), torch.full((2,), 3.0)]) / 2
    torch.testing.assert_close(g0, torch.cat([grad_a, grad_b]))


def test_assign_buckets_reverse_order_and_cap() -> None:
    params = [nn.Parameter(torch.zeros(n)) for n in (10, 300, 5, 5)]
    groups = assign_buckets(params, bucket_bytes=40)  # 10 floats
    assert [[p.numel() for p in g] for g in groups] == [[5, 5], [300], [10]]
    assert sum(len(g) for g in assign_buckets(params, bucket_bytes=10**9)) == 4


def _bad(ctx, kwargs) -> None:
    DataParallel(ctx, build_model("mlp"), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"algorithm": "butterfly"}, "unknown algorithm"), ({"bucket_mb": 0}, "bucket_mb")],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ddtk.RankError, match=message):
        ddtk.launch(_bad, 1, args=(kwargs,), timeout=60)


def test_bench_dp_measures_every_contender() -> None:
    from ddtk.bench import dp as bench_dp

    rows = bench_dp.measure([1, 2], model_name="mlp", batch=8, steps=2, rounds=1)
    assert [(r["world_size"], r["contender"]) for r in rows] == [
        (n, c) for n in (1, 2) for c in bench_dp.VARIANTS
    ]
    for r in rows:
        assert r["samples_per_s"] > 0 and r["vs_ddp"] > 0 and r["efficiency"] > 0
        assert r["samples_per_s"] == pytest.approx(r["world_size"] * 8 * 2 / r["round_median_s"])
    assert all(r["vs_ddp"] == 1.0 for r in rows if r["contender"] == "ddp")


def test_bench_dp_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    from ddtk.cli import main

    assert main(["bench", "dp", "--world-sizes", "0"]) == 2
    assert "positive" in capsys.readouterr().out
