"""Lab 01 (Ray Train): every check fails on its stub and passes on the solution.

The test runs the solution notebook once, at its laptop defaults but for part
4's scaling runs (1 and 2 workers; the second test covers 3), in one kernel: before
each check cell it runs the stub that ``ddtk course build`` writes for the exercises
that check covers, and the check must fail with a teaching ``CheckFailed``; then the solution and the check again, which must pass
(:func:`ddtk.course.labcheck.verify_lab_checks`), then requires that no raylet or GCS
server is left. The run with three Ray Train workers and other epochs, as a cluster run
would change them, is the solution's run in lab 01's graded class
(``tests/test_course_grade.py``).
"""

from __future__ import annotations

import time

import pytest
from support import assert_no_ray_daemons_left, import_or_require

from ddtk.course import catalog
from ddtk.course.labcheck import verify_lab_checks

pytestmark = [pytest.mark.notebook, pytest.mark.ray, pytest.mark.slow]
EXERCISES = 7


@pytest.fixture(autouse=True)
def _ray() -> None:
    import_or_require("ray", "ray")


def test_every_check_fails_on_the_stub_and_passes_on_the_solution(tmp_path) -> None:
    since = time.time()
    nb = catalog.find("lab01").file
    # Part 4 at 1 and 2 workers (2 comes from part 2's run): three workers, in part 2 and in
    # part 4, are the solution's run in tests/test_course_grade.py, so it is not repeated here.
    params = {"report_dir": str(tmp_path), "scaling_workers": [1, 2]}
    report = verify_lab_checks(nb, params, cell_timeout=600)
    assert_no_ray_daemons_left(since)
    assert report.ok, report.describe()
    assert len(report.outcomes) == EXERCISES, report.describe()
    for number, outcome in enumerate(report.outcomes, start=1):
        assert outcome.stub_error.startswith(f"CheckFailed: Exercise {number} ("), outcome
        # Exercise 7's stub keeps the template text: its check names the blanks left.
        assert ("is not done yet" if number < 7 else "blanks left") in outcome.stub_error, outcome
    print(f"\n{report.describe()}")
