"""Reading ibv_devinfo: ports, states, MTUs and link layers of the samples; GIDs; bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtk.net.ibv_devinfo import is_active, parse

DATA = Path(__file__).resolve().parent / "data" / "rdma"
# An excerpt of `ibv_devinfo -v -d mlx5_0` in rdma-core's format (composed, values illustrative):
# device attributes before the port, then the port's GID table.
VERBOSE = """\
hca_id:\tmlx5_0
\ttransport:\t\t\tInfiniBand (0)
\tmax_mr_size:\t\t\t0xffffffffffffffff
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t4096 (5)
\t\t\tsm_lid:\t\t\t0
\t\t\tport_lid:\t\t0
\t\t\tlink_layer:\t\tEthernet
\t\t\tGID[  0]:\t\tfe80:0000:0000:0000:a288:c2ff:fe51:7e20, RoCE v1
\t\t\tGID[  1]:\t\tfe80::a288:c2ff:fe51:7e20, RoCE v2
\t\t\tGID[  3]:\t\t::ffff:10.1.0.11, RoCE v2
"""


def test_the_healthy_infiniband_sample() -> None:
    ports = parse((DATA / "ibv_devinfo-ib-hdr.txt").read_text())
    assert [f"{p['device']}:{p['port']}" for p in ports] == [f"mlx5_{i}:1" for i in range(8)]
    assert {(p["state"], p["link_layer"], p["active_mtu"], p["max_mtu"]) for p in ports} == {
        ("PORT_ACTIVE", "InfiniBand", 4096, 4096)
    }
    assert [p["port_lid"] for p in ports] == list(range(17, 25)) and all(
        p["sm_lid"] == 1 for p in ports
    )
    assert ports[0]["vendor_part_id"] == "4123" and ports[0]["fw_ver"] == "20.39.1002"
    assert all(is_active(p) for p in ports)


def test_the_misconfigured_roce_sample() -> None:
    ports = parse((DATA / "ibv_devinfo-roce-misconfigured.txt").read_text())
    assert [(p["device"], p["state"], p["active_mtu"], p["link_layer"]) for p in ports] == [
        ("mlx5_0", "PORT_ACTIVE", 1024, "Ethernet"),
        ("mlx5_1", "PORT_DOWN", 1024, "Ethernet"),
    ]
    assert [is_active(p) for p in ports] == [True, False]
    assert ports[0]["port_lid"] == 0  # LIDs are zero on RoCE


def test_verbose_output_keeps_the_gid_table() -> None:
    (port,) = parse("libibverbs: Warning: couldn't load driver 'libfoo-rdmav34.so'\n" + VERBOSE)
    assert port["gids"] == [(0, "fe80:0000:0000:0000:a288:c2ff:fe51:7e20", "RoCE v1"),
                            (1, "fe80::a288:c2ff:fe51:7e20", "RoCE v2"), (3, "::ffff:10.1.0.11", "RoCE v2")]  # fmt: skip
    assert port["link_layer"] == "Ethernet" and "max_mr_size" not in port


def test_no_device_and_bad_input() -> None:
    assert parse("No IB devices found\n") == []
    with pytest.raises(ValueError, match="not ibv_devinfo output"):
        parse("ibstat: command not found\n")
    with pytest.raises(ValueError, match="on stderr"):
        parse(" \n")  # stdout alone of a host without devices
    with pytest.raises(ValueError, match="has no state"):
        parse(
            "hca_id:\tmlx5_0\n\t\tport:\t1\n\t\t\tactive_mtu:\t\t4096 (5)\n\t\t\tlink_layer:\t\tInfiniBand\n"
        )
    with pytest.raises(ValueError, match="active_mtu is not a number"):
        parse(VERBOSE.replace("active_mtu:\t\t4096 (5)", "active_mtu:\t\tUNKNOWN"))
    with pytest.raises(TypeError):
        parse(b"hca_id: mlx5_0")  # type: ignore[arg-type]
