"""The shared-memory transport: wrap-around, large and early messages, hosts, and cleanup.

The collective matrix and the failure tests run on both transports in
``test_collectives.py`` and ``test_faults.py``; this module covers what only
shared memory has: ring buffers, segment files in /dev/shm and their removal in
every exit path, and groups that span "hosts" (shared memory inside, gloo across).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import ddtk
from ddtk.comm import shm
from ddtk.comm.context import DistributedContext, check_transport

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(shm.unsupported_reason() is not None, reason=str(shm.unsupported_reason())),
]


def _segments() -> set[str]:
    return {p.name for p in shm.SHM_DIR.glob(f"{shm.PREFIX}*")}


@pytest.fixture
def no_leftovers():
    """Fail if a test leaves a ddtk segment in /dev/shm."""
    before = _segments()
    yield
    assert _segments() - before == set()


# -- ring buffers ------------------------------------------------------------------------
def _traffic(ctx):
    """Messages larger than the ring, messages sent before their receive, and many of each."""
    out = {"transport": ctx.transport, "files": sorted(_segments())}
    peer = (ctx.rank + 1) % ctx.world_size
    left = (ctx.rank - 1) % ctx.world_size
    big = torch.arange(300_000, dtype=torch.float64) + ctx.rank  # 2.4 MB through a 16 KB ring
    ctx.send(big, peer, tag=7)
    for i in range(50):  # small ones queue behind the big one, in order
        ctx.send(i * 10 + ctx.rank, peer, tag=8)
    got = ctx.recv(left, tag=7).payload
    out["big_ok"] = torch.equal(got, torch.arange(300_000, dtype=torch.float64) + left)
    out["small"] = [ctx.recv(left, tag=8).payload for _ in range(50)]
    x = torch.randn(100_003, generator=torch.Generator().manual_seed(ctx.rank))
    out["sums"] = {
        a: ctx.all_reduce(x, algorithm=a) for a in ("ring", "tree", "recursive_doubling")
    }
    out["bf16"] = ctx.all_gather(torch.full((3,), ctx.rank, dtype=torch.bfloat16))
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_small_ring_wraps_streams_and_keeps_order(n, monkeypatch, no_leftovers):
    monkeypatch.setenv(shm.CAPACITY_ENV, "16K")
    results = ddtk.launch(_traffic, n, timeout=120, transport="shm")
    xs = [torch.randn(100_003, generator=torch.Generator().manual_seed(r)) for r in range(n)]
    want = torch.stack(xs).double().sum(0).float()
    for rank, out in enumerate(results):
        left = (rank - 1) % n
        assert out["transport"] == "shm"
        assert out["files"] == [], "the segment is unlinked once every rank has mapped it"
        assert out["big_ok"]
        assert out["small"] == [i * 10 + left for i in range(50)]
        for algo, got in out["sums"].items():
            torch.testing.assert_close(got, want, msg=lambda m, a=algo: f"{a}: {m}")
        assert [int(t[0]) for t in out["bf16"]] == list(range(n))


def _large(ctx):
    x = torch.randn(300_003, generator=torch.Generator().manual_seed(ctx.rank))
    peer, left = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    ctx.send(x * 2, peer, tag=4)  # 1.2 MB: large enough to be read straight from the sender
    got = ctx.recv(left, tag=4).payload
    return {
        "direct": sorted(set(ctx._comm._direct_to.values())),
        "sum": ctx.all_reduce(x, algorithm="ring"),
        "from_left": torch.equal(
            got, torch.randn(300_003, generator=torch.Generator().manual_seed(left)) * 2
        ),
    }


@pytest.mark.parametrize("direct", ["on", "off"])
def test_large_messages_are_read_from_the_sender_or_pass_through_the_ring(direct, monkeypatch):
    """One copy by process_vm_readv where the system allows it, two through the ring otherwise."""
    monkeypatch.setenv("DDTK_SHM_DIRECT", direct)
    results = ddtk.launch(_large, 3, timeout=120, transport="shm")
    want = sum(
        torch.randn(300_003, generator=torch.Generator().manual_seed(r)).double() for r in range(3)
    )
    for out in results:
        assert out["direct"] == ([True] if direct == "on" else [False])
        assert out["from_left"]
        torch.testing.assert_close(out["sum"], want.float())


# -- groups spanning hosts -----------------------------------------------------------------
def _two_hosts(ctx):
    """Pretend ranks 0-1 and 2-3 sit on two hosts, then use every path."""
    os.environ["DDTK_HOST_ID"] = f"node{ctx.rank // 2}"
    c = DistributedContext(ctx.rank, ctx.world_size, ctx.backend, ctx.device, transport="auto")
    x = torch.arange(10, dtype=torch.float64) * (ctx.rank + 1)
    out = {
        "transport": c.transport,
        "hybrid": c._comm.hybrid,
        "local": c._comm.local_ranks,
        **{a: c.all_reduce(x, algorithm=a) for a in ("ring", "tree", "hierarchical", "naive")},
        "bcast": c.broadcast(x if ctx.rank == 3 else None, root=3),
    }
    c.send(f"from {ctx.rank}", (ctx.rank + 1) % ctx.world_size, tag=2)
    out["any"] = c.recv(None, tag=2).payload
    c.flush()
    return out


def test_a_group_over_two_hosts_uses_shared_memory_inside_and_gloo_across(no_leftovers):
    results = ddtk.launch(_two_hosts, 4, timeout=120, transport="tcp")
    want = torch.arange(10, dtype=torch.float64) * 10
    for rank, out in enumerate(results):
        assert out["transport"] == "shm" and out["hybrid"]
        assert out["local"] == ([0, 1] if rank < 2 else [2, 3])
        for algo in ("ring", "tree", "hierarchical", "naive"):
            torch.testing.assert_close(out[algo], want)
        torch.testing.assert_close(out["bcast"], torch.arange(10, dtype=torch.float64) * 4)
        assert out["any"] == f"from {(rank - 1) % 4}"


# -- choosing a transport ------------------------------------------------------------------
def _which(ctx):
    return ctx.transport


def test_transport_names_are_checked_before_anything_starts(monkeypatch):
    with pytest.raises(ValueError, match="unknown transport 'udp'; expected one of auto, shm, tcp"):
        check_transport("udp")
    with pytest.raises(ValueError, match="unknown transport 'ib'"):
        ddtk.launch(_which, 2, transport="ib")
    monkeypatch.setenv("DDTK_TRANSPORT", "tcp")
    assert check_transport(None) == "tcp"
    monkeypatch.setenv(shm.CAPACITY_ENV, "1K")
    with pytest.raises(ddtk.RankError, match="DDTK_SHM_RING_BYTES must be at least 4K"):
        ddtk.launch(_which, 2, transport="shm", echo=False)


def test_auto_picks_shared_memory_on_one_host_and_one_rank_needs_none():
    assert ddtk.launch(_which, 2) == ["shm", "shm"]
    assert ddtk.launch(_which, 2, transport="tcp") == ["tcp", "tcp"]
    assert ddtk.launch(_which, 1, transport="shm") == ["tcp"]  # nothing to connect


def test_sweep_removes_only_the_files_of_dead_processes(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = shm.SHM_DIR / f"{shm.PREFIX}{int(dead.stdout)}-test"
    mine = shm.SHM_DIR / f"{shm.PREFIX}{os.getpid()}-test"
    try:
        stale.write_bytes(b"x")
        mine.write_bytes(b"x")
        removed = shm.sweep_stale()
        assert stale in removed and not stale.exists()
        assert mine.exists() and mine not in removed
    finally:
        stale.unlink(missing_ok=True)
        mine.unlink(missing_ok=True)


# -- no segment survives any exit path -----------------------------------------------------
def _fails(ctx, how):
    ctx.all_reduce(torch.ones(4))
    if ctx.rank == 1:
        if how == "raise":
            raise RuntimeError("planned failure")
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.all_reduce(torch.ones(4))


@pytest.mark.parametrize("how", ["raise", "sigkill"])
def test_no_segment_is_left_when_a_rank_fails(how, no_leftovers):
    with pytest.raises(ddtk.RankError) as info:
        ddtk.launch(_fails, 3, args=(how,), timeout=60, echo=False, op_timeout=5, transport="shm")
    assert info.value.rank in (0, 1, 2)


_PARENT = textwrap.dedent(
    """
    import sys, time, torch, ddtk

    def spin(ctx):
        print("running", flush=True)
        while True:
            ctx.all_reduce(torch.ones(1000))

    ddtk.launch(spin, 3, timeout=300, transport="shm")
    """
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_no_segment_or_rank_is_left_when_the_launcher_dies_or_is_interrupted(
    sig, tmp_path, no_leftovers
):
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    # A fresh session, with SIGINT at its default: a Ctrl-C reaches Python as KeyboardInterrupt.
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while "running" not in (proc.stdout.readline() or "") and time.monotonic() < deadline:
            pass
        time.sleep(1.0)  # in the middle of all-reduces
        children = _children(proc.pid)
        assert len(children) >= 3, f"the launcher started no ranks: {children}"
        proc.send_signal(sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in children if _alive(p)], "ranks outlived their launcher"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc: no pgrep needed): ranks and ddtk's zygote."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found += sorted(frontier)
    return found


def _alive(pid: int) -> bool:
    return shm.pid_alive(pid)


def test_bench_collectives_prints_every_target_ratio(tmp_path, capsys, no_leftovers):
    """A tiny ``ddtk bench collectives`` run: both transports, the peer, the headline ratios."""
    import json

    from ddtk.cli import main

    out = tmp_path / "c.json"
    argv = ["bench", "collectives", "-n", "2", "--min-bytes", "4", "--max-bytes", "16",
            "--algorithms", "ring,recursive_doubling", "--iters", "2", "--warmup", "1",
            "--no-launch-overhead", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    for line in ("best shm latency / peer at the smallest size", "peer time / best shm time"):
        assert line in text
    result = json.loads(out.read_text())
    labels = {(r["algorithm"], r.get("transport")) for r in result["rows"]}
    assert {
        ("ring", "shm"),
        ("ring", "tcp"),
        ("recursive_doubling", "shm"),
        ("torch", None),
    } <= labels
    s = result["summary"]["2"]
    rows = [r for r in result["rows"] if r["nbytes"] == 4]
    peer = next(r["time_median_s"] for r in rows if r["algorithm"] == "torch")
    best = min(r["time_median_s"] for r in rows if r.get("transport") == "shm")
    assert s["shm_smallest_latency_vs_peer"] == pytest.approx(best / peer)
    assert s["shm_best_vs_peer_min"] <= peer / best + 1e-12
