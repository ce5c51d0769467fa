"""Lecture 04's troubleshooting section quotes gloo's error text live: pin it, so an upgrade shows."""

from __future__ import annotations

import pytest

from ddtk.net import troubleshoot

pytestmark = pytest.mark.distributed


def test_a_wrong_interface_name_is_refused_by_gloo_with_this_text() -> None:
    rows = troubleshoot.wrong_interface("nosuchif0")
    assert [r["rank"] for r in rows] == [0, 1]
    for r in rows:
        assert "Unable to find address for: nosuchif0" in r["error"], r
        assert r["entered"] == []


def test_the_hung_rank_is_the_one_behind_and_the_healthy_one_reports_the_timeout() -> None:
    rows = troubleshoot.hung_rank(timeout_s=1.0)
    assert [r["rank"] for r in rows] == [0, 1]
    assert "Timed out waiting 1000ms for recv operation to complete" in rows[0]["error"]
    assert rows[0]["entered"] == ["all_reduce #1", "all_reduce #2"]
    assert rows[1]["error"] is None and rows[1]["entered"] == ["all_reduce #1"]
