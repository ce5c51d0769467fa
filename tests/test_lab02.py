"""Lab 02 (Horovod): every check fails on its stub and passes on the solution; its helpers.

The first test proves it with :func:`ddtk.course.labverify.verify_lab_checks`: the
solution's whole run, each check tried on its own on the stub and on the answer, and the
stub's whole run for the checks that need the cells before them; then no Horovod
launcher, rank or torchrun may be left. Both whole runs are those of lab 02's graded
class (``tests/test_course_grade.py``, which uses :func:`assert_no_horovod_left` from
here), with its parameters: four Horovod ranks over two host names and other epochs and
process counts, as a cluster run would change them. One run of the lab serves both tests.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
from support import assert_none_left

from ddtk.course import catalog
from ddtk.course.labverify import verify_lab_checks

pytestmark = [pytest.mark.notebook, pytest.mark.horovod, pytest.mark.slow]
EXERCISES = 9
MARKERS = ("horovod", "ddtk.examples.cnn_", "torchrun", "lab02-")


def horovod_processes(since: float) -> list[psutil.Process]:
    """Live processes started since ``since`` that run Horovod, a recipe or torchrun.

    Counts this process's descendants and orphans (adopted by init once their launcher
    died); a Horovod job that another program on the machine runs is not ours.
    """
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    found = []
    for proc in psutil.process_iter(["pid", "ppid", "cmdline", "create_time"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            ours = proc.info["pid"] in mine or proc.info["ppid"] == 1
            if (
                ours
                and proc.info["create_time"] >= since - 1.0
                and proc.status() != psutil.STATUS_ZOMBIE
                and any(m in cmd for m in MARKERS)
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_no_horovod_left(since: float, grace: float = 20.0) -> None:
    """Fail, and kill them, if Horovod processes started since ``since`` outlive ``grace``."""
    assert_none_left(horovod_processes, since, grace, "Horovod")


def test_every_check_fails_on_the_stub_and_passes_on_the_solution(
    horovodrun: Path, execution_cache
) -> None:
    from test_course_grade import REAL_LABS

    since = time.time()
    nb = catalog.find("lab02").file
    # Both whole runs are the graded class's, with its parameters (4 ranks on two hosts):
    # whichever test comes first executes them and the other reads them back, so the lab
    # runs once in the suite.
    parameters = REAL_LABS["lab02"][1]
    report = verify_lab_checks(
        nb, parameters, cache=execution_cache, stub=nb.parents[1] / "labs" / nb.name,
    )  # fmt: skip
    assert_no_horovod_left(since)
    assert report.ok, report.describe()
    assert len(report.outcomes) == EXERCISES, report.describe()
    for number, outcome in enumerate(report.outcomes, start=1):
        assert outcome.stub_error.startswith(f"CheckFailed: Exercise {number} ("), outcome
        # Exercise 9's stub keeps the template text: its check names the blanks left.
        expected = "is not done yet" if number < EXERCISES else "blanks left"
        assert expected in outcome.stub_error, outcome
    assert "lab02-report.json" in report.solution_run.handin
    print(f"\n{report.describe()}")
