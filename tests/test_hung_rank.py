"""ddtk.recovery.hung_rank: a rank that never reaches a collective, found from outside.

The live run is lecture 06's troubleshooting demo; it also pins the private
``_dump_fr_trace_json`` that the workers read their flight recorder through.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import psutil
import pytest

from ddtk.recovery.hung_rank import diagnose, main_frames, who_is_behind

DUMP = """Process 9325: python -u w.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 9325 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    train_step (w.py:14)
Thread 9341 (idle): "Thread-1 (dumper)"
    dumper (w.py:8)
"""


def _entry(seq: int, op: str = "gloo:all_reduce") -> dict:
    return {"collective_seq_id": seq, "profiling_name": op, "input_sizes": [[4]], "state": "scheduled"}


def test_main_frames_reads_only_the_main_thread_innermost_first() -> None:
    assert main_frames(DUMP) == ["all_reduce (torch/distributed/distributed_c10d.py:3252)",
                                 "train_step (w.py:14)"]  # fmt: skip
    assert main_frames("py-spy dump failed: Permission denied") == []


def test_who_is_behind_names_the_rank_with_fewer_collectives_and_the_one_awaited() -> None:
    three = [_entry(1), _entry(2), _entry(3, "gloo:broadcast")]
    assert who_is_behind({0: three, 1: three[:2], 2: three}) == (1, "gloo:broadcast")
    assert who_is_behind({0: three, 1: []}) == (1, "gloo:all_reduce")  # hung before the first
    assert who_is_behind({0: three, 1: three}) == (None, None)  # no rank behind: not this hang
    assert who_is_behind({}) == (None, None)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_diagnose_rejects_a_bad_hang_step_before_starting_anything(bad) -> None:
    with pytest.raises(ValueError, match="hang_step must be an integer >= 0"):
        diagnose(hang_step=bad)


@pytest.mark.timeout(180)
def test_diagnose_finds_rank_1_in_read_batch_and_behind_in_the_recorder_and_leaves_nothing() -> None:
    before = set(Path(tempfile.gettempdir()).glob("ddtk-hung-*"))
    report = diagnose(hang_step=2)
    rank0, rank1 = (main_frames(report.stacks[r]) for r in (0, 1))
    assert rank0 and rank0[0].startswith("all_reduce ("), report.stacks[0]
    assert any(f.startswith("train_step (") for f in rank0), rank0
    assert rank1 and rank1[0].startswith("read_batch ("), report.stacks[1]
    assert report.issued() == {0: 3, 1: 2}
    assert [e["collective_seq_id"] for e in report.recorder[0]] == [1, 2, 3]
    assert {e["profiling_name"] for e in report.recorder[0]} == {"gloo:all_reduce"}
    assert (report.behind, report.waiting_in) == (1, "gloo:all_reduce")
    left = [p for p in psutil.process_iter(["cmdline"]) if "ddtk.recovery.hung_rank" in " ".join(p.info["cmdline"] or [])]
    assert not left, left
    assert set(Path(tempfile.gettempdir()).glob("ddtk-hung-*")) == before


def test_a_job_that_ends_before_hanging_fails_at_once_with_its_output(monkeypatch) -> None:
    import sys
    import time

    import ddtk.frameworks.launchers as launchers

    crash = [sys.executable, "-c", "print('rendezvous failed: no such host'); raise SystemExit(3)"]
    monkeypatch.setattr(launchers, "torchrun_command", lambda *a, **k: crash)
    t = time.monotonic()
    with pytest.raises(RuntimeError, match=r"ended \(exit status 3\) before its hang:\n.*no such host"):
        diagnose(limit_s=60)
    assert time.monotonic() - t < 15
