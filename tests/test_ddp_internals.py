"""DDP internals observed on real ranks: buckets, flags and communication hooks."""

from __future__ import annotations

import pytest

from ddtk.frameworks import ddp_internals
from ddtk.models import build_model


def test_planned_buckets_are_reversed_and_capped() -> None:
    buckets = ddp_internals.planned_buckets([(100,), (100,), (300,)], cap_bytes=800)
    assert buckets == [[2], [0, 1]]  # last parameters first


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tour_on_two_ranks() -> None:
    out = ddp_internals.run_tour(world_size=2, bucket_cap_mb=0.02, steps=3)
    n_bytes = 4 * sum(p.numel() for p in build_model("resnet", seed=0).parameters())
    first, rebuilt = out["buckets"]["steps"]
    assert len(first) == 1 and first[0]["bytes"] == n_bytes  # one bucket before the rebuild
    assert len(rebuilt) > 1 and sum(b["bytes"] for b in rebuilt) == n_bytes
    assert rebuilt[0]["params"][0] == out["buckets"]["registration_order"][-1]  # reverse order
    flags = out["flags"]
    assert flags["gradient_as_bucket_view=True"][1] == 1
    assert flags["gradient_as_bucket_view=False"][1] > 1
    assert "find_unused_parameters" in flags["unused_without_flag"]
    assert flags["unused_grad_is_none"] and flags["static_graph_ok"]
    rows = {r["method"]: r for r in out["hooks"]["rows"]}
    assert rows["DDP hook: allreduce"]["bytes_per_step"] == n_bytes
    assert rows["DDP hook: fp16"]["bytes_per_step"] == n_bytes / 2
    assert rows["ddtk.compression: none"]["bytes_per_step"] == n_bytes
    assert rows["ddtk.compression: powersgd:2"]["bytes_per_step"] < n_bytes / 4
