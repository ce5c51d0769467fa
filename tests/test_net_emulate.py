"""Link emulation: the token bucket's arithmetic, the accuracy of emulated links, correctness.

Accuracy is checked on real ranks: one-way times of messages from 4 B to 2 MiB,
measured by ping-pong, are fitted with t = a + m / b. The stated tolerance:
the fitted bandwidth ``b`` is within 10 % of the link's, and the fitted latency
``a`` lies between the link's latency and that plus 0.5 ms (the transport's own
cost of a message, which the emulation adds to rather than replaces, and the
scheduling noise of 2 shared cores). No message may ever arrive sooner than the
link allows; the upper bounds get three attempts, since load only adds time.
"""

from __future__ import annotations

import time

import pytest
import torch
from support import machine_state
from test_collectives import assert_same, build_cases, expected

import ddtk
from ddtk.net.emulate import EmulatedNetwork, LinkSpec, TokenBucket
from ddtk.net.measure import fit_link, link_times
from ddtk.net.probe import diagnose, find_slow_links, probe_links, round_robin
from ddtk.net.units import parse_rate, parse_time

pytestmark = pytest.mark.distributed

LATENCY_SLACK_S = 0.5e-3
BANDWIDTH_TOLERANCE = 0.10
_TAG = 1 << 25


# -- pure arithmetic ---------------------------------------------------------------------
def test_units_read_what_datasheets_write():
    assert parse_rate("400Gbit") == 50e9
    assert parse_rate("200 Gb/s") == 25e9
    assert parse_rate("450GB/s") == 450e9
    assert parse_rate("1.25 GB/s") == 1.25e9
    assert parse_rate(3e9) == 3e9
    assert parse_time("2.5us") == pytest.approx(2.5e-6)
    assert parse_time("800ns") == pytest.approx(8e-7)
    assert parse_time("1.5 ms") == pytest.approx(1.5e-3)
    assert LinkSpec("1GB/s", 0, "64KiB").burst == 65536 and LinkSpec("1GB/s", 0, 7).burst == 7
    for bad in ("fast", "10 Gbits per fortnight", "-1Gbit", "0GB/s"):
        with pytest.raises(ValueError, match="rate"):
            parse_rate(bad)
    with pytest.raises(ValueError, match="duration"):
        parse_time("5 minutes")
    with pytest.raises(TypeError):
        parse_rate(True)


def test_token_bucket_queues_messages_and_refills_at_its_rate():
    ns = 1_000_000_000
    b = TokenBucket(rate=1e6, burst=0)  # 1 MB/s: 1 byte per microsecond
    assert b.reserve(1000, 0) == 1_000_000  # 1000 bytes leave after 1 ms
    assert b.reserve(1000, 0) == 2_000_000  # the second queues behind the first
    assert b.reserve(500, 5 * ns // 1000) == 5_500_000  # idle by 5 ms: starts at once
    burst = TokenBucket(rate=1e6, burst=4000)
    assert burst.reserve(4000, 0) == 0  # a full bucket sends its burst at once
    assert burst.reserve(1000, 0) == 1_000_000  # then pays at the rate
    assert burst.reserve(0, 10 * ns) == 10 * ns  # refilled (capped at the burst) after 10 s
    assert burst.reserve(5000, 10 * ns) == 10 * ns + 1_000_000


def test_links_take_the_most_specific_exception():
    net = EmulatedNetwork("10Gbit", "5us", slow={2: "1Gbit", (0, 1): {"latency": "1ms"}})
    assert net.link(3, 0) == LinkSpec(1.25e9, 5e-6)
    assert net.link(2, 0).bandwidth == 1.25e8 and net.link(0, 2).bandwidth == 1.25e8
    assert net.link(0, 1) == LinkSpec(1.25e9, 1e-3)  # the pair wins; one direction only
    assert net.link(1, 0).latency == 5e-6
    assert net.default.time(1_250_000) == pytest.approx(5e-6 + 1e-3)
    with pytest.raises(ValueError, match="two different ranks"):
        EmulatedNetwork("1Gbit", slow={(1, 1): "1Mbit"})
    with pytest.raises(ValueError, match="unknown link field"):
        EmulatedNetwork("1Gbit", slow={1: {"speed": "1Mbit"}})
    with pytest.raises(ValueError, match="rank"):
        EmulatedNetwork("1Gbit", slow={"a": "1Mbit"})


def test_a_launch_naming_a_missing_rank_fails_before_any_process_starts():
    net = EmulatedNetwork("1Gbit", slow={5: "1Mbit"})
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"rank\(s\) \[5\].*0..3"):
        ddtk.launch(_nothing, 4, network=net)
    assert time.monotonic() - start < 2
    with pytest.raises(TypeError, match="network must be"):
        ddtk.launch(_nothing, 2, network="10Gbit")
    with pytest.raises(ValueError, match="cannot be used with backend='nccl'"):
        ddtk.launch(_nothing, 2, network=EmulatedNetwork("1Gbit"), backend="nccl")


def _nothing(ctx):
    return ctx.rank


def test_round_robin_pairs_every_rank_once_per_round_and_every_pair_once():
    for n in range(1, 8):
        rounds = round_robin(n)
        seen = [p for r in rounds for p in r]
        assert sorted(seen) == [(a, b) for a in range(n) for b in range(a + 1, n)]
        for r in rounds:
            flat = [x for p in r for x in p]
            assert len(flat) == len(set(flat))


# -- on real ranks -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("transport", "bandwidth", "latency"),
    [("shm", "100MB/s", "1ms"), ("shm", "1GB/s", "200us"), ("tcp", "200MB/s", "1ms")],
)
def test_emulated_links_have_the_bandwidth_and_latency_asked_for(transport, bandwidth, latency):
    net = EmulatedNetwork(bandwidth, latency)
    link = net.default
    sizes = [4, 64 << 10, 512 << 10, 1 << 20, 2 << 20]
    attempts = []
    for _ in range(3):  # noise only adds time: a loaded machine gets two more tries
        times = ddtk.launch(link_times, 2, args=(sizes, 15), network=net, transport=transport)[0]
        # no message ever arrives sooner than the link allows, in any attempt
        assert all(t >= link.time(n) * 0.95 for n, t in times.items()), times
        off = _off_the_link(link, times)
        if not off:
            return
        attempts.append(off)
    # Under contention a woken rank can wait a whole scheduler slice (0.75 ms) behind
    # another process, so every attempt's failure is shown with the machine's state.
    pytest.fail(f"{attempts}; {machine_state()}")


def _off_the_link(link: LinkSpec, times: dict[int, float]) -> list[str]:
    """Which sizes (and which fitted parameters) lie outside the stated tolerance."""
    got_latency, got_bandwidth = fit_link(times)
    off = [f"size {n}: {t * 1e3:.3f} ms against {link.time(n) * 1e3:.3f} ms" for n, t in times.items()
           if not t <= link.time(n) * 1.1 + LATENCY_SLACK_S]  # fmt: skip
    if abs(got_bandwidth / link.bandwidth - 1) > BANDWIDTH_TOLERANCE:
        off.append(f"fitted bandwidth {got_bandwidth / 1e6:.1f} MB/s")
    if not link.latency <= got_latency <= link.latency + LATENCY_SLACK_S:
        off.append(f"fitted latency {got_latency * 1e6:.0f} us")
    return off


def _fan_out(ctx, nbytes: int) -> dict[str, float]:
    """Rank 0 sends to 1 and 2 at once, then twice to 1; 1 and 2 receive."""
    comm = ctx._comm
    x = torch.zeros(nbytes // 4)
    ctx.barrier()
    out = {}
    start = time.perf_counter()
    if ctx.rank == 0:
        for w in [comm.isend(x, 1, _TAG), comm.isend(x, 2, _TAG)]:
            w.wait()
        out["two_peers"] = time.perf_counter() - start
        ctx.barrier()
        start = time.perf_counter()
        for w in [comm.isend(x, 1, _TAG), comm.isend(x, 1, _TAG)]:
            w.wait()
        out["one_peer_twice"] = time.perf_counter() - start
    else:
        comm.irecv(x, 0, _TAG).wait()
        ctx.barrier()
        if ctx.rank == 1:
            comm.irecv(x, 0, _TAG).wait()
            comm.irecv(x, 0, _TAG).wait()
    return out


def test_links_to_different_peers_run_in_parallel_and_one_link_queues():
    net = EmulatedNetwork("100MB/s", "0us")
    out = ddtk.launch(_fan_out, 3, args=(2 << 20,), network=net)[0]
    one = (2 << 20) / 100e6  # 21 ms
    assert one * 0.95 <= out["two_peers"] <= one * 1.5, out  # two links at once: one message's time
    assert 2 * one * 0.95 <= out["one_peer_twice"] <= 2 * one * 1.5, out  # one link: they queue


def test_a_nic_makes_sends_to_different_peers_share_its_rate():
    net = EmulatedNetwork("100MB/s", "0us", nic="100MB/s")
    out = ddtk.launch(_fan_out, 3, args=(2 << 20,), network=net)[0]
    one = (2 << 20) / 100e6
    assert 2 * one * 0.95 <= out["two_peers"] <= 2 * one * 1.5, out  # one NIC: they queue
    assert "NIC 100 MB/s per rank" in str(net)


def _cases_and_stats(ctx, cases):
    from collective_cases import run_cases

    results = run_cases(ctx, cases)
    ctx.stats.reset()
    ctx.all_reduce(torch.ones(1000))
    ctx.send({"hello": ctx.rank}, (ctx.rank + 1) % ctx.world_size, tag=3)
    got = ctx.recv(None, tag=3)  # receive-from-any works through the emulated links too
    ctx.flush()
    return results, ctx.stats.bytes_sent, ctx.stats.messages_sent, got.src, got.payload


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_collectives_stay_correct_and_counted_the_same_on_emulated_links(transport):
    n = 3
    cases = [c for c in build_cases(n) if c.shape_name in ("empty", "fewer", "nondiv", "scalar")]
    plain = ddtk.launch(_cases_and_stats, n, args=(cases,), transport=transport)
    emulated = ddtk.launch(_cases_and_stats, n, args=(cases,), transport=transport,
                           network=EmulatedNetwork("2GB/s", "20us"))  # fmt: skip
    for rank, (results, sent, messages, src, payload) in enumerate(emulated):
        for case in cases:
            assert_same(results[case.key], expected(case, n, rank), f"rank {rank} {case.key}")
        assert (sent, messages) == plain[rank][1:3]  # the stamps are not counted as traffic
        assert src == (rank - 1) % n and payload == {"hello": src}


def test_probe_finds_a_slow_nic_and_a_slow_path():
    net = EmulatedNetwork("200MB/s", "50us", slow={3: "40MB/s", (0, 1): "60MB/s"})
    got = ddtk.launch(probe_links, 4, kwargs={"nbytes": 1 << 20, "messages": 2}, network=net)[0]
    bw = got["bandwidth_Bps"]
    off = [
        f"{src}->{dst}: {bw[src][dst] / 1e6:.1f} MB/s against {net.link(src, dst).bandwidth / 1e6:.0f}"
        for src in range(4)
        for dst in range(4)
        if src != dst and abs(bw[src][dst] / net.link(src, dst).bandwidth - 1) >= 0.25
    ]
    assert not off, f"{off}; matrix {bw}; {machine_state()}"
    slow = {(s.src, s.dst) for s in find_slow_links(bw)}
    assert slow == {(3, 0), (3, 1), (3, 2), (0, 3), (1, 3), (2, 3), (0, 1)}
    text = diagnose(bw)
    assert text[0].startswith("rank 3: every link")
    assert any(line.startswith("link 0 -> 1") for line in text) and len(text) == 2
    assert diagnose([[0, 1e9], [1e9, 0]]) == [
        "every link runs at 50% or more of the fastest: no slow link"
    ]
