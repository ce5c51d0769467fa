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


def _run_cases_on(ctx, cases, transport):
    assert ctx.transport == (transport if ctx.world_size > 1 else "tcp"), ctx.transport
    return run_cases(ctx, cases)


# Both of ddtk's transports run the whole matrix: shared memory (the default on one host)
# and gloo's sockets. World size 1 sends nothing, so it runs once.
@pytest.mark.parametrize(
    ("n", "transport"),
    [(n, "shm") for n in WORLD_SIZES] + [(n, "tcp") for n in WORLD_SIZES if n > 1],
)
def test_collectives_match_reference(n: int, transport: str) -> None:
    cases = build_cases(n)
    results = ddtk.launch(
        _run_cases_on, world_size=n, args=(cases, transport), timeout=240, transport=transport
    )
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


@pytest.mark.parametrize(("n", "transport"), [(3, "shm"), (4, "shm"), (4, "tcp")])
def test_large_random_float_all_reduce(n: int, transport: str) -> None:
    """Multi-segment buffers (several MiB, more than a shared-memory ring holds) with random floats."""
    numel = (3 << 20) // 4 * n + 7  # several segments per chunk, not divisible by n
    results = ddtk.launch(_random_floats, world_size=n, args=(ALL_REDUCE_ALGORITHMS, numel),
                          timeout=240, transport=transport)  # fmt: skip
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


def build_grouped_cases(n: int) -> list[Case]:
    """Both hierarchical forms, every group size from 1 to n + 1 (dividing n or not), SUM and MAX."""
    shapes = {k: v for k, v in shapes_for(n).items() if k in ("empty", "one", "fewer", "nondiv", "multidim")}
    return [
        Case("all_reduce", name, shape, dtype, op, algo, group_size=g)
        for algo in ("hierarchical_rs", "hierarchical")
        for g in range(1, n + 2)
        for name, shape in shapes.items()
        for dtype in (torch.float32, torch.int64)
        for op in (ReduceOp.SUM, ReduceOp.MAX)
    ]


@pytest.mark.parametrize("n", (1, 2, 3, 4, 5, 6))
def test_hierarchical_forms_match_reference_for_every_group_size(n: int) -> None:
    """hierarchical_rs (Horovod's form) and hierarchical (leader form) for g | n and g not | n,
    including a last group smaller than the others, empty tensors and fewer elements than ranks."""
    cases = build_grouped_cases(n)
    results = ddtk.launch(run_cases, world_size=n, args=(cases,), timeout=240)
    for rank, per_rank in enumerate(results):
        for case in cases:
            assert_same(per_rank[case.key], expected(case, n, rank), f"rank {rank} {case.key}")
    for case in cases:  # bit-identical on every rank
        assert all(torch.equal(r[case.key], results[0][case.key]) for r in results), case.key


def _hierarchical_rs_traffic(ctx, numel, group_size):
    x = torch.ones(numel)
    ctx.stats.reset()
    ctx.all_reduce(x, algorithm="hierarchical_rs", group_size=group_size)
    return ctx.stats.bytes_sent


def test_hierarchical_rs_sends_the_reduce_scatter_form_bytes() -> None:
    """4 ranks in 2 groups of 2, 1024 floats: RS 1/2 S, cross ring of S/2 over 2 ranks 2*(1/2)*S/2,
    AG 1/2 S: S + S/2 per rank, where the leader form's leaders send 2 S and more."""
    numel, S = 1024, 1024 * 4
    sent = ddtk.launch(_hierarchical_rs_traffic, world_size=4, args=(numel, 2), validate=False)
    assert sent == [S // 2 + S // 2 + S // 2] * 4, sent


def _into_out(ctx):
    out = {}
    for algo in ALL_REDUCE_ALGORITHMS:
        x = torch.arange(1003, dtype=torch.float32) * (ctx.rank + 1)
        buf = torch.full_like(x, -1.0)
        got = ctx.all_reduce(x, algorithm=algo, out=buf)
        out[algo] = (got is buf, buf.clone(), torch.equal(x, torch.arange(1003.0) * (ctx.rank + 1)))
        same = ctx.all_reduce(x, op="avg", algorithm=algo, out=x)  # in place, like torch.distributed
        out[algo + "/in-place"] = (same is x, x.clone(), True)
    for bad, says in ((torch.empty(3), "out must match the input"),
                      (torch.empty(1003, dtype=torch.float64), "out must match the input"),
                      (torch.empty(2006)[::2], "contiguous")):  # fmt: skip
        try:
            ctx.all_reduce(torch.ones(1003) if bad.numel() != 3 else torch.ones(4), out=bad)
        except ValueError as exc:
            out.setdefault("errors", []).append(says in str(exc))
    return out


@pytest.mark.parametrize(("n", "transport"), [(2, "shm"), (3, "shm"), (5, "shm"), (3, "tcp")])
def test_all_reduce_into_out_and_in_place(n: int, transport: str) -> None:
    results = ddtk.launch(_into_out, n, timeout=120, transport=transport)
    total = torch.arange(1003, dtype=torch.float32) * sum(range(1, n + 1))
    for per_rank in results:
        assert per_rank.pop("errors") == [True, True, True]
        for key, (is_out, value, input_kept) in per_rank.items():
            assert is_out and input_kept, key
            want = total / n if key.endswith("in-place") else total
            torch.testing.assert_close(value, want, msg=lambda m, k=key: f"{k}: {m}")
