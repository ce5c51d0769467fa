"""Tensor-parallel layers against single-process ``nn.Linear`` / MLP references.

One launch per world size (1, 2, 3, 4) runs every case on real ranks: the layers
are loaded from full ``nn.Linear`` weights built here with ``torch.manual_seed``,
fed the same inputs, and back-propagated with a fixed upstream gradient. This
process recomputes every output and gradient with plain ``nn.Linear`` and
autograd, slices the full gradients into each rank's shard with ``torch.chunk``,
and compares with ``torch.testing.assert_close``. Communication is checked from
``ctx.stats``: one ring all-reduce forward and one backward for the MLP block,
with exactly the bytes of :func:`tp_mlp_comm_bytes` (sizes chosen so that
``tokens * hidden`` divides by every world size, where the ring's chunks are equal).
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import ddtk
from ddtk.parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelMLP,
    dense_mlp,
    tp_mlp_comm_bytes,
)
from ddtk.parallel.tensor_ops import gather_from_tensor_parallel, scatter_to_tensor_parallel

WORLD_SIZES = (1, 2, 3, 4)
HIDDEN, FFN = 6, 24  # FFN divisible by 1..4
BATCH, SEQ = 2, 4  # 8 tokens: tokens * HIDDEN = 48 divisible by 1..4
ROW_OUT, COL_IN = 5, 7
TRAIN_STEPS, LR = 3, 0.1


# -- deterministic inputs, built identically in the ranks and here ----------------------
def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def linear(i: int, o: int, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(i, o)


def mlp() -> tuple[nn.Linear, nn.Linear]:
    return linear(HIDDEN, FFN, 10), linear(FFN, HIDDEN, 11)


def shard(t: torch.Tensor, dim: int, rank: int, n: int) -> torch.Tensor:
    return torch.chunk(t, n, dim=dim)[rank]


def calls(before: dict, after: dict) -> dict[str, int]:
    """Collective calls made between two ``stats.as_dict()`` snapshots."""
    a, b = before["per_collective"], after["per_collective"]
    out = {k: v["calls"] - a.get(k, {"calls": 0})["calls"] for k, v in b.items()}
    return {k: c for k, c in out.items() if c}


# -- what every rank runs --------------------------------------------------------------
def run_layer(layer: nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict:
    x = x.clone().requires_grad_(True)
    out = layer(x)
    (out * g).sum().backward()
    grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
    return {"out": out.detach(), "x_grad": x.grad.clone(), "grads": grads}


def rank_checks(ctx) -> dict:
    n, r = ctx.world_size, ctx.rank
    res: dict = {}
    x_col = randn(BATCH, SEQ, COL_IN, seed=1)
    g_col = randn(BATCH, SEQ, FFN, seed=2)
    col = ColumnParallelLinear.from_linear(ctx, linear(COL_IN, FFN, 3), gather_output=False)
    res["col_split"] = run_layer(col, x_col, shard(g_col, -1, r, n))
    col = ColumnParallelLinear.from_linear(ctx, linear(COL_IN, FFN, 3), gather_output=True)
    res["col_gather"] = run_layer(col, x_col, g_col)

    x_row = randn(BATCH, SEQ, FFN, seed=4)
    g_row = randn(BATCH, SEQ, ROW_OUT, seed=5)
    row = RowParallelLinear.from_linear(ctx, linear(FFN, ROW_OUT, 6), input_is_parallel=True)
    res["row_parallel_in"] = run_layer(row, shard(x_row, -1, r, n), g_row)
    row = RowParallelLinear.from_linear(ctx, linear(FFN, ROW_OUT, 6), input_is_parallel=False)
    res["row_full_in"] = run_layer(row, x_row, g_row)

    block = TensorParallelMLP.from_mlp(ctx, *mlp())
    x = randn(BATCH, SEQ, HIDDEN, seed=7).requires_grad_(True)
    s0 = copy.deepcopy(ctx.stats.as_dict())
    out = block(x)
    s1 = copy.deepcopy(ctx.stats.as_dict())
    (out * randn(BATCH, SEQ, HIDDEN, seed=8)).sum().backward()
    s2 = copy.deepcopy(ctx.stats.as_dict())
    res["mlp"] = {
        "out": out.detach(), "x_grad": x.grad.clone(),
        "grads": {k: p.grad.clone() for k, p in block.named_parameters()},
        "fwd_calls": calls(s0, s1), "bwd_calls": calls(s1, s2),
        "bytes_sent": s2["bytes_sent"] - s0["bytes_sent"],
    }  # fmt: skip

    block = TensorParallelMLP.from_mlp(ctx, *mlp())
    opt = torch.optim.SGD(block.parameters(), lr=LR)
    xt, yt = randn(8, HIDDEN, seed=9), randn(8, HIDDEN, seed=10)
    losses = []
    for _ in range(TRAIN_STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(block(xt), yt)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    res["train"] = {
        "losses": losses,
        "params": {k: p.detach() for k, p in block.named_parameters()},
    }

    seeded = TensorParallelMLP(ctx, HIDDEN, FFN, seed=5)
    res["seeded"] = {k: p.detach() for k, p in seeded.named_parameters()}
    res["gathered"] = {k: p.detach() for k, p in seeded.to_mlp().named_parameters()}

    part = (randn(2, 3, seed=20) + r).requires_grad_(True)
    full = gather_from_tensor_parallel(part, ctx, dim=0)
    (full * torch.arange(full.numel(), dtype=torch.float32).view_as(full)).sum().backward()
    whole = randn(2 * n, 3, seed=21).requires_grad_(True)
    mine = scatter_to_tensor_parallel(whole, ctx, dim=0)
    (mine * (r + 1)).sum().backward()
    res["ops"] = {"gathered": full.detach(), "part_grad": part.grad, "scattered": mine.detach(),
                  "whole_grad": whole.grad}  # fmt: skip
    try:
        ColumnParallelLinear(ctx, 4, 4 * n + 1)
        res["error"] = None
    except ValueError as exc:
        res["error"] = str(exc)
    return res


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda n: f"n{n}")
def ranks(request) -> tuple[int, list[dict]]:
    n = request.param
    return n, ddtk.launch(rank_checks, world_size=n, timeout=180, echo=False)


# -- single-process references ----------------------------------------------------------
def reference(layer: nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict:
    x = x.clone().requires_grad_(True)
    out = layer(x)
    (out * g).sum().backward()
    return {
        "out": out.detach(),
        "x_grad": x.grad,
        "grads": {k: p.grad for k, p in layer.named_parameters()},
    }


def check(got: dict, want: dict) -> None:
    torch.testing.assert_close(got["out"], want["out"])
    torch.testing.assert_close(got["x_grad"], want["x_grad"])
    assert got["grads"].keys() == want["grads"].keys()
    for k in want["grads"]:
        torch.testing.assert_close(
            got["grads"][k], want["grads"][k], msg=lambda m, k=k: f"{k}: {m}"
        )


# -- tests ------------------------------------------------------------------------------
@pytest.mark.distributed
def test_column_parallel_matches_linear(ranks) -> None:
    n, results = ranks
    x, g = randn(BATCH, SEQ, COL_IN, seed=1), randn(BATCH, SEQ, FFN, seed=2)
    ref = reference(linear(COL_IN, FFN, 3), x, g)
    for r, res in enumerate(results):
        rows = {k: shard(v, 0, r, n) for k, v in ref["grads"].items()}  # weight rows, bias entries
        check(res["col_gather"], {**ref, "grads": rows})
        check(
            res["col_split"],
            {"out": shard(ref["out"], -1, r, n), "x_grad": ref["x_grad"], "grads": rows},
        )


@pytest.mark.distributed
def test_row_parallel_matches_linear(ranks) -> None:
    n, results = ranks
    x, g = randn(BATCH, SEQ, FFN, seed=4), randn(BATCH, SEQ, ROW_OUT, seed=5)
    ref = reference(linear(FFN, ROW_OUT, 6), x, g)
    for r, res in enumerate(results):
        grads = {"weight": shard(ref["grads"]["weight"], 1, r, n), "bias": ref["grads"]["bias"]}
        check(res["row_full_in"], {**ref, "grads": grads})
        check(
            res["row_parallel_in"],
            {**ref, "x_grad": shard(ref["x_grad"], -1, r, n), "grads": grads},
        )


def mlp_shards(params: dict, r: int, n: int) -> dict:
    """Each rank's shard of a full ``Sequential(fc1, act, fc2)`` parameter dict, by TP layer name."""
    return {
        "fc1.weight": shard(params["0.weight"], 0, r, n), "fc1.bias": shard(params["0.bias"], 0, r, n),
        "fc2.weight": shard(params["2.weight"], 1, r, n), "fc2.bias": params["2.bias"],
    }  # fmt: skip


@pytest.mark.distributed
def test_mlp_block_matches_single_process_mlp(ranks) -> None:
    n, results = ranks
    dense = nn.Sequential(mlp()[0], nn.GELU(), mlp()[1])
    ref = reference(dense, randn(BATCH, SEQ, HIDDEN, seed=7), randn(BATCH, SEQ, HIDDEN, seed=8))
    for r, res in enumerate(results):
        check(res["mlp"], {**ref, "grads": mlp_shards(ref["grads"], r, n)})


@pytest.mark.distributed
def test_mlp_block_does_one_all_reduce_each_way_with_the_formula_bytes(ranks) -> None:
    n, results = ranks
    want_calls = {"all_reduce[ring]": 1} if n > 1 else {}
    by_hand = 2 * 2 * (n - 1) * BATCH * SEQ * HIDDEN * 4 // n  # two ring all-reduces of 8x6 float32
    assert tp_mlp_comm_bytes(BATCH * SEQ, HIDDEN, n, 4) == by_hand
    for res in results:
        assert res["mlp"]["fwd_calls"] == want_calls
        assert res["mlp"]["bwd_calls"] == want_calls
        assert res["mlp"]["bytes_sent"] == by_hand


@pytest.mark.distributed
def test_sgd_steps_match_single_process_mlp(ranks) -> None:
    n, results = ranks
    fc1, fc2 = mlp()
    dense = nn.Sequential(fc1, nn.GELU(), fc2)
    opt = torch.optim.SGD(dense.parameters(), lr=LR)
    xt, yt = randn(8, HIDDEN, seed=9), randn(8, HIDDEN, seed=10)
    losses = []
    for _ in range(TRAIN_STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(dense(xt), yt)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    full = {k: p.detach() for k, p in dense.named_parameters()}
    for r, res in enumerate(results):
        torch.testing.assert_close(res["train"]["losses"], losses)
        want = mlp_shards(full, r, n)
        for k, v in want.items():
            torch.testing.assert_close(res["train"]["params"][k], v, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.distributed
def test_seeded_init_shards_the_same_full_weights_on_every_rank(ranks) -> None:
    n, results = ranks
    torch.manual_seed(5)
    fc1 = nn.Linear(HIDDEN, FFN)
    torch.manual_seed(6)
    fc2 = nn.Linear(FFN, HIDDEN)
    full = {k: p.detach() for k, p in nn.Sequential(fc1, nn.GELU(), fc2).named_parameters()}
    for r, res in enumerate(results):
        for k, v in mlp_shards(full, r, n).items():
            torch.testing.assert_close(res["seeded"][k], v, rtol=0, atol=0)
        for k, v in full.items():
            torch.testing.assert_close(res["gathered"][k], v, rtol=0, atol=0)


@pytest.mark.distributed
def test_gather_and_scatter_along_dim0(ranks) -> None:
    n, results = ranks
    parts = [randn(2, 3, seed=20) + r for r in range(n)]
    coeff = torch.arange(2 * n * 3, dtype=torch.float32).view(2 * n, 3)
    whole = randn(2 * n, 3, seed=21)
    whole_grad = torch.cat([torch.full((2, 3), float(r + 1)) for r in range(n)])
    for r, res in enumerate(results):
        torch.testing.assert_close(res["ops"]["gathered"], torch.cat(parts), rtol=0, atol=0)
        torch.testing.assert_close(
            res["ops"]["part_grad"], coeff[2 * r : 2 * r + 2], rtol=0, atol=0
        )
        torch.testing.assert_close(
            res["ops"]["scattered"], whole[2 * r : 2 * r + 2], rtol=0, atol=0
        )
        torch.testing.assert_close(res["ops"]["whole_grad"], whole_grad, rtol=0, atol=0)


@pytest.mark.distributed
def test_non_divisible_split_raises_on_real_ranks(ranks) -> None:
    n, results = ranks
    for res in results:
        if n == 1:
            assert res["error"] is None
        else:
            assert f"out_features={4 * n + 1}" in res["error"] and "divisible" in res["error"]


# -- argument checks, no processes needed (they fail before any communication) -------------
def fake_ctx(n: int) -> SimpleNamespace:
    return SimpleNamespace(rank=0, world_size=n, device=torch.device("cpu"))


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda c: ColumnParallelLinear(c, 4, 10), "out_features=10"),
        (lambda c: RowParallelLinear(c, 10, 4), "in_features=10"),
        (lambda c: TensorParallelMLP(c, 5, 10), "ffn_hidden=10"),
        (lambda c: TensorParallelMLP(c, 5), "ffn_hidden=20"),
        (lambda c: ColumnParallelLinear.from_linear(c, nn.Linear(4, 10)), "out_features=10"),
        (lambda c: RowParallelLinear.from_linear(c, nn.Linear(10, 4)), "in_features=10"),
        (lambda c: ColumnParallelLinear(c, 0, 12), "in_features"),
        (lambda c: TensorParallelMLP.from_mlp(c, nn.Linear(4, 12), nn.Linear(8, 4)), "do not form"),
    ],
)
def test_bad_sizes_raise_value_error(build, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        build(fake_ctx(3))


def test_wrong_input_width_raises_before_communicating() -> None:
    col = ColumnParallelLinear(fake_ctx(2), 4, 8)
    with pytest.raises(ValueError, match="last dimension is 4"):
        col(torch.ones(2, 5))
    row = RowParallelLinear(fake_ctx(2), 8, 3, input_is_parallel=True)
    with pytest.raises(ValueError, match="last dimension is 4"):
        row(torch.ones(2, 8))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        col([1.0, 2.0, 3.0, 4.0])


def test_comm_bytes_formula_by_hand() -> None:
    assert tp_mlp_comm_bytes(256, 512, 2, 4) == 1 << 20  # 2 x (2 x 1/2) x 512 KiB
    assert tp_mlp_comm_bytes(256, 512, 4, 2) == 2 * 2 * 3 * 256 * 512 * 2 / 4
    assert tp_mlp_comm_bytes(8, 6, 1) == 0
    with pytest.raises(ValueError, match="positive"):
        tp_mlp_comm_bytes(0, 6, 2)


def test_dense_mlp_matches_seeded_layers() -> None:
    model = dense_mlp(4, seed=3)
    torch.manual_seed(3)
    fc1 = nn.Linear(4, 16)
    torch.manual_seed(4)
    fc2 = nn.Linear(16, 4)
    assert isinstance(model[1], nn.GELU)
    for got, want in zip(model.parameters(), [*fc1.parameters(), *fc2.parameters()], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the NCCL path)")
@pytest.mark.gpu
@pytest.mark.distributed
def test_mlp_block_on_gpu() -> None:
    n = min(2, torch.cuda.device_count())

    def work(ctx):
        block = TensorParallelMLP.from_mlp(ctx, *mlp())
        x = randn(BATCH, SEQ, HIDDEN, seed=7).to(ctx.device)
        return block(x).cpu(), block.fc1.weight.device.type

    dense = nn.Sequential(mlp()[0], nn.GELU(), mlp()[1])
    want = dense(randn(BATCH, SEQ, HIDDEN, seed=7)).detach()
    for out, dev in ddtk.launch(work, world_size=n, backend="nccl", timeout=180):
        assert dev == "cuda"
        torch.testing.assert_close(out, want)


# -- the benchmark --------------------------------------------------------------------------
def run_bench(argv: list[str]) -> int:
    import argparse

    from ddtk.bench import tp as bench

    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["tp", *argv])
    return args.func(args)


@pytest.mark.distributed
def test_bench_runs_on_a_tiny_configuration(tmp_path) -> None:
    out, png = tmp_path / "tp.json", tmp_path / "tp.png"
    argv = ["-n", "1,2", "--hidden", "8", "--tokens", "6", "--steps", "2", "--rounds", "2"]
    assert run_bench([*argv, "--json", str(out), "--plot", str(png)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["world_size"] for r in rows] == [1, 2]
    one, two = rows
    assert one["bytes_sent_per_step"] == 0 and one["param_ratio"] == 1.0
    assert two["bytes_sent_per_step"] == two["bytes_sent_min"] == 2 * 2 * 1 * 6 * 8 * 4 // 2
    assert two["bytes_ratio"] == 1.0
    dense = (8 * 32 + 32) + (32 * 8 + 8)  # parameters of 8 -> 32 -> 8
    assert two["dense_param_bytes"] == 4 * dense
    assert two["param_bytes_per_rank"] == 4 * ((8 * 16 + 16) + (16 * 8 + 8))
    assert two["max_abs_err"] < 1e-5 and two["tp_step_ms"] > 0 and two["dense_step_ms"] > 0
    assert png.stat().st_size > 0


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["-n", "0"], "positive"),
        (["-n", "a,b"], "integers"),
        (["--hidden", "0"], "positive"),
        (["-n", "3"], "divisible"),
        (["--ffn-hidden", "10", "-n", "4"], "divisible"),
    ],
)
def test_bench_rejects_bad_arguments(argv: list[str], problem: str, capsys) -> None:
    assert run_bench(argv) == 2
    out = capsys.readouterr().out
    assert "ddtk bench tp:" in out and problem in out
