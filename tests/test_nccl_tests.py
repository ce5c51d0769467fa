"""Reading nccl-tests output: the row formats of real logs, and busbw recomputed from time."""

from __future__ import annotations

import pytest

from ddtk.net.nccl_tests import check, parse

# Rows as they appear in published logs (see ddtk.net.published for their sources).
MPIRUN = """\
# nThread 1 nGpus 8 minBytes 8 maxBytes 4294967296 step: 2(factor) warmup iters: 5 iters: 20
#  Rank  0 Group  0 Pid  54740 on     thanos device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid  54740 on     thanos device  1 [0x0a] NVIDIA A100-SXM4-80GB
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
           8             2     float     sum      -1    40.12    0.00    0.00      0    38.85    0.00    0.00      0
  4294967296    1073741824     float     sum      -1    32336  132.82  232.44      0    32455  132.34  231.59      0
# Avg bus bandwidth    : 66.2058
"""
PREFIXED = """\
0:  17179869184    4294967296     float     sum      -1    66132  259.78  487.09      0    66109  259.87  487.26      0
   [1,0]<stdout>:  1073741824     268435456     float     sum      -1   6426.3  167.09  313.29      0   6426.1  167.09  313.29      0
"""
NO_ROOT = " p4dn 1073741824     268435456     float     sum   8142.6  131.87  230.77  2e-07   8141.2  131.89  230.81  2e-07\n"


def test_rows_devices_and_every_prefix_are_read():
    got = parse(MPIRUN)
    assert [d["name"] for d in got["devices"]] == ["NVIDIA A100-SXM4-80GB"] * 2
    assert [r["size"] for r in got["rows"]] == [8, 4294967296]
    big = got["rows"][1]
    assert (big["time_us"], big["algbw"], big["busbw"], big["inplace_busbw"]) == (
        32336,
        132.82,
        232.44,
        231.59,
    )
    prefixed = parse(PREFIXED)["rows"]
    assert [r["busbw"] for r in prefixed] == [487.09, 313.29]
    assert parse(NO_ROOT)["rows"] == []  # a label before the size is not a result row
    assert parse(NO_ROOT.replace(" p4dn", ""))["rows"][0]["busbw"] == 230.77


def test_busbw_recomputed_from_time_matches_the_printed_columns():
    rows = check(parse(MPIRUN)["rows"], ranks=8)
    big = rows[1]
    assert big["algbw_calc"] == pytest.approx(big["algbw"], rel=1e-3)
    assert big["busbw_calc"] == pytest.approx(big["busbw"], rel=1e-3)  # x 2 * 7 / 8
    p5 = check(parse(PREFIXED)["rows"][:1], ranks=16)[0]
    assert p5["busbw_calc"] == pytest.approx(487.09, rel=1e-3)
    with pytest.raises(ValueError, match="unknown collective"):
        check(rows, 8, "allreduce")
