"""Reading NCCL_DEBUG=INFO logs: the transport as exercise 1 of lecture 4 names it, and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtk.net.nccl_log import parse

DATA = Path(__file__).resolve().parent / "data" / "rdma"


def _sample(name: str) -> dict:
    return parse((DATA / name).read_text())


def test_the_three_samples() -> None:
    gdr, no_gdr, socket = (
        _sample(f"nccl_debug-{n}.txt") for n in ("ib-gdr", "ib-no-gdr", "socket")
    )
    assert (gdr["transport"], gdr["network"], gdr["net_channels"]) == (
        "IB+GDR",
        "IB",
        {"IB+GDR": 2},
    )
    assert (
        gdr["ib_devices"][:2] == [("mlx5_0", 1, "IB"), ("mlx5_1", 1, "IB")]
        and len(gdr["ib_devices"]) == 8
    )
    assert gdr["gdr_enabled"] == ["HCA 0 'mlx5_0'"] and (gdr["nranks"], gdr["nnodes"]) == (32, 4)
    assert (no_gdr["transport"], no_gdr["gdr_disabled"]) == ("IB", ["no module"])
    assert (socket["transport"], socket["no_ib_device"], socket["ib_devices"]) == (
        "Socket",
        True,
        [],
    )


def test_the_logs_of_section_1_4_read_as_exercise_1_reads_them() -> None:
    issue_1412 = ("swat1-04:2017630:2017699 [5] NCCL INFO Channel 03/0 : 5[5] -> 12[4] [send] via NET/IB/3\n"
                  "swat1-04:2017630:2017697 [7] NCCL INFO Channel 00/0 : 7[7] -> 6[6] via P2P/direct pointer/read\n")  # fmt: skip
    assert parse(issue_1412)["transport"] == "IB"
    one_node = ("n:1:1 [0] NCCL INFO Using network IB\n"
                "n:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0\n")  # fmt: skip
    assert parse(one_node)["transport"] == "none"  # IB loaded, but no channel leaves the node
    disabled = "n:1:1 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.\nn:1:1 [0] NCCL INFO Using network Socket\n"
    assert (parse(disabled)["transport"], parse(disabled)["ib_disabled"]) == ("Socket", True)


def test_reasons_warnings_and_roce_devices() -> None:
    log = parse(
        "h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>\n"
        "h:1:2 [3] NCCL INFO NET/IB : GPU Direct RDMA Disabled for GPU 3 / HCA 1 (distance 7 > 5)\n"
        "h:1:2 [0] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory\n"
        "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/1\n"
    )
    assert log["ib_devices"] == [("mlx5_0", 1, "RoCE"), ("mlx5_1", 1, "RoCE")]
    assert log["gdr_disabled"] == ["distance 7 > 5"] and log["transport"] == "IB"
    assert log["warnings"] == ["Call to ibv_reg_mr failed with error Cannot allocate memory"]


def test_an_infiniband_net_plugin_counts_as_ib() -> None:
    """HPC-X's SHARP plugin replaces NCCL's own IB transport and names itself in the channels."""
    plugin = ("h:1:2 [0] NCCL INFO Using network IBext_v8\n"
              "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/0/GDRDMA\n"
              "h:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/1\n")  # fmt: skip
    log = parse(plugin)
    assert (log["network"], log["net_channels"]) == ("IBext_v8", {"IB+GDR": 1, "IB": 1})
    assert log["transport"] == "IB+GDR"
    assert parse(plugin.replace("/0/GDRDMA", "/0"))["transport"] == "IB"


def test_a_text_without_nccl_lines_is_refused() -> None:
    with pytest.raises(ValueError, match="NCCL_DEBUG=INFO"):
        parse("Traceback (most recent call last):\n  RuntimeError: boom\n")
