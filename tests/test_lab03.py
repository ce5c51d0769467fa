"""Lab 03 (fault tolerance): every check fails on its stub and passes on the solution.

:func:`ddtk.course.labverify.verify_lab_checks` proves it from the solution's whole run
at its laptop defaults, each check tried on its own on the stub and on the answer, and
the stub's whole run for the checks that need the cells before them. Both whole runs
are those of lab 03's graded class (``tests/test_course_grade.py``), shared through the
session's execution cache. The solution's run is the real one: part 1
SIGKILLs a training process three times and sends another a SIGTERM and a SIGUSR1
notice, part 3 removes a Ray node, adds one back
and kills a worker while an elastic ``TorchTrainer`` trains. Afterwards no raylet or
GCS server of the run may be left, and the hand-in report must hold what the lab
measured: three faults, each restart resumed from the last commit, no violation of
the consistency checks, and a run whose world size really changed.
"""

from __future__ import annotations

import json
import time

import pytest
from support import assert_no_ray_daemons_left, import_or_require

from ddtk.course import catalog
from ddtk.course.labverify import verify_lab_checks

pytestmark = [pytest.mark.notebook, pytest.mark.ray, pytest.mark.slow]
EXERCISES = 8


@pytest.fixture(autouse=True)
def _ray() -> None:
    import_or_require("ray", "ray")


def test_every_check_fails_on_the_stub_and_passes_on_the_solution(execution_cache) -> None:
    since = time.time()
    nb = catalog.find("lab03").file
    report = verify_lab_checks(nb, cache=execution_cache, stub=nb.parents[1] / "labs" / nb.name)
    assert_no_ray_daemons_left(since)
    assert report.ok, report.describe()
    assert len(report.outcomes) == EXERCISES, report.describe()
    for number, outcome in enumerate(report.outcomes, start=1):
        assert outcome.stub_error.startswith(f"CheckFailed: Exercise {number} ("), outcome
        assert "is not done yet" in outcome.stub_error, outcome

    handin = report.solution_run.handin
    handed_in = json.loads(handin["lab03-report.json"])
    part1 = handed_in["part1"]
    assert part1["kills"] == 3 and part1["bitwise_equal"] is True
    assert part1["young_s"] > 0 and part1["save_ms"] > 0
    notices = part1["notices"]  # two real notices, each committed and exited within the grace period
    assert [n["signal"] for n in notices] == ["SIGTERM", "SIGUSR1"], notices
    for n in notices:
        assert n["exit status"] == 0 and 0 <= n["to commit (ms)"] <= n["to exit (ms)"] < n["grace (s)"] * 1e3
    assert notices[0]["committed step"] < notices[1]["committed step"]
    faults = {row["fault"]: row for row in handed_in["part3"]["faults"]}
    assert list(faults) == ["node removed", "node added", "worker killed"]
    assert (faults["node removed"]["world_before"], faults["node removed"]["world_after"]) == (2, 1)
    assert (faults["node added"]["world_before"], faults["node added"]["world_after"]) == (1, 2)
    assert (faults["worker killed"]["world_before"], faults["worker killed"]["world_after"]) == (
        2,
        2,
    )
    for row in faults.values():
        assert row["steps_lost"] >= 0, row
        assert row["recovery_s"] >= row["restart_s"] > 0, row
    part4 = handed_in["part4"]
    assert set(part4["violations"].values()) == {0}, part4
    assert set(part4["schedule_counts"]) == {"1", "2"}, part4
    assert all(part4["planted_faults_caught"].values()), part4
    assert part4["max_diff_same_schedule"] == 0.0 and part4["max_diff_fixed_world"] > 0.0
    assert handin["lab03-report.md"].decode().startswith("# Lab 03 report")
    print(f"\n{report.describe()}\n{handin['lab03-report.md'].decode()}")
