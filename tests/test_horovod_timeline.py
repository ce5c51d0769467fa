"""Horovod timeline parsing and the fusion/cycle sweep, on a real ``horovodrun`` job."""

from __future__ import annotations

import json

import matplotlib
import pytest

from ddtk.frameworks import horovod_knobs, horovod_timeline

matplotlib.use("Agg")

UNTERMINATED = """[
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.a"}},
{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "allreduce.b"}},
{"name": "process_name", "ph": "M", "pid": 3, "args": {"name": "allreduce.c"}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 0, "pid": 1},{"ph": "X", "name": "0", "ts": 0, "pid": 1, "dur": 0},
{"ph": "E", "ts": 10, "pid": 1},{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 2, "pid": 2},{"ph": "E", "ts": 10, "pid": 2},
{"ph": "B", "name": "ALLREDUCE", "ts": 11, "pid": 1},{"ph": "B", "name": "ALLREDUCE", "ts": 12, "pid": 2},
{"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 12, "pid": 1},{"ph": "E", "ts": 14, "pid": 1},
{"ph": "E", "ts": 30, "pid": 1},{"ph": "E", "ts": 31, "pid": 2},
{"ph": "B", "name": "ALLREDUCE", "ts": 40, "pid": 3},{"ph": "E", "ts": 50, "pid": 3},
{"ph": "B", "name": "ALLREDUCE", "ts": 60, "pid": 3},{"ph": "B", "name": "GLOO_ALL"""


def test_unterminated_file_is_repaired_and_open_phases_dropped() -> None:
    tl = horovod_timeline.parse_timeline(UNTERMINATED)
    assert tl.unclosed == 1  # the last ALLREDUCE never closed; the cut GLOO event is dropped
    top = [(i.tensor, i.phase) for i in tl.intervals if i.depth == 0]
    assert ("allreduce.a", "NEGOTIATE_ALLREDUCE") in top
    nested = [i for i in tl.intervals if i.depth == 1]
    assert [(i.phase, i.duration_us) for i in nested] == [("MEMCPY_IN_FUSION_BUFFER", 2.0)]
    assert tl.markers["allreduce.a"] == [("0", 0.0)]


def test_fused_groups_are_overlapping_operations() -> None:
    groups = horovod_timeline.fused_groups(horovod_timeline.parse_timeline(UNTERMINATED))
    assert [sorted(g.tensors) for g in groups] == [["allreduce.a", "allreduce.b"], ["allreduce.c"]]
    summary = horovod_timeline.phase_summary(horovod_timeline.parse_timeline(UNTERMINATED))
    assert summary["ALLREDUCE"]["count"] == 3
    assert summary["ALLREDUCE"]["total_us"] == pytest.approx(19 + 19 + 10)


def test_plot_has_units() -> None:
    fig = horovod_timeline.plot_timeline(horovod_timeline.parse_timeline(UNTERMINATED), title="t")
    assert "(ms)" in fig.axes[0].get_xlabel()


def test_job_plan_keeps_explicit_fusion_to_one_init() -> None:
    assert horovod_knobs.job_plan([None, 0, 1024], [5.0, 1.0]) == [
        (None, [5.0, 1.0]), (0, [5.0]), (1024, [5.0])
    ]


@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sweep_on_two_ranks_counts_responses(horovodrun, tmp_path, own_tempdir) -> None:
    rows = horovod_knobs.run_sweep(
        cycles=[5.0, 1.0], fusions=[None, 0], steps=5, trace_dir=tmp_path, echo=False, layers=4
    )
    assert not list(own_tempdir.glob("hvd-knobs-*"))  # the jobs' result folder is removed
    assert [(r["fusion_threshold"], r["cycle_time_ms"]) for r in rows] == [
        (horovod_knobs.DEFAULT_FUSION_BYTES, 5.0), (horovod_knobs.DEFAULT_FUSION_BYTES, 1.0), (0, 5.0)
    ]
    assert all(r["ms_per_step"] > 0 and r["world_size"] == 2 for r in rows)
    # fusion off: every one of the 8 gradient tensors is its own response
    assert rows[2]["responses_per_step"] == pytest.approx(8.0)
    assert rows[2]["max_tensors_per_response"] == 1
    assert rows[0]["responses_per_step"] <= 8.0
    tl = horovod_timeline.load_timeline(tmp_path / "timeline_fdefault.json")
    assert len([t for t in tl.tensors if "sync." not in t]) == 8
    json.dumps(rows)
