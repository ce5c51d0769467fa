"""Lecture 03's recipe, its error reproductions and its DDP bucket figure's model."""

import math

import pytest

from ddtk.frameworks import failures, recipe_runs
from ddtk.viz.diagrams.ddp import _resnet_shapes, bucket_timeline


def test_json_lines_strip_launcher_prefixes() -> None:
    lines = ['[1]<stdout>:{"a": 1}', '[rank0]: {"b": 2}', "{not json}", "plain"]
    assert recipe_runs.json_lines(lines) == [{"a": 1}, {"b": 2}]


def test_error_line_takes_the_last_exception_without_rank_prefix() -> None:
    out = "Traceback...\n[rank0]: RuntimeError: first\n[rank0]: ValueError: the one"
    assert failures.error_line(out) == "ValueError: the one"


def test_bucket_timeline_overlaps_and_covers_every_gradient() -> None:
    shapes = _resnet_shapes()
    many = bucket_timeline(shapes, bucket_cap_mb=0.02)
    one = bucket_timeline(shapes, bucket_cap_mb=1e6)
    n_bytes = 4 * sum(math.prod(s) for _, s in shapes)
    assert sum(many.bucket_bytes) == sum(one.bucket_bytes) == n_bytes
    assert len(many.comm_spans) > 1 and len(one.comm_spans) == 1
    assert many.comm_spans[0][0] < many.backward_end  # the first all-reduce starts during backward
    assert many.exposed < one.exposed
    assert many.names[0] == shapes[-1][0]  # the last layer's gradient arrives first


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ddp_features_recipe_on_two_ranks() -> None:
    rows = recipe_runs.run_ddp_features(world_size=2, args=["--steps", "3", "--uneven", "1"])
    assert [r["rank"] for r in rows] == [0, 1]
    assert [r["optimizer_steps"] for r in rows] == [3, 2]  # uneven shards, joined
    assert (
        rows[0]["bucket_all_reduces"] == rows[1]["bucket_all_reduces"]
    )  # the joined rank shadowed
    assert all(r["max_weight_difference_to_other_ranks"] == 0.0 for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_reproduced_errors_are_the_tools_own() -> None:
    errors = failures.reproduce_all(timeout=90)
    assert "Horovod has not been initialized" in errors["horovod_not_initialized"]
    assert "Detected mismatch between collectives" in errors["mismatched_collectives"]
    assert "SyncBatchNorm layers only work with GPU modules" in errors["sync_batchnorm_on_cpu"]
