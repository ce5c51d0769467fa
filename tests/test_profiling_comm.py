"""The communication-bound job is diagnosed as communication-bound (``ddtk.profiling``).

The job (``JOBS["comm-bound"]``: 7.5 million parameters, 8 samples per rank, one 30 MB
all-reduce per step) is communication-bound by its shares of the step, and shares are
time. Beside another test worker on two cores, the rank slowed by the neighbour was named
a straggler, and its exposed transfer fell under the 20 % threshold, so the diagnosis
read "straggler, optimizer" and no communication. This module is an exclusive group
(tests/scheduling.py): it runs alone, as a measurement should.
"""

from __future__ import annotations

import pytest

from ddtk.profiling import analyse, run_job
from ddtk.profiling.jobs import job_config

pytestmark = pytest.mark.distributed


def test_large_all_reduce_is_communication_bound(tmp_path):
    result = run_job(job_config("comm-bound"), 2, tmp_path)
    a = analyse(result.trace_dir)
    for r in a.breakdown.rows:
        assert r.comm_bytes == 4 * result.params and r.collectives == result.buckets
    # A rank that reaches the all-reduce first can still slow the other on two cores, which
    # the analysis then rightly calls a straggler; the transfer shows either way, on every
    # rank or on the straggler that waits for nobody.
    assert "communication" in {f.kind for f in a.findings}, a.findings
    assert all(row["comm_total_ms"] > 0.2 * row["step_ms"] for row in a.breakdown.per_rank())
