"""Gradient accumulation equals one step on the whole batch, alone and under DataParallel."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ddtk
from ddtk.models import build_model
from ddtk.parallel.accumulation import GradientAccumulator

pytestmark = pytest.mark.distributed

STEPS, LR = 3, 0.1


def _batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))
        for _ in range(STEPS)
    ]


def _reference(batches) -> tuple[nn.Module, list[torch.Tensor]]:
    """Plain SGD with momentum on the whole batches; returns the model and the first step's grads."""
    model = build_model("mlp", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    first = None
    for x, y in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        first = first or [p.grad.clone() for p in model.parameters()]
        opt.step()
    return model, first


@pytest.mark.parametrize("k", [1, 3, 4])
def test_uneven_micro_batches_equal_one_large_batch(k: int) -> None:
    batches = _batches(13)  # 13 samples: micro-batches of 5, 4, 4 for k=3
    ref, ref_grads = _reference(batches)
    model = build_model("mlp", seed=0)
    acc = GradientAccumulator(
        model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), steps=k
    )
    for i, (x, y) in enumerate(batches):
        want_loss = nn.functional.cross_entropy(model(x), y).item()
        loss = acc.step(x, y)
        assert loss == pytest.approx(want_loss, rel=1e-5)
        if i == 0:
            for got, want in zip([p.grad for p in model.parameters()], ref_grads, strict=True):
                torch.testing.assert_close(got, want)
    torch.testing.assert_close(nn.utils.parameters_to_vector(model.parameters()),
                               nn.utils.parameters_to_vector(ref.parameters()))  # fmt: skip
    assert (acc.micro_batches_seen, acc.optimizer_steps) == (k * STEPS, STEPS)
    if k == 3:
        assert [len(y) for _, y in acc.split(*batches[0])] == [5, 4, 4]


def test_weights_follow_sizes_not_counts() -> None:
    """Micro-batches of 1 and 7 samples: plain 1/k averaging would be wrong, size weighting is right."""
    ((x, y),) = _batches(8)[:1]
    model = build_model("mlp", seed=0)
    acc = GradientAccumulator(model, torch.optim.SGD(model.parameters(), lr=LR), steps=2)
    acc.backward([(x[:1], y[:1]), (x[1:], y[1:])])
    ref = build_model("mlp", seed=0)
    nn.functional.cross_entropy(ref(x), y).backward()
    for got, want in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_bad_input() -> None:
    model = build_model("mlp", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    with pytest.raises(ValueError, match="steps"):
        GradientAccumulator(model, opt, steps=0)
    acc = GradientAccumulator(model, opt, steps=4)
    with pytest.raises(ValueError, match="3 samples cannot make 4"):
        acc.step(torch.randn(3, 1, 8, 8), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="differ in length"):
        acc.split(torch.randn(5, 1, 8, 8), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="non-empty"):
        acc.backward([])


def _data_parallel(ctx, k: int, local: int) -> dict:
    from ddtk.parallel.data_parallel import DataParallel

    dp = DataParallel(
        ctx, build_model("mlp", seed=ctx.rank), lr=LR, momentum=0.9, bucket_mb=0.005
    )  # several buckets
    acc = GradientAccumulator.from_data_parallel(dp, steps=k)
    for x, y in _batches(local * ctx.world_size):
        acc.step(
            x[ctx.rank * local : (ctx.rank + 1) * local],
            y[ctx.rank * local : (ctx.rank + 1) * local],
        )
    dp.close()
    return {"params": dp.get_parameters(), "reductions": dp.stats["reductions"],
            "backward_passes": dp.stats["backward_passes"]}  # fmt: skip


@pytest.mark.parametrize("world_size", [2, 3])
def test_accumulation_with_data_parallel_equals_one_process(world_size: int) -> None:
    k, local = 3, 6
    out = ddtk.launch(_data_parallel, world_size, args=(k, local), timeout=120)
    ref, _ = _reference(_batches(local * world_size))
    want = nn.utils.parameters_to_vector(ref.parameters()).detach()
    for r in out:
        torch.testing.assert_close(r["params"], want)
        # no_sync: one averaging per bucket per optimiser step, not one per micro-batch
        assert r["backward_passes"] == STEPS
        assert r["reductions"] == [STEPS] * len(r["reductions"]) and len(r["reductions"]) > 1
