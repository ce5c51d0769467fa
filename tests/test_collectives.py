"""Every collective and every all-reduce algorithm against a single-process reference.

One launch per world size runs the whole matrix (ops x algorithms x dtypes x
edge-case shapes) on real processes; the test process recomputes every expected
value from the same deterministic inputs.
"""

from __future__ import annotations

import pytest
import torch
from collective_cases import DTYPES, Case, make_input, run_cases, shapes_for

import ddtk
from ddtk.comm import ALL_REDUCE_ALGORITHMS, ReduceOp
from ddtk.comm.ops import reference_reduce

pytestmark = pytest.mark.distributed
WORLD_SIZES = (1, 2, 3, 4, 5)


def _ops_for(dtype: torch.dtype) -> list[ReduceOp]:
    return [op for op in ReduceOp if not (op is ReduceOp.AVERAGE and not dtype.is_floating_point)]


def build_cases(n: int) -> list[Case]:
    cases: list[Case] = []
    shapes = shapes_for(n)
    roots = sorted({0, n - 1})
    for dtype in DTYPES:
        for name, shape in shapes.items():
            for op in _ops_for(dtype):
                cases += [Case("all_reduce", name, shape, dtype, op, algo) for algo in ALL_REDUCE_ALGORITHMS]
                cases += [Case("reduce", name, shape, dtype, op, root=r) for r in roots]
                if shape:
                    cases.append(Case("reduce_scatter", name, shape, dtype, op))
            for r in roots:
                cases += [Case(c, name, shape, dtype, root=r) for c in ("broadcast", "gather", "scatter")]
            cases.append(Case("all_gather", name, shape, dtype))
    return cases


def expected(case: Case, n: int, rank: int):
    inputs = [make_input(case, r) for r in range(n)]
    if case.collective in ("all_reduce", "reduce", "reduce_scatter"):
        full = reference_reduce(inputs, case.op)
        if case.collective == "reduce":
            return full if rank == case.root else None
        if case.collective == "reduce_scatter":
            return torch.tensor_split(full, n)[rank]
        return full
    if case.collective == "broadcast":
        return inputs[case.root]
    if case.collective == "all_gather":
        return inputs
    if case.collective == "gather":
        return inputs if rank == case.root else None
    if case.collective == "scatter":
        return make_input(case, 100 + rank)
    raise AssertionError(case.collective)


def assert_same(actual, want, key: str) -> None:
    if want is None:
        assert actual is None, key
        return
    if isinstance(want, list):
        assert isinstance(actual, list) and len(actual) == len(want), key
        for a, w in zip(actual, want):
            assert_same(a, w, key)
        return
    assert isinstance(actual, torch.Tensor), key
    assert actual.shape == want.shape and actual.dtype == want.dtype, f"{key}: {actual.shape}/{actual.dtype} != {want.shape}/{want.dtype}"
    torch.testing.assert_close(actual, want, rtol=0, atol=0, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_collectives_match_reference(n: int) -> None:
    cases = build_cases(n)
    results = ddtk.launch(run_cases, world_size=n, args=(cases,), timeout=240)
    for rank, per_rank in enumerate(results):
        for case in cases:
            assert_same(per_rank[case.key], expected(case, n, rank), f"rank {rank} {case.key}")
    # all-reduce results must be bit-identical on every rank, as data-parallel training relies on.
    for case in cases:
        if case.collective == "all_reduce":
            first = results[0][case.key]
            assert all(torch.equal(r[case.key], first) for r in results), case.key


def _random_floats(ctx, algorithms, numel):
    gen = torch.Generator().manual_seed(1234 + ctx.rank)
    x = torch.randn(numel, generator=gen, dtype=torch.float32)
    return {a: ctx.all_reduce(x, algorithm=a) for a in algorithms}


@pytest.mark.parametrize("n", (3, 4))
def test_large_random_float_all_reduce(n: int) -> None:
    """Multi-segment buffers (several MiB) with random floats, compared with assert_close."""
    numel = (3 << 20) // 4 * n + 7  # several segments per chunk, not divisible by n
    results = ddtk.launch(_random_floats, world_size=n, args=(ALL_REDUCE_ALGORITHMS, numel), timeout=240)
    want = sum(torch.randn(numel, generator=torch.Generator().manual_seed(1234 + r)).double() for r in range(n)).float()
    for per_rank in results:
        for algo, out in per_rank.items():
            torch.testing.assert_close(out, want, msg=lambda m, a=algo: f"{a}: {m}")


def _hierarchical(ctx, group_sizes):
    x = torch.arange(10, dtype=torch.float64) * (ctx.rank + 1)
    return {g: ctx.all_reduce(x, algorithm="hierarchical", group_size=g) for g in group_sizes}


def test_hierarchical_group_sizes() -> None:
    n = 5
    results = ddtk.launch(_hierarchical, world_size=n, args=((1, 2, 3, 5),))
    want = torch.arange(10, dtype=torch.float64) * sum(range(1, n + 1))
    for per_rank in results:
        for g, out in per_rank.items():
            torch.testing.assert_close(out, want, msg=lambda m, g=g: f"group_size={g}: {m}")
