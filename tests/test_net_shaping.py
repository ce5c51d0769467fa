"""Kernel traffic shaping: namespaces, tbf, iperf3, and gloo's own all-reduce over shaped links.

Needs root and iproute2 (``make test`` runs as root and requires it through
DDTK_REQUIRE=netns); elsewhere these tests skip and say why. The tolerances: the
raw link measured by ``iperf3`` within 10 % of the rate asked for (tbf's rate is
the IP rate; TCP/IP headers take about 4 % of it), and gloo's all-reduce busbw
within 15 % of what ``iperf3`` measured on the same link.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from support import require_or_skip

import ddtk
from ddtk.net import shaping
from ddtk.net.shaping import ShapedNetwork

pytestmark = pytest.mark.distributed


@pytest.fixture(autouse=True)
def _needs_shaping():
    reason = shaping.unavailable_reason()
    if reason:
        require_or_skip("netns", f"kernel shaping is unavailable: {reason}")


@pytest.fixture
def iperf3_installed():
    if shutil.which("iperf3") is None:
        require_or_skip("iperf3", "iperf3 is not installed (make debs installs it)")


def _ours() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith(shaping.PREFIX)}


def _bridges() -> set[str]:
    out = subprocess.run(
        ["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True
    )
    names = {line.split(":")[1].strip() for line in out.stdout.splitlines()}
    return {name for name in names if name.startswith(shaping.PREFIX)}


def _gloo_all_reduce(ctx, nbytes: int, reps: int) -> dict:
    import torch.distributed as dist

    x = torch.ones(nbytes // 4)
    dist.all_reduce(x)  # connections made, buffers touched
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - start)
    mine = ctx.all_reduce(torch.full((3,), float(ctx.rank)))  # ddtk's own, over the same links
    return {"seconds": sorted(times)[len(times) // 2], "transport": ctx.transport,
            "ddtk_sum": mine.tolist(), "addr": os.environ["MASTER_ADDR"]}  # fmt: skip


def test_iperf3_and_gloo_see_the_shaped_rate(iperf3_installed):
    before = _ours()
    with ShapedNetwork(2, rate="800Mbit", slow={1: "400Mbit"}) as net:
        fast = net.iperf3(0, 1)  # rank 0 sends at 800, rank 1 receives at 400: 400 wins
        assert abs(fast["bits_per_second"] / 400e6 - 1) < 0.10, fast
        results = ddtk.launch(_gloo_all_reduce, 2, args=(8 << 20, 3), network=net)
    # 2 ranks: each sends half the buffer and receives half, twice; busbw = algbw x 2(n-1)/n
    busbw = (8 << 20) / results[0]["seconds"] * 1.0
    assert abs(busbw / fast["bytes_per_second"] - 1) < 0.15, (busbw, fast)
    assert all(r["transport"] == "tcp" and r["ddtk_sum"] == [1.0] * 3 for r in results)
    assert results[0]["addr"] == net.bridge_ip
    assert _ours() == before and not _bridges()


def test_a_slow_rank_slows_only_its_own_links(iperf3_installed):
    # A shaped link never runs faster than its rate; it can run slower when the 2 cores that
    # copy the bytes are busy (seen in CI: 881 Mbit/s on the 1 Gbit link), so the best of up
    # to three measurements must reach it.
    seen: list[tuple[float, float]] = []
    with ShapedNetwork(3, rate="1Gbit", slow={2: "200Mbit"}) as net:
        for _ in range(3):
            seen.append((net.iperf3(0, 1)["bits_per_second"], net.iperf3(0, 2)["bits_per_second"]))
            assert seen[-1][0] < 1.10e9 and seen[-1][1] < 1.10 * 200e6, seen  # never faster
            if abs(seen[-1][0] / 1e9 - 1) < 0.10 and abs(seen[-1][1] / 200e6 - 1) < 0.10:
                break
    good, bad = max(g for g, _ in seen), max(b for _, b in seen)
    assert abs(good / 1e9 - 1) < 0.10 and abs(bad / 200e6 - 1) < 0.10, seen


def test_bad_requests_fail_before_anything_is_built():
    before = _ours()
    with pytest.raises(ValueError, match=r"slow names rank\(s\) \[4\]"):
        ShapedNetwork(2, rate="1Gbit", slow={4: "1Mbit"})
    with pytest.raises(ValueError, match="rate"):
        ShapedNetwork(2, rate="fast")
    with ShapedNetwork(2, rate="1Gbit") as net:
        with pytest.raises(ValueError, match="shared memory, around the shaped links"):
            ddtk.launch(_gloo_all_reduce, 2, args=(4, 1), network=net, transport="shm")
        with pytest.raises(ValueError, match="has 2 namespaces, the launch asks for 3"):
            ddtk.launch(_gloo_all_reduce, 3, args=(4, 1), network=net)
    with pytest.raises(RuntimeError, match="not up"):
        ddtk.launch(_gloo_all_reduce, 2, args=(4, 1), network=net)
    assert _ours() == before


def test_nothing_is_left_after_an_error_or_a_killed_owner():
    before = _ours()
    with pytest.raises(KeyError), ShapedNetwork(2, rate="1Gbit"):
        raise KeyError("inside the block")
    assert _ours() == before
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import time
            from ddtk.net.shaping import ShapedNetwork
            net = ShapedNetwork(2, rate="1Gbit")
            net.create()
            print("up", flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert owner.stdout.readline().strip() == "up"
    left = _ours() - before
    assert len(left) == 2
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    removed = shaping.sweep_stale()
    assert set(removed) >= left and _ours() == before and not _bridges()
