"""The topology model: presets, byte counts by hand, bottlenecks, crossovers, published checks."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ddtk.net import published
from ddtk.net.predict import applicable, crossover, predict
from ddtk.net.topology import DGX_A100, DGX_H100, PRESETS, Cluster, Link, loopback, preset

GiB = 1 << 30


def test_presets_are_per_direction_and_name_their_sources():
    assert DGX_A100.intra.bandwidth == 300e9 and DGX_H100.intra.bandwidth == 450e9
    assert DGX_H100.nic.bandwidth == 50e9 and DGX_A100.nic.bandwidth == 25e9
    for name, cluster in PRESETS.items():
        assert cluster.sources and all(isinstance(s, str) and s for s in cluster.sources), name
        assert preset(name, 4).ranks == 4 * cluster.gpus_per_node
    with pytest.raises(ValueError, match="unknown cluster preset 'dgx-z'"):
        preset("dgx-z")
    with pytest.raises(ValueError, match="need a nic"):
        Cluster("x", 8, Link("1GB/s", "nvlink"), nodes=2)
    with pytest.raises(ValueError, match="link kind"):
        Link("1GB/s", "carrier pigeon")


def test_single_node_ring_matches_the_formula_by_hand():
    p = predict(DGX_A100, "all_reduce", GiB, "ring", "Simple")
    latency = 8.4e-6 + 14 * 3.4e-6  # base + 2(P-1) NVLink hops
    transfer = 2 * 7 / 8 * GiB / (300e9 * 0.80)
    assert p.latency == pytest.approx(latency) and p.transfer == pytest.approx(transfer)
    assert p.time == pytest.approx(latency + transfer)
    assert p.busbw == pytest.approx(2 * 7 / 8 * GiB / p.time)
    assert p.bottleneck.startswith("GPU link")


def test_across_nodes_the_nics_limit_a_ring_and_busbw_approaches_their_sum():
    c = preset("dgx-h100", 4)
    p = predict(c, "all_reduce", 16 * GiB, "ring", "Simple")
    assert p.bottleneck.startswith("NICs")
    P = 32
    nic_seconds = 2 * (P - 1) / P * 16 * GiB / 8 / (50e9 * 0.96)
    assert p.link_times["nic"] == pytest.approx(nic_seconds)
    assert p.busbw == pytest.approx(8 * 50e9 * 0.96, rel=0.01)  # the node's NICs, all of them


def test_two_node_tree_sends_half_the_bytes_per_nic():
    two, three = preset("dgx-a100", 2), preset("dgx-a100", 3)
    t2 = predict(two, "all_reduce", 4 * GiB, "tree", "Simple").link_times["nic"]
    t3 = predict(three, "all_reduce", 4 * GiB, "tree", "Simple").link_times["nic"]
    assert t3 == pytest.approx(2 * t2)
    assert t2 == pytest.approx(4 * GiB / 8 / (25e9 * 0.96))


def test_nvls_moves_a_buffer_and_an_eighth_per_gpu():
    p = predict(DGX_H100, "all_reduce", 8 * GiB, "nvls")
    assert p.protocol == "Simple"
    assert p.link_times["gpu"] == pytest.approx(8 * GiB * (1 + 1 / 8) / (450e9 * 0.80))
    ring = predict(DGX_H100, "all_reduce", 8 * GiB, "ring")
    assert p.busbw / ring.busbw == pytest.approx(2 * 7 / 8 / (1 + 1 / 8), rel=0.01)
    with pytest.raises(ValueError, match="'nvls' cannot run all_reduce on DGX A100"):
        predict(DGX_A100, "all_reduce", GiB, "nvls")
    assert "in_network" not in applicable(DGX_H100, "all_reduce")  # one node, no SHARP


def test_oversubscription_slows_rings_only_beyond_the_leaf_but_all_to_all_everywhere():
    flat = preset("dgx-h100", 8)
    fat = dataclasses.replace(flat, nodes_per_leaf=4, oversubscription=2.0)
    ring_flat = predict(flat, "all_reduce", 8 * GiB, "ring", "Simple")
    ring_fat = predict(fat, "all_reduce", 8 * GiB, "ring", "Simple")
    assert ring_fat.transfer == pytest.approx(ring_flat.transfer)  # 2:1 spread over 4 nodes
    assert ring_fat.link_times["uplink"] == pytest.approx(ring_flat.link_times["nic"] * 2 / 4)
    worse = dataclasses.replace(fat, oversubscription=8.0)
    assert predict(worse, "all_reduce", 8 * GiB, "ring", "Simple").bottleneck.startswith("spine")
    a2a_flat = predict(flat, "all_to_all", 8 * GiB)
    a2a_fat = predict(fat, "all_to_all", 8 * GiB)
    share = (8 - 4) / (8 - 1) * 2.0  # peers under other leaves, times the oversubscription
    assert a2a_fat.link_times["uplink"] == pytest.approx(a2a_flat.link_times["nic"] * share)
    assert a2a_fat.bottleneck.startswith("spine") and a2a_fat.time > a2a_flat.time


def test_hierarchical_beats_a_flat_ring_on_small_messages_at_scale_and_loses_on_large_ones():
    c = preset("dgx-h100", 16)
    small, large = 64 << 10, 4 * GiB
    assert (
        predict(c, "all_reduce", small, "hierarchical").time
        < predict(c, "all_reduce", small, "ring").time
    )
    assert (
        predict(c, "all_reduce", large, "hierarchical").time
        > predict(c, "all_reduce", large, "ring").time
    )
    size = crossover(c, "all_reduce", "hierarchical", "ring")
    assert size is not None and small < size < large
    before = predict(c, "all_reduce", size * 0.9, "hierarchical").time
    assert before < predict(c, "all_reduce", size * 0.9, "ring").time
    assert crossover(DGX_A100, "all_reduce", "ring", "ring") is None


def test_loopback_reduces_to_the_alpha_beta_ring():
    c = loopback(4, "1GB/s", "100us")
    for size in (4, 1 << 20, 64 << 20):
        p = predict(c, "all_reduce", size, "ring")
        assert p.time == pytest.approx(6 * 100e-6 + 1.5 * size / 1e9)
    # a (double binary) tree: 2 log2(4) steps, 2S per link: crossover at (n-1-log2 n) n alpha/beta
    got = crossover(c, "all_reduce", "tree", "ring")
    assert got == pytest.approx((4 - 1 - math.log2(4)) * 4 * 100e-6 * 1e9, rel=1e-6)
    assert predict(loopback(1, "1GB/s", "1us"), "all_reduce", 1 << 20).time == 0.0


def test_every_collective_and_bad_input():
    c = preset("dgx-h100", 2)
    for coll in ("all_gather", "reduce_scatter", "all_to_all"):
        p = predict(c, coll, GiB)
        assert p.time > 0 and p.busbw > 0
    ag = predict(c, "all_gather", GiB, "ring", "Simple")
    ar = predict(c, "all_reduce", GiB, "ring", "Simple")
    assert ag.transfer == pytest.approx(ar.transfer / 2)
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        predict(c, "allreduce", GiB)
    with pytest.raises(ValueError, match="nbytes"):
        predict(c, "all_reduce", -1)
    with pytest.raises(ValueError, match="protocol 'LL256'"):
        predict(c, "all_reduce", GiB, protocol="LL256")


def test_the_published_checks_stay_within_what_the_docs_state():
    checks = published.validate()
    assert len(checks) == len(published.MEASUREMENTS) >= 10
    systems = {c.published.preset for c in checks}
    assert {"dgx-a100", "dgx-h100"} <= systems  # at least two systems
    for c in checks:
        assert c.published.source and c.prediction.time > 0
    s = published.summary(checks)
    # docs/benchmarks.md and lecture 04 quote these: independent large-message rows
    assert s["large"] >= 5
    assert s["large_mean_abs_error_pct"] < 15 and s["large_worst_abs_error_pct"] < 25
    text = published.table(checks)
    assert text.count("\n") == len(checks) + 1 and "(calibration)" in text


def test_ll128_follows_nccls_rule_nvlink_and_a_near_nic_not_nvlink_only():
    """NCCL's src/graph/tuning.cc: NVLink inside, GPU-NIC path <= PXB (<= PXN on Hopper)."""
    from ddtk.net.topology import ll128_enabled

    h100 = preset("dgx-h100", 4)
    assert ll128_enabled(h100) and ll128_enabled(preset("dgx-a100", 4))
    assert ll128_enabled(dataclasses.replace(h100, gpu_nic_path="PXN"))  # Hopper: PXN is enough
    assert not ll128_enabled(dataclasses.replace(h100, gpu_arch=80, gpu_nic_path="PXN"))
    assert not ll128_enabled(dataclasses.replace(h100, gpu_nic_path="PHB"))
    assert ll128_enabled(dataclasses.replace(h100, nodes=1, gpu_nic_path="SYS"))  # no network
    assert not ll128_enabled(preset("pcie-8gpu", 1))  # no NVLink: never
    assert not ll128_enabled(dataclasses.replace(h100, gpu_arch=89))  # Ada: not on NCCL's list
    assert ll128_enabled(dataclasses.replace(h100, gpu_arch=100))  # Blackwell: on it
    # A DGX H100 job across nodes: LL128 is a candidate, and the tuner's pick at medium sizes.
    p = predict(h100.with_nodes(16), "all_reduce", 16 << 20)
    assert p.protocol == "LL128", p
    ring = predict(h100, "all_reduce", 4 * GiB, "ring", "LL128")
    assert ring.link_times["nic"] == pytest.approx(2 * 31 / 32 * 4 * GiB / 8 / (50e9 * 0.96 * 0.92))
    with pytest.raises(ValueError, match="protocol 'LL128'"):
        predict(dataclasses.replace(h100, gpu_nic_path="SYS"), "all_reduce", GiB, protocol="LL128")


def test_efa_presets_run_simple_only_across_nodes():
    """aws-ofi-nccl sets NCCL_PROTO=simple where EFA cannot order 128-byte stores."""
    for name in ("aws-p4d", "aws-p5"):
        two = preset(name, 2)
        assert [p.name for p in two.enabled_protocols()] == ["Simple"]
        assert predict(two, "all_reduce", 1 << 20).protocol == "Simple"
        assert "LL128" in [p.name for p in preset(name, 1).enabled_protocols()]


def test_two_hierarchical_forms_and_the_default_choice_is_what_nccl_runs():
    from ddtk.net.predict import NCCL_ALGORITHMS

    c = preset("dgx-h100", 8)
    S = 256 << 20
    rs = predict(c, "all_reduce", S, "hierarchical_rs", "Simple")
    leader = predict(c, "all_reduce", S, "hierarchical", "Simple")
    # reduce-scatter form: every NIC carries 2(N-1)/N S / k; leader form: one NIC carries 2(N-1)/N S
    assert rs.link_times["nic"] == pytest.approx(2 * 7 / 8 * S / 8 / (50e9 * 0.96))
    assert leader.link_times["nic"] == pytest.approx(2 * 7 / 8 * S / (50e9 * 0.96))
    assert leader.time > rs.time
    for size in (8, 1 << 20, 64 << 20, 8 * GiB):
        for nodes in (1, 2, 16):
            assert predict(c.with_nodes(nodes), "all_reduce", size).algorithm in NCCL_ALGORITHMS


def test_costmodel_hierarchical_rs_terms():
    from ddtk.comm.costmodel import cost_terms

    steps, factor = cost_terms("hierarchical_rs", 8, 4)  # 2 groups of 4
    assert steps == 2 * 3 + 2 * 1
    assert factor == pytest.approx(2 * 3 / 4 + 2 * 1 / 2 / 4)
    assert cost_terms("hierarchical_rs", 8, 8) == cost_terms("ring", 8)  # one group: a ring
    assert cost_terms("hierarchical_rs", 1, 4) == (0.0, 0.0)
