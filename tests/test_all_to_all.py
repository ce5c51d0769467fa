"""ctx.all_to_all against a single-process reference, on both transports and odd world sizes."""

from __future__ import annotations

import pytest
import torch

import ddtk

pytestmark = pytest.mark.distributed

WORLD_SIZES = (1, 2, 3, 4, 5)


def chunk(src: int, dst: int) -> torch.Tensor:
    """What rank ``src`` sends to rank ``dst``: shapes, dtypes and sizes differ by pair.

    Token counts per expert differ in a mixture-of-experts layer, so some chunks are
    empty, one is a scalar, one is non-contiguous, and dtypes vary.
    """
    count = (3 * src + 5 * dst) % 4  # 0..3 rows, so some pairs send nothing
    if (src + dst) % 5 == 4:
        return torch.tensor(float(10 * src + dst), dtype=torch.float64)  # a scalar
    dtype = (torch.float32, torch.int64, torch.bfloat16)[(src + 2 * dst) % 3]
    rows = torch.arange(count * 6).reshape(count, 6) + 100 * src + dst
    if src % 2:
        return rows.t().to(dtype)  # non-contiguous
    return rows.to(dtype)


def _exchange(ctx):
    mine = [chunk(ctx.rank, j) for j in range(ctx.world_size)]
    before = [c.clone() for c in mine]
    got = ctx.all_to_all(mine)
    assert all(torch.equal(a, b) for a, b in zip(mine, before))  # inputs are not modified
    split = ctx.all_to_all(torch.arange(3 * ctx.world_size + 1) + 1000 * ctx.rank)  # tensor_split
    return got, split, ctx.transport


@pytest.mark.parametrize(
    ("n", "transport"),
    [(n, "shm") for n in WORLD_SIZES] + [(n, "tcp") for n in WORLD_SIZES if n > 1],
)
def test_all_to_all_matches_the_reference(n, transport):
    results = ddtk.launch(_exchange, n, transport=transport, timeout=120)
    for dst, (got, split, used) in enumerate(results):
        assert used == (transport if n > 1 else "tcp")
        assert len(got) == n
        for src in range(n):
            want = chunk(src, dst)
            assert got[src].dtype == want.dtype and got[src].shape == want.shape, (src, dst)
            assert torch.equal(got[src], want), (src, dst)
            whole = torch.arange(3 * n + 1) + 1000 * src
            assert torch.equal(split[src], torch.tensor_split(whole, n)[dst]), (src, dst)


def _bad(ctx, what):
    if what == "count":
        ctx.all_to_all([torch.zeros(2)] * (ctx.world_size + 1))
    elif what == "scalar":
        ctx.all_to_all(torch.tensor(3.0))
    else:
        ctx.all_to_all([torch.zeros(1), "not a tensor"])


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("count", r"all_to_all needs 2 chunks \(one per rank\) or a tensor to split, got 3 chunks"),
        ("scalar", "all_to_all cannot split a 0-d tensor"),
        ("type", "all_to_all"),
    ],
)
def test_bad_chunks_are_refused_in_one_sentence(what, message):
    with pytest.raises(ddtk.RankError, match=message):
        ddtk.launch(_bad, 2, args=(what,), timeout=60)


def _counted(ctx, numel):
    ctx.stats.reset()
    ctx.all_to_all(torch.ones(numel * ctx.world_size))
    return ctx.stats.per_collective["all_to_all"].bytes_sent


def test_each_rank_sends_its_data_minus_its_own_share():
    n, numel = 4, 1000
    sent = ddtk.launch(_counted, n, args=(numel,))
    payload = (n - 1) * numel * 4  # (n - 1)/n of the 4n*numel bytes; plus one header per peer
    header = 32 * 8
    assert all(s == payload + (n - 1) * header for s in sent), sent
