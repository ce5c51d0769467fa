"""Lab 01 (Ray Train): every check fails on its stub and passes on the solution.

:func:`ddtk.course.labverify.verify_lab_checks` proves it from the solution's whole
run, each check tried on its own on the stub and on the answer, and the stub's whole
run for the checks that need the cells before them; then no raylet or GCS server may
be left. Both whole runs are those of lab 01's graded class (``tests/test_course_grade.py``),
with its parameters: three Ray Train workers and other epochs, as a cluster run would
change them. One run of the lab serves both tests (``build/executed``): a lab 01 run
takes minutes of the suite's longest worker, the one that runs everything that starts Ray.
"""

from __future__ import annotations

import time

import pytest
from support import assert_no_ray_daemons_left, import_or_require

from ddtk.course import catalog
from ddtk.course.labverify import verify_lab_checks

pytestmark = [pytest.mark.notebook, pytest.mark.ray, pytest.mark.slow]
EXERCISES = 7


@pytest.fixture(autouse=True)
def _ray() -> None:
    from test_course_grade import require_prometheus

    import_or_require("ray", "ray")
    require_prometheus()  # part 3 scrapes the cluster with a real Prometheus


def test_every_check_fails_on_the_stub_and_passes_on_the_solution(execution_cache) -> None:
    from test_course_grade import REAL_LABS

    since = time.time()
    nb = catalog.find("lab01").file
    # The class's parameters for both runs, so that whichever test comes first executes them
    # and the other reads them back.
    parameters = REAL_LABS["lab01"][1]
    report = verify_lab_checks(
        nb, parameters, cache=execution_cache,
        stub=nb.parents[1] / "labs" / nb.name,
    )  # fmt: skip
    assert_no_ray_daemons_left(since)
    assert report.ok, report.describe()
    assert len(report.outcomes) == EXERCISES, report.describe()
    for number, outcome in enumerate(report.outcomes, start=1):
        assert outcome.stub_error.startswith(f"CheckFailed: Exercise {number} ("), outcome
        # Exercise 7's stub keeps the template text: its check names the blanks left.
        assert ("is not done yet" if number < 7 else "blanks left") in outcome.stub_error, outcome
    print(f"\n{report.describe()}")
