"""Reading ib_write_bw: both units (Gb/sec and perftest's 2**20-byte MB/sec), the header, failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtk.net.perftest import largest, parse, to_gbps

DATA = Path(__file__).resolve().parent / "data" / "rdma"


def test_the_infiniband_sample_in_gbits() -> None:
    got = parse((DATA / "ib_write_bw-ib-hdr.txt").read_text())
    assert (got["test"], got["device"], got["link_type"], got["mtu"], got["gid_index"], got["units"]) == (
        "RDMA_Write BW Test", "mlx5_0", "IB", 4096, None, "Gb/sec"
    )  # fmt: skip
    row = largest(got)
    assert (row["bytes"], row["iterations"], row["bw_average_gbps"], row["bw_peak_gbps"]) == (
        65536,
        5000,
        196.43,
        196.62,
    )
    assert got["errors"] == []


def test_the_roce_sample_in_perftest_megabytes() -> None:
    got = parse((DATA / "ib_write_bw-roce-slow.txt").read_text())
    assert (got["link_type"], got["mtu"], got["gid_index"], got["units"]) == (
        "Ethernet",
        1024,
        3,
        "MB/sec",
    )
    # 11020.41 MB/sec x 2**20 bytes x 8 bits = 92.45 Gb/s, not 88.16 (10**6 bytes)
    assert largest(got)["bw_average_gbps"] == pytest.approx(11020.41 * 2**20 * 8 / 1e9)
    assert largest(got)["bw_average_gbps"] == pytest.approx(92.446, abs=1e-3)


def test_a_copy_with_tabs_turned_into_spaces_reads_the_same() -> None:
    for name in ("ib_write_bw-roce-slow.txt", "ib_write_bw-ib-hdr.txt"):
        text = (DATA / name).read_text()
        assert "\t" in text
        assert parse(text.expandtabs(8)) == parse(text) == parse(text.replace("\t", "  ")), name


def test_several_sizes_failures_and_bad_input() -> None:
    header = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
    rows = " 2          5000           0.12               0.11\t\t   6.9\n 8388608    5000           390.1              389.7\t\t   0.005807\n"
    assert largest(parse(header + rows))["bytes"] == 8388608
    failed = parse(
        "                    RDMA_Write BW Test\nCouldn't allocate MR\n Failed to create QP.\n"
    )
    assert failed["rows"] == [] and failed["errors"] == [
        "Couldn't allocate MR",
        "Failed to create QP.",
    ]
    assert largest(failed) is None
    with pytest.raises(ValueError, match="not perftest output"):
        parse("PING 10.0.0.2 56(84) bytes of data.\n")
    with pytest.raises(ValueError, match="unknown perftest units"):
        to_gbps(1.0, "GB/sec")
