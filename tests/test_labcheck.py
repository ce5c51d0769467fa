"""``verify_lab_checks``: a check must fail on the stub with a teaching message and pass on the answer.

Small notebooks built here exercise each way a lab can be wrong; the real lab is
tested in tests/test_lab01.py.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from ddtk.course.labcheck import plan
from ddtk.course.labverify import verify_lab_checks
from ddtk.course.notebooks import NotebookError

pytestmark = pytest.mark.notebook

EXERCISE = (
    "def ring_sum(values):\n"
    "    # BEGIN SOLUTION ring sum\n"
    "    return sum(values)\n"
    "    # END SOLUTION"
)
GOOD_CHECK = (
    "from ddtk.course.checks import exercise, expect\n"
    "with exercise(1, 'ring sum'):\n"
    "    got = ring_sum(range(n))\n"
    "    expect(got == n * (n - 1) // 2, 'ring_sum(range(n))', expected=n * (n - 1) // 2, got=got)"
)


def _notebook(tmp_path: Path, *cells: tuple[str, list[str]]) -> Path:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("n = 5")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params]
    for source, tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = tags
        nb.cells.append(cell)
    path = tmp_path / "lab.ipynb"
    nbformat.write(nb, path)
    return path


def test_a_teaching_check_fails_on_the_stub_and_passes_on_the_solution(tmp_path: Path) -> None:
    path = _notebook(
        tmp_path, (EXERCISE, []), (GOOD_CHECK, ["check"]), ("print(ring_sum([n]))", [])
    )
    report = verify_lab_checks(path, {"n": 7})
    assert report.ok, report.describe()
    (outcome,) = report.outcomes
    assert outcome.exercises == (1,)
    assert outcome.stub_error.startswith("CheckFailed: Exercise 1 (ring sum) is not done yet")


def test_a_check_that_passes_on_the_stub_is_a_problem(tmp_path: Path) -> None:
    path = _notebook(tmp_path, (EXERCISE, []), ("print('nothing checked')", ["check"]))
    report = verify_lab_checks(path)
    assert not report.ok
    assert "passed on the stub" in report.problems[0]


def test_a_bare_not_implemented_error_is_not_a_teaching_failure(tmp_path: Path) -> None:
    path = _notebook(tmp_path, (EXERCISE, []), ("ring_sum([1])", ["check"]))
    report = verify_lab_checks(path)
    assert not report.ok
    assert "should raise CheckFailed" in report.problems[0]


def test_a_check_that_fails_on_the_solution_is_a_problem(tmp_path: Path) -> None:
    wrong = GOOD_CHECK.replace("n * (n - 1) // 2,", "-1,", 1)
    path = _notebook(tmp_path, (EXERCISE, []), (wrong, ["check"]))
    report = verify_lab_checks(path)
    assert not report.ok
    assert "failed on the solution" in report.problems[0]


def test_an_exercise_without_a_check_is_refused(tmp_path: Path) -> None:
    path = _notebook(tmp_path, (EXERCISE, []))
    with pytest.raises(NotebookError, match="have no check cell after them"):
        plan(nbformat.read(path, as_version=4), str(path))


def test_uses_names_a_stub_before_the_check_starts_anything() -> None:
    """The stub ``ddtk course build`` writes is recognised from its code; an answer is not."""
    from ddtk.course.build import _stub_code
    from ddtk.course.checks import CheckFailed, exercise, stub_message

    source = "import time\n" + EXERCISE.replace(
        "    return sum(values)", "    time.sleep(0)\n    return sum(values)"
    )
    stub, titles = _stub_code(source, "lab.ipynb", 1, 3)
    assert titles == ["ring sum"]
    answer_ns: dict = {}
    stub_ns: dict = {}
    exec(source, answer_ns)
    exec(stub, stub_ns)
    assert stub_message(answer_ns["ring_sum"]) is None
    assert stub_message(stub_ns["ring_sum"]) == "Exercise 3: ring sum"
    assert stub_message(print) is None  # a builtin has no code to read
    started = []
    with (
        pytest.raises(
            CheckFailed, match=r"^Exercise 3 \(ring sum\) is not done yet: ring_sum\(\) still"
        ),
        exercise(3, "ring sum", uses=(answer_ns["ring_sum"], stub_ns["ring_sum"])),
    ):
        started.append(True)
    assert started == []
    with exercise(3, "ring sum", uses=(answer_ns["ring_sum"],)):
        started.append(True)
    assert started == [True]


DATA_CHECK = (
    "from ddtk.course.checks import exercise, expect\n"
    "with exercise(1, 'ring sum', uses=(ring_sum,)):\n"
    "    expect(ring_sum(data) == sum(data), 'ring_sum(data)', expected=sum(data), got=ring_sum(data))"
)


def test_a_check_on_a_defined_helper_is_tried_at_function_level(tmp_path: Path) -> None:
    """The helper cell only defines, so the check runs on its own: no whole stub run."""
    helper = "def make_data(k):\n    return list(range(k))\nSIZE = 6"
    check = DATA_CHECK.replace("with exercise", "data = make_data(SIZE)\nwith exercise")
    path = _notebook(tmp_path, (EXERCISE, []), (helper, []), (check, ["check"]))
    report = verify_lab_checks(path)
    assert report.ok, report.describe()
    (outcome,) = report.outcomes
    assert outcome.level == "function" and "is not done yet" in outcome.stub_error
    assert report.stub_run is None and report.matrix_run is not None
    ids = [c["id"] for c in report.matrix_run.notebook.cells]
    assert sum(i.endswith("--stub") for i in ids) == sum(i.endswith("--answer") for i in ids) == 1


def test_a_check_on_a_computed_result_is_proven_in_the_stub_s_whole_run(tmp_path: Path) -> None:
    """A cell that computes for over a second is not run again: the stub's own run shows
    the check failing, with the message that names its exercise."""
    slow = "import time\ntime.sleep(1.2)\ndata = list(range(n))"
    path = _notebook(tmp_path, (EXERCISE, []), (slow, []), (DATA_CHECK, ["check"]))
    report = verify_lab_checks(path, {"n": 4})
    assert report.ok, report.describe()
    (outcome,) = report.outcomes
    assert outcome.level == "notebook", report.describe()
    assert outcome.stub_error.startswith("CheckFailed: Exercise 1 (ring sum) is not done yet")
    assert report.stub_run is not None and report.matrix_run is None


def test_which_cells_a_check_needs() -> None:
    from ddtk.course.labverify import closure

    nb = nbformat.v4.new_notebook()
    sources = [
        "import math\nn = 5",  # 0 set-up
        EXERCISE,  # 1 exercise
        "def helper(v):\n    return math.fsum(v)",  # 2 only defines
        "data = [math.sqrt(i) for i in range(n)]",  # 3 computes
        "print(ring_sum(data), helper(data))",  # 4 the check
        "print(later)",  # 5 reads a name no cell before it binds
    ]
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    stubs, _ = {1: "stub"}, None
    assert closure(nb, 4, [1], stubs) is None  # cell 3 computes
    assert closure(nb, 4, [1], stubs, cheap={3}) == [2, 3]  # ... unless it was quick
    assert closure(nb, 5, [1], stubs) is None
    nb.cells[4].source = "print(ring_sum([n]), helper([1.0]))"
    assert closure(nb, 4, [1], stubs) == [2]


def test_cell_names() -> None:
    import doctest

    from ddtk.course import cellnames

    assert doctest.testmod(cellnames).failed == 0
    assert cellnames.reads("%matplotlib inline\nplt.plot(xs)\ndisplay(fig)") == {"plt", "xs", "fig"}
    assert cellnames.reads("for i in range(3):\n    total += i") == {"total"}
    assert cellnames.binds("with open(p) as f:\n    text = f.read()\ndef g():\n    inner = 1") == {
        "f", "text", "g",
    }  # fmt: skip
    assert cellnames.only_defines('"""doc"""\nK = -1\nNAMES = {"a": (1, 2)}\nclass C:\n    pass')
    assert not cellnames.only_defines("K = compute()")
    assert not cellnames.only_defines("print('hi')")
    assert cellnames.parse("def broken(:") is None and cellnames.reads("def broken(:") == set()
