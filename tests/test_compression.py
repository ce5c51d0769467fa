"""Gradient compressors: round-trip properties, exact bytes, error feedback, and aggregate on real ranks.

Local tests check each compressor against formulas computed here by hand (top-k
by sorting, sign bits by ``numpy.packbits``, PowerSGD by SVD and QR...). The
distributed tests run ``aggregate`` on 1, 2 and 3 ranks and compare with the mean
of every rank's ``decompress(compress(x_r))`` computed in this process with the
same seeds (PowerSGD, whose ranks share P and Q, with its own formula).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ddtk
from ddtk.compression import (
    QSGD,
    Compressor,
    ErrorFeedback,
    Int8,
    NoCompression,
    Payload,
    PowerSGD,
    RandomK,
    SignSGD,
    TopK,
    get_compressor,
)
from ddtk.compression.sign import pack_bits, unpack_bits

ALL_SPECS = (
    "none",
    "topk:0.1",
    "randomk:0.2",
    "qsgd:4",
    "int8",
    "int8:minmax",
    "sign",
    "powersgd:2",
)


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# -- top-k -------------------------------------------------------------------------------
def test_topk_keeps_exactly_the_k_largest_magnitudes() -> None:
    x = randn(100, seed=1)
    out = TopK(k=7).decompress(TopK(k=7).compress(x))
    keep = sorted(range(100), key=lambda i: -abs(float(x[i])))[:7]
    want = torch.zeros(100)
    want[keep] = x[keep]
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_topk_ratio_shape_and_bytes() -> None:
    x = randn(3, 7, seed=2)  # 21 elements, ratio 0.1 -> ceil(2.1) = 3 kept
    c = TopK(ratio=0.1)
    p = c.compress(x)
    out = c.decompress(p)
    assert out.shape == (3, 7) and int((out != 0).sum()) == 3
    assert p.nbytes == 3 * 4 + 3 * 4  # float32 values + int32 indices
    assert c.compress(x.double()).nbytes == 3 * 8 + 3 * 4
    assert TopK(ratio=0.01).compress(randn(6570)).nbytes == 66 * 8  # ceil(65.7) = 66


def test_topk_with_k_larger_than_n_is_exact() -> None:
    x = randn(5, seed=3)
    c = TopK(k=50)
    p = c.compress(x)
    torch.testing.assert_close(c.decompress(p), x, rtol=0, atol=0)
    assert p.nbytes == 5 * 8


# -- random-k ----------------------------------------------------------------------------
def test_randomk_is_unbiased_when_scaled() -> None:
    """Mean over many draws approaches x; the unscaled (k/n x) or wrongly scaled estimate does not."""
    x = randn(20, seed=4).abs() + 0.5  # away from zero, so a relative tolerance is meaningful
    n, k, trials = 20, 5, 4000
    c = RandomK(k=k, seed=11)
    mean = torch.stack([c.decompress(c.compress(x)) for _ in range(trials)]).mean(0)
    # Each entry is x_i * n/k with probability k/n, else 0: variance x_i^2 (n/k - 1).
    sigma = x * math.sqrt((n / k - 1) / trials)
    assert bool(((mean - x).abs() < 5 * sigma).all()), (mean - x).abs().max()
    assert bool((5 * sigma < 0.2 * x).all())  # the test can tell a scaling error of 20 %


def test_randomk_indices_shared_across_ranks_and_bytes() -> None:
    x = randn(40, seed=5)
    a, b = RandomK(ratio=0.25, seed=3), RandomK(ratio=0.25, seed=3)
    b.rank = 2  # the indices must not depend on the rank
    pa, pb = a.compress(x), b.compress(x * 2)
    assert torch.equal(pa.shared["indices"], pb.shared["indices"])
    assert pa.nbytes == 10 * 4  # values only; indices come from the shared seed
    out = a.decompress(pa)
    idx = pa.shared["indices"]
    torch.testing.assert_close(out[idx], x[idx] * 4, rtol=0, atol=0)
    assert int((out != 0).sum()) == 10


# -- QSGD --------------------------------------------------------------------------------
def test_qsgd_values_on_the_level_grid() -> None:
    x = randn(200, seed=6)
    s = 8
    p = QSGD(s=s).compress(x)
    out = QSGD(s=s).decompress(p)
    norm = float(x.norm())
    j = out.double() * s / norm
    torch.testing.assert_close(j, j.round(), rtol=0, atol=1e-4)
    assert int(j.round().abs().max()) <= s
    assert bool((out.sign() * x.sign() >= 0).all())  # never flips a sign
    # Each entry rounds to one of the two grid points around it.
    assert bool(((out - x).abs() <= norm / s * (1 + 1e-5)).all())
    assert p.nbytes == 200 * 1 + 4  # int8 codes + float32 norm
    assert QSGD(s=200).compress(x).nbytes == 200 * 2 + 4  # int16 codes past 127 levels


def test_qsgd_is_unbiased() -> None:
    x = randn(10, seed=7)
    s, trials = 2, 4000
    c = QSGD(s=s, seed=5)
    mean = torch.stack([c.decompress(c.compress(x)) for _ in range(trials)]).mean(0)
    # Per entry the variance is at most (norm / s)^2 / 4.
    sigma = float(x.norm()) / s / 2 / math.sqrt(trials)
    assert float((mean - x).abs().max()) < 5 * sigma
    nearest = (x * s / x.norm()).round() * x.norm() / s  # deterministic rounding is biased ...
    assert float((nearest - x).abs().max()) > 10 * sigma  # ... by more than the test tolerates


def test_qsgd_draws_differ_per_rank_and_call() -> None:
    x = randn(200, seed=17)
    a, b = QSGD(s=2), QSGD(s=2)
    b.rank = 1
    codes = [a.compress(x).tensors["codes"], b.compress(x).tensors["codes"]]
    codes.append(a.compress(x).tensors["codes"])  # second call of the same bucket
    assert not torch.equal(codes[0], codes[1]) and not torch.equal(codes[0], codes[2])


# -- int8 --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["absmax", "minmax"])
def test_int8_error_at_most_half_a_step(mode: str) -> None:
    x = randn(1000, seed=8) * 3 + (1.0 if mode == "minmax" else 0.0)
    c = Int8(mode)
    p = c.compress(x)
    if mode == "absmax":
        scale = float(x.abs().max()) / 127
        assert p.nbytes == 1000 + 4
    else:
        scale = (float(x.max()) - float(x.min())) / 255
        assert p.nbytes == 1000 + 8
    assert c.scale_of(p) == pytest.approx(scale, rel=1e-6)
    err = (c.decompress(p) - x).abs().max()
    assert float(err) <= scale / 2 * (1 + 1e-4)


@pytest.mark.parametrize("mode", ["absmax", "minmax"])
def test_int8_zero_and_constant_tensors(mode: str) -> None:
    c = Int8(mode)
    for x in (torch.zeros(9), torch.full((9,), -2.5)):
        out = c.decompress(c.compress(x))
        assert torch.isfinite(out).all()
        if mode == "minmax" or not x.any():
            torch.testing.assert_close(out, x, rtol=0, atol=0)


# -- sign --------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 7, 8, 9, 100])
def test_sign_is_scaled_sign_with_packed_bits(n: int) -> None:
    x = randn(n, seed=n)
    p = SignSGD().compress(x)
    scale = float(x.abs().mean())
    want = torch.where(x >= 0, scale, -scale)
    torch.testing.assert_close(SignSGD().decompress(p), want)
    assert p.tensors["signs"].dtype == torch.uint8
    assert p.nbytes == math.ceil(n / 8) + 4
    ref = np.packbits((x >= 0).numpy())  # independent bit order reference
    assert p.tensors["signs"].numpy().tolist() == ref.tolist()


def test_pack_bits_round_trip() -> None:
    bits = randn(37, seed=9) > 0
    assert torch.equal(unpack_bits(pack_bits(bits), 37), bits)


# -- PowerSGD ----------------------------------------------------------------------------
@pytest.mark.parametrize("true_rank", [1, 2])
def test_powersgd_exact_for_low_rank_matrix(true_rank: int) -> None:
    m = randn(12, true_rank, seed=10) @ randn(true_rank, 9, seed=11)
    c = PowerSGD(rank=2)
    p = c.compress(m)
    torch.testing.assert_close(c.decompress(p), m, rtol=1e-4, atol=1e-4)
    assert p.nbytes == (12 + 9) * 2 * 4


def test_powersgd_warm_start_converges_to_best_rank_r() -> None:
    u, _ = torch.linalg.qr(randn(30, 30, seed=12, dtype=torch.float64))
    v, _ = torch.linalg.qr(randn(20, 20, seed=13, dtype=torch.float64))
    sv = torch.tensor([10.0, 8.0, 1.0, 0.5] + [0.1] * 16, dtype=torch.float64)
    m = u[:, :20] @ torch.diag(sv) @ v.T
    best = float(sv[2:].norm())  # Eckart-Young: error of the best rank-2 approximation
    c = PowerSGD(rank=2)
    errors = [float((c.decompress(c.compress(m)) - m).norm()) for _ in range(8)]
    assert errors[-1] == pytest.approx(best, rel=1e-3)
    assert errors[-1] <= errors[0]


def test_powersgd_matrix_view_of_flat_tensors() -> None:
    assert PowerSGD.matrix_shape((10,)) == (4, 3)  # ceil(sqrt(10)) = 4 rows, ceil(10/4) = 3 cols
    assert PowerSGD.matrix_shape((16,)) == (4, 4)
    assert PowerSGD.matrix_shape((2, 3, 4)) == (2, 12)
    assert PowerSGD.matrix_shape(()) == (1, 1)
    x = randn(10, seed=14)
    p = PowerSGD(rank=5).compress(x)  # rank clipped to min(rows, cols) = 3: exact
    assert p.nbytes == (4 + 3) * 3 * 4
    torch.testing.assert_close(PowerSGD(rank=5).decompress(p), x, rtol=1e-4, atol=1e-5)


# -- error feedback ----------------------------------------------------------------------
def test_error_feedback_transmits_sum_minus_residual_exactly() -> None:
    """Integer-valued gradients make float32 arithmetic exact, so the identity holds bit for bit."""
    ef = ErrorFeedback(TopK(k=3))
    grads = [torch.randint(-50, 50, (20,), generator=torch.Generator().manual_seed(t)).float() for t in range(10)]  # fmt: skip
    sent = sum(ef.decompress(ef.compress(g, key=4)) for g in grads)
    torch.testing.assert_close(sent, sum(grads) - ef.residual(4), rtol=0, atol=0)
    assert ef.residual(0) is None  # per-bucket state


@pytest.mark.parametrize("spec", ["qsgd:4", "sign", "int8", "powersgd:1", "randomk:0.3"])
def test_error_feedback_identity_for_any_compressor(spec: str) -> None:
    ef = ErrorFeedback(get_compressor(spec))
    grads = [randn(6, 5, seed=t, dtype=torch.float64) for t in range(12)]
    sent = sum(ef.decompress(ef.compress(g)) for g in grads)
    torch.testing.assert_close(sent, sum(grads) - ef.residual(0), rtol=0, atol=1e-12)


def test_error_feedback_recovers_what_topk_drops() -> None:
    ef = ErrorFeedback(TopK(k=1))
    g = torch.tensor([3.0, 2.0])
    outs = [ef.decompress(ef.compress(g)) for _ in range(2)]
    assert outs[0].tolist() == [3.0, 0.0] and outs[1].tolist() == [0.0, 4.0]


# -- edge cases --------------------------------------------------------------------------
EMPTY_BYTES = {"none": 0, "topk:0.1": 0, "randomk:0.2": 0, "qsgd:4": 4, "int8": 4,
               "int8:minmax": 8, "sign": 4, "powersgd:2": 0}  # fmt: skip


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_edge_cases_empty_scalar_zeros(spec: str) -> None:
    c = get_compressor(spec)
    empty = torch.empty(0)
    p = c.compress(empty)
    assert c.decompress(p).shape == (0,) and p.nbytes == EMPTY_BYTES[spec]
    for x in (torch.tensor(2.5), torch.tensor([-1.5])):  # 0-d and one element: exact
        out = c.decompress(c.compress(x))
        assert out.shape == x.shape and out.dtype == x.dtype
        torch.testing.assert_close(out, x, rtol=1e-6, atol=1e-6)
    zeros = torch.zeros(4, 5)
    torch.testing.assert_close(c.decompress(c.compress(zeros)), zeros, rtol=0, atol=0)


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_non_divisible_sizes_keep_shape(spec: str) -> None:
    c = get_compressor(spec)
    x = randn(3, 5, 7, seed=15)
    out = c.decompress(c.compress(x))
    assert out.shape == x.shape and torch.isfinite(out).all()


def test_payload_pack_unpack_round_trip() -> None:
    p = TopK(k=3).compress(randn(11, seed=16))
    assert p.pack().dtype == torch.uint8 and p.pack().numel() == p.nbytes == 24
    q = p.unpack(p.pack())
    for name in p.tensors:
        assert torch.equal(p.tensors[name], q.tensors[name])


# -- bad parameters and the registry -----------------------------------------------------
@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: TopK(), ValueError),
        (lambda: TopK(ratio=0.1, k=3), ValueError),
        (lambda: TopK(ratio=0.0), ValueError),
        (lambda: TopK(ratio=1.5), ValueError),
        (lambda: TopK(k=0), ValueError),
        (lambda: TopK(k=2.5), TypeError),
        (lambda: RandomK(ratio=-1), ValueError),
        (lambda: QSGD(s=0), ValueError),
        (lambda: QSGD(s=40000), ValueError),
        (lambda: Int8("fp4"), ValueError),
        (lambda: PowerSGD(rank=0), ValueError),
        (lambda: ErrorFeedback("topk"), TypeError),
        (lambda: ErrorFeedback(ErrorFeedback(SignSGD())), ValueError),
        (lambda: get_compressor("gzip"), ValueError),
        (lambda: get_compressor("topk:abc"), ValueError),
        (lambda: get_compressor("topk:"), ValueError),
        (lambda: get_compressor("sign:3"), ValueError),
        (lambda: get_compressor("qsgd:1.5"), ValueError),
        (lambda: get_compressor(3), TypeError),
        (lambda: TopK(k=1).compress(torch.arange(4)), TypeError),
        (lambda: SignSGD().compress([1.0, 2.0]), TypeError),
    ],
)
def test_bad_parameters_raise_clear_errors(build, error) -> None:
    with pytest.raises(error):
        build()


def test_registry_specs() -> None:
    assert get_compressor("topk:0.01").ratio == 0.01
    assert get_compressor("topk:100").k == 100
    assert get_compressor("randomk", k=4).k == 4
    assert get_compressor("qsgd:16").s == 16
    assert get_compressor("int8:minmax").mode == "minmax"
    assert get_compressor("powersgd:3").matrix_rank == 3
    ef = get_compressor("EF+topk:0.01")
    assert isinstance(ef, ErrorFeedback) and isinstance(ef.inner, TopK)
    assert isinstance(get_compressor("none"), NoCompression)
    assert get_compressor(None) is None
    c = SignSGD()
    assert get_compressor(c) is c
    for spec in (*ALL_SPECS, "topk:5", "ef+qsgd:8"):
        assert get_compressor(get_compressor(spec).name).name == get_compressor(spec).name


# -- aggregate on real ranks -------------------------------------------------------------
DIST_SPECS = ("none", "topk:0.1", "topk:3", "randomk:0.2", "qsgd:4", "int8", "int8:minmax",
              "sign", "ef+topk:0.1", "ef+sign", "ef+qsgd:4")  # fmt: skip
POWER_SPECS = ("powersgd:2", "ef+powersgd:2")
SHAPES = {0: (50,), 1: (6, 7)}  # bucket key -> shape
STEPS = 3


def grad(rank: int, step: int, key: int) -> torch.Tensor:
    return randn(*SHAPES[key], seed=1000 * rank + 10 * step + key)


def aggregate_all(ctx) -> dict:
    """Every spec, two buckets interleaved, a few steps; returns results and bytes."""
    out = {}
    for spec in DIST_SPECS + POWER_SPECS:
        c = get_compressor(spec)
        for step in range(STEPS):
            for key in SHAPES:
                out[spec, step, key] = c.aggregate(ctx, grad(ctx.rank, step, key), key=key)
                out[spec, step, key, "bytes"] = (c.last_bytes, c.last_sent_bytes)
        out[spec, "stats"] = (c.stats.calls, c.stats.payload_bytes, c.stats.dense_bytes)
    return out


def reference(spec: str, world: int) -> dict:
    """Mean over ranks of decompress(compress(x_r)), each rank's compressor built here."""
    comps = [get_compressor(spec) for _ in range(world)]
    for r, c in enumerate(comps):
        c.rank = r
        if isinstance(c, ErrorFeedback):
            c.inner.rank = r
    out = {}
    for step in range(STEPS):
        for key in SHAPES:
            parts = [c.decompress(c.compress(grad(r, step, key), key)) for r, c in enumerate(comps)]
            out[step, key] = sum(parts, torch.zeros(SHAPES[key])) / world
    return out


def powersgd_reference(rank: int, world: int, ef: bool) -> dict:
    """Vogels et al. Algorithm 1 written out in float64: shared P, QR, shared Q, warm start."""
    out, qs, residual = {}, {}, {}
    for step in range(STEPS):
        for key, shape in SHAPES.items():
            rows, cols = PowerSGD.matrix_shape(shape)
            n = math.prod(shape)
            ms = []
            for r in range(world):
                g = grad(r, step, key).double().reshape(-1)
                g = g + residual.get((r, key), 0.0)
                ms.append(torch.cat([g, g.new_zeros(rows * cols - n)]).reshape(rows, cols))
            q = qs.get(key, PowerSGD(rank=rank).initial_q(key, cols, rank).double())
            p_hat = torch.linalg.qr(sum(m @ q for m in ms) / world).Q
            q_i = [m.T @ p_hat for m in ms]
            qs[key] = sum(q_i) / world
            out[step, key] = (p_hat @ qs[key].T).reshape(-1)[:n].reshape(shape)
            if ef:
                for r, m in enumerate(ms):
                    residual[r, key] = (m - p_hat @ q_i[r].T).reshape(-1)[:n]
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("world", [1, 2, 3])
def test_aggregate_matches_single_process_reference(world: int) -> None:
    results = ddtk.launch(aggregate_all, world, timeout=120)
    for spec in DIST_SPECS:
        want = reference(spec, world)
        for step in range(STEPS):
            for key in SHAPES:
                for rank in range(world):
                    got = results[rank][spec, step, key]
                    torch.testing.assert_close(got, want[step, key], msg=lambda m, s=spec: f"{s}: {m}")  # fmt: skip
    for spec in POWER_SPECS:
        want = powersgd_reference(2, world, ef=spec.startswith("ef+"))
        for step in range(STEPS):
            for key in SHAPES:
                for rank in range(world):
                    got = results[rank][spec, step, key]
                    torch.testing.assert_close(got, want[step, key].float(), rtol=1e-4, atol=1e-4)


@pytest.mark.distributed
def test_aggregate_byte_accounting_on_three_ranks() -> None:
    world = 3
    results = ddtk.launch(aggregate_all, world, timeout=120)
    n0, n1 = 50, 42
    expected = {  # (payload bytes of key 0, key 1), hand-computed from each byte formula
        "none": (4 * n0, 4 * n1), "topk:0.1": (8 * 5, 8 * 5), "topk:3": (24, 24),
        "randomk:0.2": (4 * 10, 4 * 9), "qsgd:4": (n0 + 4, n1 + 4), "int8": (n0 + 4, n1 + 4),
        "int8:minmax": (n0 + 8, n1 + 8), "sign": (7 + 4, 6 + 4), "ef+topk:0.1": (40, 40),
        "powersgd:2": ((8 + 7) * 2 * 4, (6 + 7) * 2 * 4),
    }  # fmt: skip
    gathered = ("topk:0.1", "topk:3", "qsgd:4", "int8", "int8:minmax", "sign", "ef+topk:0.1")
    for rank in range(world):
        res = results[rank]
        for spec, (b0, b1) in expected.items():
            assert res[spec, 0, 0, "bytes"][0] == b0, spec
            assert res[spec, 0, 1, "bytes"][0] == b1, spec
            assert res[spec, "stats"] == (2 * STEPS, STEPS * (b0 + b1), STEPS * 4 * (n0 + n1))
            if spec in gathered:  # a ring all-gather: each rank forwards world - 1 payloads
                assert res[spec, 0, 0, "bytes"][1] == (world - 1) * b0, spec


@pytest.mark.distributed
def test_aggregate_on_one_rank_sends_nothing() -> None:
    results = ddtk.launch(aggregate_all, 1, timeout=120)
    assert results[0]["topk:0.1", 0, 0, "bytes"] == (40, 0)


@pytest.mark.distributed
def test_custom_compressor_uses_default_all_gather_exchange() -> None:
    """A subclass with only compress/decompress gets aggregate through the packed all-gather."""

    class Half(Compressor):
        name = "half"

        def compress(self, tensor, key=0):
            return Payload({"v": tensor.to(torch.float16)}, tensor.shape, tensor.dtype)

        def decompress(self, payload):
            return payload.tensors["v"].to(payload.dtype)

    def work(ctx):
        c = Half()
        return c.aggregate(ctx, torch.tensor([1.0, 2.0]) * (ctx.rank + 1)), c.last_bytes

    out, nbytes = ddtk.launch(work, 2, timeout=120)[1]
    assert out.tolist() == [1.5, 3.0] and nbytes == 4


# -- the benchmark -----------------------------------------------------------------------
@pytest.mark.distributed
def test_bench_runs_on_a_tiny_configuration(tmp_path) -> None:
    import argparse

    from ddtk.bench import compression as bench

    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["compression", "--steps", "4", "--compressors", "none,ef+topk:0.01",
                              "--json", str(tmp_path / "c.json"), "--plot", str(tmp_path / "c.png")])  # fmt: skip
    assert args.func(args) == 0
    import json

    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert [r["compressor"] for r in rows] == ["none", "ef+topk:0.01"]
    dense, topk = rows
    assert dense["ratio"] == 1.0 and dense["accuracy_delta_pp"] == 0.0
    n = dense["dense_bytes_per_step"] / 4  # parameters of the MLP
    assert topk["payload_bytes_per_step"] == 8 * math.ceil(0.01 * n)
    assert 0.0 <= topk["accuracy"] <= 1.0 and (tmp_path / "c.png").stat().st_size > 0
