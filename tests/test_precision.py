"""Mixed precision: DynamicLossScaler against torch.amp.GradScaler, autocast training, numerics."""

from __future__ import annotations

import argparse
import functools
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

import ddtk
from ddtk.precision import (
    DynamicLossScaler,
    amp_train_step,
    autocast_context,
    evaluate_accuracy,
    recommended_dtype,
)
from ddtk.precision import numerics as nm

STEPS = 30
INF_STEPS = {2: "inf", 3: "nan", 4: "inf", 11: "-inf", 12: "nan", 20: "inf", 27: "nan"}


# ---- DynamicLossScaler against GradScaler ------------------------------------------------------


def _problem(seed: int = 0) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A small MLP and STEPS batches of digits-like random data."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 4))
    g = torch.Generator().manual_seed(seed + 1)
    data = [
        (torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g))
        for _ in range(STEPS)
    ]
    return model, data


def _train(scaler, model, data, inf_steps, explicit_unscale=False, dtype=None):
    """Train with a scaler, corrupting one gradient at the chosen steps.

    Returns the scale before each update, the steps where optimizer.step really ran, and the weights.
    """
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ran: list[int] = []
    real_step = opt.step

    def counting_step(*a, **k):
        ran.append(i)
        return real_step(*a, **k)

    opt.step = counting_step
    scales = []
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        ctx = autocast_context("cpu", dtype) if dtype else torch.autocast("cpu", enabled=False)
        with ctx:
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        if i in inf_steps:
            model[0].weight.grad[1, 2] = float(inf_steps[i])
        if explicit_unscale:
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scales.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
    return scales, ran, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("init_scale", "growth", "backoff", "explicit_unscale", "dtype"),
    [
        (2.0**10, 2.0, 0.5, False, None),
        (2.0**10, 2.0, 0.5, True, None),
        (1000.0, 3.0, 0.3, False, None),  # factors that are not powers of 2: float32 rounding
        (2.0**16, 2.0, 0.5, True, torch.bfloat16),
        (2.0**127, 2.0, 0.5, False, None),  # growth would overflow float32: the scale must stay
    ],
)
def test_scaler_matches_gradscaler(init_scale, growth, backoff, explicit_unscale, dtype) -> None:
    kw = dict(
        init_scale=init_scale, growth_factor=growth, backoff_factor=backoff, growth_interval=3
    )
    ref_model, data = _problem()
    ref = torch.amp.GradScaler("cpu", **kw)
    want_scales, want_ran, want_params = _train(
        ref, ref_model, data, INF_STEPS, explicit_unscale, dtype
    )
    ours = DynamicLossScaler(**kw)
    model, _ = _problem()
    scales, ran, params = _train(ours, model, data, INF_STEPS, explicit_unscale, dtype)

    assert scales == want_scales
    assert ours.scale_history == want_scales
    assert ran == want_ran == [i for i in range(STEPS) if i not in INF_STEPS]
    assert ours.skipped_steps == sorted(INF_STEPS)
    assert ours.get_scale() == ref.get_scale()
    assert ours.state_dict() == ref.state_dict()
    for p, q in zip(params, want_params, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
        assert torch.isfinite(p).all()


def test_scaler_trajectory_by_hand() -> None:
    """The update rule on a short pattern, computed by hand: growth_interval=2, backoff 0.5, growth 2."""
    model, data = _problem()
    scaler = DynamicLossScaler(init_scale=64.0, growth_interval=2)
    _train(scaler, model, data[:7], {1: "inf", 5: "nan"})
    # good, bad(->32), good, good(->64), good, bad(->32, counter reset), good
    assert scaler.scale_history == [64.0, 64.0, 32.0, 32.0, 64.0, 64.0, 32.0]
    assert scaler.skipped_steps == [1, 5]
    assert scaler.get_scale() == 32.0 and scaler.state_dict()["_growth_tracker"] == 1


def test_state_dict_round_trips_with_gradscaler() -> None:
    kw = dict(init_scale=2.0**8, growth_interval=3)
    model, data = _problem()
    first = DynamicLossScaler(**kw)
    _train(first, model, data[:5], {1: "inf"})
    ref = torch.amp.GradScaler("cpu", **kw)
    ref.load_state_dict(first.state_dict())
    again = DynamicLossScaler()
    again.load_state_dict(ref.state_dict())
    assert again.state_dict() == first.state_dict() == ref.state_dict()
    m1, m2 = _problem()[0], _problem()[0]
    s1, r1, _ = _train(again, m1, data[5:15], {8: "nan"})
    s2, r2, _ = _train(ref, m2, data[5:15], {8: "nan"})
    assert (s1, r1) == (s2, r2)


def test_scaler_rejects_bad_use() -> None:
    with pytest.raises(ValueError, match="growth_factor"):
        DynamicLossScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        DynamicLossScaler(backoff_factor=1.5)
    with pytest.raises(ValueError, match="growth_interval"):
        DynamicLossScaler(growth_interval=0)
    with pytest.raises(ValueError, match="init_scale"):
        DynamicLossScaler(init_scale=-1.0)
    w = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = DynamicLossScaler()
    with pytest.raises(RuntimeError, match="without a step"):
        scaler.update()
    scaler.scale(w.sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already"):
        scaler.step(opt)
    half = nn.Parameter(torch.ones(2, dtype=torch.float16))
    half.grad = torch.ones(2, dtype=torch.float16)
    with pytest.raises(ValueError, match="float16 gradients"):
        DynamicLossScaler().unscale_(torch.optim.SGD([half], lr=0.1))


def test_disabled_scaler_is_a_pass_through() -> None:
    model, data = _problem()
    scaler = DynamicLossScaler(enabled=False)
    scales, ran, _ = _train(scaler, model, data[:4], {})
    assert scales == [1.0] * 4 and ran == [0, 1, 2, 3] and scaler.state_dict() == {}


# ---- distributed: every rank skips when any rank overflows ------------------------------------

# Steps at which each rank (by rank id) corrupts its own local gradients.
RANK_INF = {0: {3: "inf"}, 1: {7: "nan", 8: "inf"}, 2: {15: "inf"}}


def _rank_scaler_run(ctx, sync: bool):
    """Each rank trains its own replica on its own data, with overflows at its own steps only."""
    model, data = _problem(seed=ctx.rank)
    scaler = DynamicLossScaler(init_scale=2.0**10, growth_interval=3, ctx=ctx if sync else None)
    scales, ran, params = _train(scaler, model, data[:20], RANK_INF.get(ctx.rank, {}))
    # Reference: GradScaler on this rank's problem with the overflows of every rank.
    union = {s: v for r in range(ctx.world_size) for s, v in RANK_INF[r].items()}
    ref_model, _ = _problem(seed=ctx.rank)
    ref = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    want = _train(ref, ref_model, data[:20], union)
    return scales, ran, params, want, scaler.skipped_steps


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3])
def test_overflow_on_one_rank_skips_every_rank(world_size: int) -> None:
    results = ddtk.launch(_rank_scaler_run, world_size, args=(True,), timeout=120, echo=False)
    union = sorted({s for r in range(world_size) for s in RANK_INF[r]})
    for scales, ran, params, (want_scales, want_ran, want_params), skipped in results:
        assert skipped == union
        assert scales == want_scales == results[0][0]
        assert ran == want_ran == [i for i in range(20) if i not in union]
        for p, q in zip(params, want_params, strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.distributed
def test_without_sync_ranks_diverge() -> None:
    """The control: without ctx each rank skips only its own overflows, and the scales differ."""
    results = ddtk.launch(_rank_scaler_run, 2, args=(False,), timeout=120, echo=False)
    assert results[0][4] == [3] and results[1][4] == [7, 8]
    assert results[0][0] != results[1][0]


# ---- autocast training --------------------------------------------------------------------------


def _digits_run(dtype, epochs: int = 4, scaler=None) -> tuple[list[float], float]:
    from ddtk.data import load_dataset, train_test_split
    from ddtk.models import build_model

    train, test = train_test_split(load_dataset("digits"), seed=0)
    model = build_model("mlp", train.input_shape, train.num_classes, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for epoch in range(epochs):
        perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(epoch))
        for i in range(0, len(perm), 64):
            idx = perm[i : i + 64]
            losses.append(amp_train_step(model, opt, train.x[idx], train.y[idx],
                                         nn.functional.cross_entropy, dtype, scaler))  # fmt: skip
    assert model[1].weight.dtype == torch.float32  # master weights stay float32
    return losses, evaluate_accuracy(model, test.x, test.y)


@functools.cache
def _digits_fp32() -> tuple[list[float], float]:
    """The float32 reference run, shared by the bf16 and fp16 tests."""
    return _digits_run(torch.float32)


def test_bf16_autocast_training_matches_fp32_accuracy() -> None:
    fp32_losses, fp32_acc = _digits_fp32()
    bf16_losses, bf16_acc = _digits_run(torch.bfloat16)
    assert all(math.isfinite(v) for v in bf16_losses + fp32_losses)
    assert fp32_acc > 0.85  # the fp32 run itself learned
    assert abs(bf16_acc - fp32_acc) <= 0.03
    assert bf16_losses[-1] < bf16_losses[0] / 3
    assert bf16_losses != fp32_losses  # the bf16 path really ran in lower precision


def test_fp16_on_cpu_trains_with_a_scaler_and_refuses_without() -> None:
    scaler = DynamicLossScaler()
    losses, acc = _digits_run(torch.float16, scaler=scaler)
    fp32_losses, fp32_acc = _digits_fp32()
    assert scaler.steps == len(losses) == len(fp32_losses)
    # skipped steps (while the scale calibrates) still report a finite forward loss
    assert all(math.isfinite(v) for v in losses)
    assert abs(acc - fp32_acc) <= 0.03
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="loss scaler"):
        amp_train_step(model, opt, torch.randn(2, 4), torch.tensor([0, 1]),
                       nn.functional.cross_entropy, torch.float16)  # fmt: skip


def test_autocast_context_checks_its_arguments() -> None:
    assert recommended_dtype("cpu") == torch.bfloat16
    with autocast_context("cpu", "fp16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    with pytest.raises(ValueError, match=r"not torch\.float64"):
        autocast_context("cpu", torch.float64)
    with pytest.raises(ValueError, match="unknown dtype"):
        autocast_context("cpu", "int8")
    with pytest.raises(ValueError, match="cpu and cuda"):
        autocast_context("meta", "bf16")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            autocast_context("cuda", "fp16")


@pytest.mark.gpu
def test_fp16_with_scaler_on_cuda_matches_gradscaler() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: fp16 autocast with GradScaler is compared on CUDA")
    kw = dict(init_scale=2.0**16, growth_interval=3)

    def run(scaler):
        model, data = _problem()
        model = model.cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = [amp_train_step(model, opt, x.cuda(), y.cuda(), nn.functional.cross_entropy,
                                 torch.float16, scaler) for x, y in data]  # fmt: skip
        return losses, [p.detach().cpu() for p in model.parameters()], scaler.get_scale()

    ours, ref = run(DynamicLossScaler(**kw)), run(torch.amp.GradScaler("cuda", **kw))
    assert ours[0] == ref[0] and ours[2] == ref[2]
    for p, q in zip(ours[1], ref[1], strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


# ---- numerics -----------------------------------------------------------------------------------


def test_format_table_matches_finfo_facts() -> None:
    rows = {r["dtype"]: r for r in nm.format_table()}
    assert rows["fp16"]["smallest_subnormal"] == 2.0**-24
    assert rows["fp32"]["smallest_subnormal"] == 2.0**-149
    assert rows["bf16"]["smallest_subnormal"] == 2.0**-133
    assert rows["fp16"]["max"] == 65504.0
    assert rows["bf16"]["exponent_bits"] == rows["fp32"]["exponent_bits"] == 8
    assert rows["bf16"]["smallest_normal"] == rows["fp32"]["smallest_normal"] == 2.0**-126
    assert (rows["fp16"]["mantissa_bits"], rows["bf16"]["mantissa_bits"]) == (10, 7)


def test_values_below_fp16_smallest_subnormal_flush_to_zero() -> None:
    tiny = 2.0**-24
    v = torch.tensor([tiny * 0.49, tiny * 0.5, tiny * 0.51, tiny, 1e-3, 2.0**-140])
    # round to nearest even: half the smallest subnormal rounds down to 0, just above rounds up
    assert v.half().tolist()[:4] == [0.0, 0.0, tiny, tiny]
    assert nm.underflow_fraction(v, "fp16") == pytest.approx(3 / 6)  # 0.49, 0.5 and 2**-140
    assert nm.underflow_fraction(v, "bf16") == pytest.approx(1 / 6)  # only 2**-140 < 2**-134
    assert nm.underflow_fraction(v, "fp32") == 0.0


def test_underflow_and_loss_scale_sweep_match_numpy_float16() -> None:
    g = nm.log_uniform_gradients(20_000, seed=1)
    a = g.double().numpy()
    table = {r["dtype"]: r["underflow_fraction"] for r in nm.underflow_table(g)}
    assert table["fp16"] == pytest.approx(float(np.mean(a.astype(np.float16) == 0)), abs=0)
    assert 0.2 < table["fp16"] < 0.35  # values below about 3e-8 of a 1e-10..1e-1 log spread
    assert table["bf16"] == table["fp32"] == 0.0  # bf16 has fp32's range
    for r in nm.loss_scale_sweep(g, range(0, 33, 4)):
        with np.errstate(over="ignore"):
            cast = (a * 2.0 ** r["k"]).astype(np.float16)
        assert r["underflow_fraction"] == pytest.approx(float(np.mean(cast == 0)), abs=0)
        assert r["overflow_fraction"] == pytest.approx(float(np.mean(np.isinf(cast))), abs=0)
    k = nm.first_overflow_exponent(g)
    peak = float(np.abs(a).max())
    limit = 65504.0 + 16.0  # fp16 rounds to inf from max + half an ulp (ulp at max = 32)
    assert peak * 2.0 ** (k - 1) < limit <= peak * 2.0**k


def test_bf16_rounding_and_accumulation() -> None:
    one = nm.one_plus(1e-3)
    assert one["bf16"] == 1.0  # 1e-3 < eps/2 = 2**-8
    assert one["fp16"] == 1.0 + 2.0**-10
    assert one["fp32"] == pytest.approx(1.001, abs=2.0**-23)
    rows = {(r["addend"], r["accumulator"]): r for r in nm.accumulation_error(10_000, 1e-3)}
    for name in ("bf16", "fp16"):
        # a running sum stalls at the first power of two p whose half-ulp eps*p/2 exceeds the addend
        addend = float(torch.tensor(1e-3, dtype=nm.DTYPES[name]))
        stall = 2.0 ** math.ceil(math.log2(2 * addend / torch.finfo(nm.DTYPES[name]).eps))
        assert rows[(name, name)]["sum"] == stall
    assert rows[("bf16", "fp32")]["relative_error"] < 1e-6
    assert rows[("fp32", "fp32")]["relative_error"] < 1e-4


def test_real_gradients_underflow_only_in_fp16_when_scaled_down() -> None:
    g = nm.digits_gradients()
    assert g.numel() == (64 * 64 + 64) + (64 * 32 + 32) + (32 * 10 + 10)  # the MLP's parameters
    small = g * 1e-4
    nz = small[small != 0].double().numpy()
    table = {r["dtype"]: r["underflow_fraction"] for r in nm.underflow_table(small)}
    assert table["fp16"] == pytest.approx(float(np.mean(nz.astype(np.float16) == 0)), abs=0)
    assert table["fp16"] > 0.05 and table["bf16"] == 0.0


# ---- the benchmark ------------------------------------------------------------------------------


def _bench(argv: list[str]) -> int:
    from ddtk.bench import precision as bench

    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["precision", *argv])
    return args.func(args)


def test_bench_runs_on_a_tiny_configuration(tmp_path) -> None:
    out = tmp_path / "p.json"
    argv = ["--steps", "4", "--warmup", "1", "--hidden", "64", "--batch", "32",
            "--json", str(out), "--plot", str(tmp_path / "p.png")]  # fmt: skip
    assert _bench(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["workload"], r["precision"]) for r in rows] == [
        ("digits", "fp32"), ("digits", "bf16"), ("synthetic", "fp32"), ("synthetic", "bf16")
    ]  # fmt: skip
    for r in rows:
        assert r["step_ms"] > 0 and len(r["step_ms_all"]) == 4
        assert 0.0 <= r["test_accuracy"] <= 1.0 and r["nonfinite_losses"] == 0
        assert r["param_bytes"] == 4 * r["parameters"] == r["grad_bytes"]
        assert r["peak_bytes"] == r["saved_bytes"] + 2 * r["param_bytes"]
    fp32, bf16 = rows[0], rows[1]
    assert fp32["time_vs_fp32"] == 1.0
    assert bf16["time_vs_fp32"] == pytest.approx(bf16["step_ms"] / fp32["step_ms"])
    # digits MLP: saved activations are float32 in one run and mostly bf16 in the other
    assert bf16["saved_bytes"] < fp32["saved_bytes"]
    assert (tmp_path / "p.png").stat().st_size > 0


def test_saved_bytes_count_what_autograd_keeps() -> None:
    """The fp32 memory probe on the digits MLP equals the activations computed by hand."""
    from ddtk.bench.precision import measure

    rows = measure(("digits",), ("fp32",), steps=1, batch=16, warmup=0)
    # The input (64 wide; the first Linear's weight is not saved: the input needs no gradient),
    # the ReLU outputs (64, 32; each is also the next Linear's input, counted once), the
    # log-softmax output (10), float32; the int64 targets; nll_loss's float32 total weight.
    want = 4 * 16 * (64 + 64 + 32 + 10) + 8 * 16 + 4
    assert rows[0]["saved_bytes"] == want


@pytest.mark.parametrize(
    "argv",
    [["--steps", "0"], ["--workloads", "imagenet"], ["--dtypes", "fp8"], ["--lr", "-1"]],
)
def test_bench_rejects_bad_arguments(argv, capsys) -> None:
    assert _bench(argv) == 2
    assert "ddtk bench precision:" in capsys.readouterr().out
