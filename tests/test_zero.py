"""ZeRO stages 0-2 and the FSDP2 peer against a single-process reference.

The reference trains the same model with the plain torch optimizer on the
concatenation of every rank's batch (mean loss), which is what averaging the
ranks' gradients computes. The model has 1210 parameters, not a multiple of 3,
so 3 ranks exercise the padding of the flat buffer.
"""

from __future__ import annotations

import argparse
import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import ddtk
from ddtk.models import build_model
from ddtk.parallel.fsdp import fsdp_supported, run_fsdp_peer
from ddtk.parallel.zero import ZeroOptimizer, zero_memory_per_param

pytestmark = pytest.mark.distributed

HIDDEN = (16,)  # 64*16 + 16 + 16*10 + 10 = 1210 parameters
NUMEL = 1210
STEPS = 3
BATCH = 4  # samples per rank per step
OPTIMIZERS = {
    "adam": (torch.optim.Adam, {"lr": 0.01}),
    "sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
}
# (stage, optimizer, frozen parameter name or None)
CONFIGS = [(0, "adam", None), (1, "adam", None), (2, "adam", None),
           (1, "sgd", None), (2, "sgd", None), (2, "adam", "1.bias")]  # fmt: skip
ADAM_STEP_BYTES = 4  # Adam keeps a float32 step counter per parameter tensor


def _model(frozen: str | None = None) -> nn.Module:
    model = build_model("mlp", hidden_dims=HIDDEN, seed=0)
    if frozen:
        dict(model.named_parameters())[frozen].requires_grad_(False)
    return model


def _global_batch(world: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH * world, 1, 8, 8, generator=g), torch.randint(
        0, 10, (BATCH * world,), generator=g
    )


def _local_batches(world: int, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for step in range(STEPS):
        x, y = _global_batch(world, step)
        out.append((x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]))
    return out


def _reference(world: int, opt_name: str, frozen: str | None = None) -> list[torch.Tensor]:
    """Single process, plain torch optimizer, the whole global batch each step."""
    model = _model(frozen)
    cls, kwargs = OPTIMIZERS[opt_name]
    opt = cls(model.parameters(), **kwargs)
    for step in range(STEPS):
        x, y = _global_batch(world, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _train_zero(ctx, stage: int, opt_name: str, frozen: str | None) -> dict:
    model = _model(frozen)
    cls, kwargs = OPTIMIZERS[opt_name]
    opt = ZeroOptimizer(ctx, model, cls, stage=stage, **kwargs)
    for x, y in _local_batches(ctx.world_size, ctx.rank):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "numel": opt.numel, "padded": opt.padded_numel, "shard": opt.shard_range,
        "state_bytes": opt.state_bytes(), "gradient_bytes": opt.gradient_bytes(),
        "parameter_bytes": opt.parameter_bytes(),
        "model_grads": [p.grad is not None for p in model.parameters() if p.requires_grad],
    }  # fmt: skip


def _zero_matrix(ctx) -> dict:
    return {cfg: _train_zero(ctx, *cfg) for cfg in CONFIGS}


@pytest.mark.parametrize("world", [1, 2, 3])
def test_zero_matches_single_process_training_and_the_memory_formula(world: int) -> None:
    results = ddtk.launch(_zero_matrix, world, timeout=120, echo=False)
    padded = math.ceil(NUMEL / world) * world
    for (stage, opt_name, frozen), per_rank in (
        (cfg, [r[cfg] for r in results]) for cfg in CONFIGS
    ):
        want = _reference(world, opt_name, frozen)
        numel = NUMEL - (16 if frozen else 0)
        pad = math.ceil(numel / world) * world
        shard = pad // world if stage else pad
        for rank, got in enumerate(per_rank):
            for g, w in zip(got["params"], want, strict=True):
                torch.testing.assert_close(g, w)
            assert (got["numel"], got["padded"]) == (numel, pad)
            lo = rank * shard if stage else 0
            assert got["shard"] == (lo, lo + shard)
            # memory: measured against the paper's fp32 bytes/param, exact up to padding
            k = 8.0 if opt_name == "adam" else 4.0  # Adam: exp_avg + exp_avg_sq; SGD: momentum
            per_param = zero_memory_per_param(
                stage, world, mixed_precision=False, optimizer_state=k
            )
            extra = ADAM_STEP_BYTES if opt_name == "adam" else 0
            assert got["state_bytes"] - extra == pytest.approx(per_param["optimizer_state"] * pad)
            assert got["gradient_bytes"] == pytest.approx(per_param["gradients"] * pad)
            assert got["parameter_bytes"] == pytest.approx(per_param["parameters"] * pad)
            # stage 2 frees the full gradients; stages 0 and 1 leave the average in param.grad
            assert got["model_grads"] == [stage < 2] * len(got["model_grads"])
        if stage == 1 and opt_name == "adam":  # against unsharded: the full state on every rank
            dp = [r[(0, "adam", None)]["state_bytes"] for r in results]
            assert dp == [8 * padded + ADAM_STEP_BYTES] * world
            assert [r["state_bytes"] for r in per_rank] == [
                8 * padded // world + ADAM_STEP_BYTES
            ] * world
    if world == 3:
        assert padded == 1212  # the padding case is really exercised


def test_stage_2_shards_gradients_and_stage_1_does_not_with_padding() -> None:
    """The per-rank bytes at 3 ranks, written out: 1210 parameters padded to 1212, shards of 404."""
    assert zero_memory_per_param(1, 3, mixed_precision=False)[
        "optimizer_state"
    ] * 1212 == pytest.approx(8 * 404)
    assert zero_memory_per_param(2, 3, mixed_precision=False)["gradients"] * 1212 == pytest.approx(
        4 * 404
    )


def test_memory_formula_reproduces_the_paper() -> None:
    """ZeRO paper, Figure 1: 7.5B parameters on 64 GPUs, mixed-precision Adam (K = 12)."""
    psi, n = 7.5e9, 64
    gb = [zero_memory_per_param(s, n)["total"] * psi / 1e9 for s in (0, 1, 2, 3)]
    assert gb == pytest.approx([120.0, 31.40625, 16.640625, 1.875])
    assert zero_memory_per_param(1, 4) == {
        "parameters": 2.0,
        "gradients": 2.0,
        "optimizer_state": 3.0,
        "total": 7.0,
    }
    assert zero_memory_per_param(0, 2, mixed_precision=False)["total"] == 16.0
    assert zero_memory_per_param(3, 4, mixed_precision=False)["total"] == 4.0
    with pytest.raises(ValueError, match="stage"):
        zero_memory_per_param(4, 2)
    with pytest.raises(ValueError, match="world_size"):
        zero_memory_per_param(1, 0)


def test_bad_arguments_are_refused_before_any_communication() -> None:
    ctx = SimpleNamespace(rank=0, world_size=2)  # no collective is reached: a fake is enough
    model = nn.Linear(3, 2)
    for stage in (3, -1, True, "1"):
        with pytest.raises(ValueError, match="stage"):
            ZeroOptimizer(ctx, model, torch.optim.Adam, stage=stage)
    with pytest.raises(TypeError, match="optimizer_cls"):
        ZeroOptimizer(ctx, model, "adam")
    frozen = nn.Linear(3, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="requires grad"):
        ZeroOptimizer(ctx, frozen, torch.optim.SGD, lr=0.1)
    with pytest.raises(TypeError, match="dtype"):
        ZeroOptimizer(
            ctx, [nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2, dtype=torch.float64))]
        )
    with pytest.raises(TypeError, match="single tensor"):
        ZeroOptimizer(ctx, nn.Parameter(torch.ones(2)))


def _fsdp_and_zero(ctx) -> dict:
    batches = _local_batches(ctx.world_size, ctx.rank)
    run = run_fsdp_peer(ctx, _model(), batches, torch.optim.Adam, lr=0.01)
    zero = _train_zero(ctx, 2, "adam", None)
    return {"fsdp": run, "zero": zero}


@pytest.mark.skipif(not fsdp_supported("cpu")[0], reason=fsdp_supported("cpu")[1])
def test_fsdp2_peer_matches_zero_and_holds_a_third_of_the_parameters() -> None:
    world = 3
    results = ddtk.launch(_fsdp_and_zero, world, timeout=120, echo=False)
    want = torch.cat([p.reshape(-1) for p in _reference(world, "adam")])
    for r in results:
        zero = torch.cat([p.reshape(-1) for p in r["zero"]["params"]])
        torch.testing.assert_close(r["fsdp"].parameters, want)
        torch.testing.assert_close(r["fsdp"].parameters, zero)
    fsdp = [r["fsdp"] for r in results]
    # FSDP2 shards each of the 4 tensors along dim 0 (no padding): the shards add up to the model
    assert sum(f.parameter_bytes for f in fsdp) == 4 * NUMEL
    assert sum(f.gradient_bytes for f in fsdp) == 4 * NUMEL
    assert sum(f.state_bytes for f in fsdp) == 8 * NUMEL + world * 4 * ADAM_STEP_BYTES
    zero_state = [r["zero"]["state_bytes"] for r in results]
    assert sum(zero_state) == 8 * 1212 + world * ADAM_STEP_BYTES
    assert all(
        r["zero"]["parameter_bytes"] == 4 * 1212 for r in results
    )  # ZeRO-2 keeps full params
    assert max(f.parameter_bytes for f in fsdp) < 4 * NUMEL / 2  # stage 3 does not


def _gpu_peer(ctx) -> dict:
    batches = _local_batches(ctx.world_size, ctx.rank)
    run = run_fsdp_peer(ctx, _model(), batches, torch.optim.Adam, lr=0.01)
    return {"parameters": run.parameters, "state_bytes": run.state_bytes}


@pytest.mark.gpu
def test_fsdp2_peer_on_cuda_matches_the_reference() -> None:
    ok, reason = fsdp_supported("cuda")
    if not ok:
        pytest.skip(reason)
    world = min(2, torch.cuda.device_count())
    results = ddtk.launch(_gpu_peer, world, backend="nccl", timeout=300, echo=False)
    want = torch.cat([p.reshape(-1) for p in _reference(world, "adam")])
    for r in results:
        torch.testing.assert_close(r["parameters"], want, atol=1e-4, rtol=1e-4)


def _bench(args: list[str]) -> int:
    from ddtk.bench import zero as bench

    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    parsed = parser.parse_args(["zero", *args])
    return parsed.func(parsed)


def test_bench_runs_on_a_tiny_configuration(tmp_path) -> None:
    contenders = "dp,zero-1,zero-2" + (",fsdp2" if fsdp_supported("cpu")[0] else "")
    out = tmp_path / "z.json"
    assert _bench(["-n", "2", "--steps", "2", "--batch", "8", "--contenders", contenders,
                   "--json", str(out), "--plot", str(tmp_path / "z.png")]) == 0  # fmt: skip
    rows = {r["contender"]: r for r in json.loads(out.read_text())["rows"]}
    p = 6570  # the digits MLP, even: no padding at 2 ranks
    assert rows["dp"]["state_bytes"] == 8 * p + ADAM_STEP_BYTES
    assert rows["zero-1"]["state_bytes"] == 8 * p // 2 + ADAM_STEP_BYTES
    assert (
        rows["zero-1"]["gradient_bytes"] == 4 * p and rows["zero-2"]["gradient_bytes"] == 4 * p // 2
    )
    # ring all-reduce sends 2(n-1)/n of the model, plus an all-gather (n-1)/n for zero-1
    assert rows["dp"]["bytes_sent_per_step"] == 4 * p
    assert rows["zero-1"]["bytes_sent_per_step"] == 6 * p
    assert rows["zero-2"]["bytes_sent_per_step"] == 4 * p
    assert all(r["step_ms"] > 0 for r in rows.values())
    assert (tmp_path / "z.png").stat().st_size > 0


def test_bench_refuses_bad_arguments(capsys) -> None:
    assert _bench(["-n", "5"]) == 2
    assert _bench(["--contenders", "zero-3"]) == 2
    assert _bench(["--steps", "0"]) == 2
    assert "ddtk bench zero:" in capsys.readouterr().out
