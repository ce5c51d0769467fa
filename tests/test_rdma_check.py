"""diagnose_rdma on the samples: the healthy cluster passes, each fault is named with its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtk.net import nccl_log
from ddtk.net.rdma_check import FIXES, diagnose_rdma, link_findings, nccl_findings, port_findings

DATA = Path(__file__).resolve().parent / "data" / "rdma"


def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_the_healthy_infiniband_cluster_has_no_finding() -> None:
    found = diagnose_rdma(ibv_devinfo_text=_read("ibv_devinfo-ib-hdr.txt"), ib_write_bw_text=_read("ib_write_bw-ib-hdr.txt"),
                          nccl_tests_text=_read("all_reduce_perf-ib-4nodes.txt"), nccl_log_text=_read("nccl_debug-ib-gdr.txt"),
                          line_rate_gbps=200, nics_per_node=8)  # fmt: skip
    assert found == []


def test_the_misconfigured_roce_cluster_names_each_fault_bottom_up() -> None:
    found = diagnose_rdma(ibv_devinfo_text=_read("ibv_devinfo-roce-misconfigured.txt"),
                          ib_write_bw_text=_read("ib_write_bw-roce-slow.txt"),
                          nccl_tests_text=_read("all_reduce_perf-socket-2nodes.txt"),
                          nccl_log_text=_read("nccl_debug-socket.txt"), line_rate_gbps=400, nics_per_node=2)  # fmt: skip
    assert [(f.where, f.key) for f in found] == [
        ("mlx5_0:1", "jumbo frames"), ("mlx5_1:1", "cable"), ("ib_write_bw", "link rate"),
        ("nccl-tests", "busbw"), ("nccl", "expose the HCA"),
    ]  # fmt: skip
    assert "23% of the 400 Gb/s line rate" in found[2].problem
    assert found[3].problem == "busbw 2.6 GB/s on 2 nodes is 3% of 2 x 400 Gb/s = 100 GB/s"
    assert "9000" in found[0].fix and all(f.fix == FIXES[f.key] for f in found)


def test_the_same_outputs_judged_against_the_right_rate() -> None:
    """A 92 Gb/s link is a fault at 400 Gb/s and healthy at 100 Gb/s; one node tests NVLink only."""
    slow = _read("ib_write_bw-roce-slow.txt")
    assert diagnose_rdma(ib_write_bw_text=slow, line_rate_gbps=100) == []
    assert [f.key for f in diagnose_rdma(ib_write_bw_text=slow, line_rate_gbps=400)] == [
        "link rate"
    ]
    one_node = "".join(line for line in _read("all_reduce_perf-ib-4nodes.txt").splitlines(keepends=True)
                       if "on   node01" in line or not line.startswith("#  Rank"))  # fmt: skip
    assert diagnose_rdma(nccl_tests_text=one_node, line_rate_gbps=400, nics_per_node=64) == []
    assert [f.key for f in diagnose_rdma(nccl_tests_text=_read("all_reduce_perf-ib-4nodes.txt"),
                                         line_rate_gbps=400, nics_per_node=8)] == ["busbw"]  # fmt: skip


def test_the_cause_picks_the_fix() -> None:
    assert [f.key for f in nccl_findings(nccl_log.parse(_read("nccl_debug-ib-no-gdr.txt")))] == [
        "peer memory"
    ]
    far = nccl_log.parse("h:1:2 [0] NCCL INFO GPU Direct RDMA Disabled for GPU 0 / HCA 0 (distance 7 >= 5)\n"
                         "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0\n")  # fmt: skip
    assert [f.key for f in nccl_findings(far)] == ["PCIe path"]
    ports = [{"device": "mlx5_2", "port": 1, "state": s, "link_layer": "InfiniBand", "active_mtu": 2048}
             for s in ("PORT_INIT", "PORT_ARMED", "PORT_DOWN", "PORT_ACTIVE")]  # fmt: skip
    assert [f.key for f in port_findings(ports)] == ["subnet manager", "subnet manager", "cable"]
    assert [f.key for f in port_findings([])] == ["no device"]
    assert link_findings(None, 200) == [] and link_findings(160, 200) == []
    with pytest.raises(ValueError, match="line_rate_gbps"):
        link_findings(10, 0)


def test_a_failed_ib_write_bw_is_a_finding_too() -> None:
    memlock = diagnose_rdma(
        ib_write_bw_text="RDMA_Write BW Test\nCouldn't allocate MR\n", line_rate_gbps=200
    )
    refused = diagnose_rdma(
        ib_write_bw_text=" Failed to modify QP 1234 to RTR\n", line_rate_gbps=200
    )
    assert [(f.where, f.key) for f in memlock + refused] == [
        ("ib_write_bw", "memlock"),
        ("ib_write_bw", "no result"),
    ]


def test_lecture_4s_judge_names_the_rule_a_wrong_answer_breaks() -> None:
    """Exercise 6's judge explains the first pair that differs with the rule of ``rdma_check``."""
    from ddtk.course.judges.lecture04 import why_fixes_differ
    from ddtk.net import ibv_devinfo

    ports = ibv_devinfo.parse(_read("ibv_devinfo-roce-misconfigured.txt"))
    socket = nccl_log.parse(_read("nccl_debug-socket.txt"))
    want = [("mlx5_0:1", "jumbo frames"), ("mlx5_1:1", "cable"), ("nccl", "expose the HCA")]
    assert why_fixes_differ(ports, 390.0, 400, socket, want, want) == ""
    assert "is PORT_DOWN: no physical link" in why_fixes_differ(ports, 390.0, 400, socket, want, want[::2])
    assert "wrong order" in why_fixes_differ(ports, 390.0, 400, socket, want, want[::-1])
    assert "97.5% of the 400 Gb/s line rate" in why_fixes_differ(
        ports, 390.0, 400, socket, want, [*want[:2], ("ib_write_bw", "link rate"), want[2]]
    )
    assert "without NCCL_IB_DISABLE: 'expose the HCA'" in why_fixes_differ(
        ports, 390.0, 400, socket, want, [*want[:2], ("nccl", "NCCL_IB_DISABLE")]
    )
    assert "list of (where, fix) pairs" in why_fixes_differ(ports, None, 400, socket, want, None)
