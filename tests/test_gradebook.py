"""The gradebook exports: Gradescope's results.json, Canvas's import CSV, the feedback page,
points from a lab's metadata and partial credit from a check in parts.

The formats are checked against what their owners document: Gradescope's autograder
specification (https://gradescope-autograders.readthedocs.io/en/latest/specs/, the
"Output format" section: the top-level keys and each test's keys, their types and the
allowed ``status`` and ``visibility`` values) and Canvas's gradebook import (the five
identity columns of its own export, then one column per assignment, and a
``Points Possible`` row). A graded class exercises them end to end in
``tests/test_course_grade.py`` and ``tests/test_quiz_cli.py``.
"""

from __future__ import annotations

import csv
import io
from fractions import Fraction
from pathlib import Path

import jsonschema
import nbformat
import pytest

from ddtk.course.checks import CheckFailed, Parts, expect
from ddtk.course.grading.score import ExerciseResult, lab_checks, lab_points, score_run
from ddtk.course.notebooks import NotebookError
from ddtk.gradebook import Grade, Item, fix_for, number
from ddtk.gradebook.canvas import RosterError, gradebook_csv, read_roster
from ddtk.gradebook.feedback import feedback_html
from ddtk.gradebook.gradescope import results_json

_VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
_FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
GRADESCOPE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": _FORMAT,
        "test_output_format": _FORMAT,
        "test_name_format": _FORMAT,
        "visibility": _VISIBILITY,
        "stdout_visibility": _VISIBILITY,
        "extra_data": {"type": "object"},
        "leaderboard": {"type": "array"},
        "tests": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "score", "max_score"],
                "properties": {
                    "score": {"type": "number"},
                    "max_score": {"type": "number"},
                    "status": {"enum": ["passed", "failed"]},
                    "name": {"type": "string"},
                    "name_format": _FORMAT,
                    "number": {"type": "string"},
                    "output": {"type": "string"},
                    "output_format": _FORMAT,
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "visibility": _VISIBILITY,
                    "extra_data": {"type": "object"},
                },
            },
        },
    },
    "anyOf": [{"required": ["score"]}, {"required": ["tests"]}],
}


def assert_gradescope_results(data: dict) -> None:
    """``data`` is a valid Gradescope results.json whose score is its tests' sum."""
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    tests = data.get("tests", [])
    for t in tests:
        assert 0 <= t["score"] <= t["max_score"], t
        assert (t["status"] == "passed") == (t["score"] == t["max_score"]), t
    assert data["score"] == pytest.approx(sum(t["score"] for t in tests))


def _grade(student: str = "ann", **kw) -> Grade:
    items = (
        Item("1", "ring sum", Fraction(2), Fraction(2), "pass"),
        Item("2", "tree", Fraction(3, 2), Fraction(3), "fail", "2 of 4 parts passed", "fix it"),
        Item("3", "<b>bold</b>", Fraction(0), Fraction(1), "error", "NameError: <script>x</script>",
             fix_for("error", "NameError")),
    )  # fmt: skip
    return Grade(student, "lab99", "Lab 99", Fraction(6), "fail", items, **kw)


def test_gradescope_results_follow_the_documented_format() -> None:
    data = results_json(_grade(seconds=12.4, notes=("check cell 1 was restored",)))
    assert_gradescope_results(data)
    assert data["score"] == 3.5 and data["execution_time"] == 12
    assert [t["status"] for t in data["tests"]] == ["passed", "failed", "failed"]
    assert data["tests"][1]["score"] == 1.5 and "fix it" in data["tests"][1]["output"]
    assert "check cell 1 was restored" in data["output"]
    with pytest.raises(ValueError, match="visibility must be one of hidden"):
        results_json(_grade(), visibility="public")


def test_canvas_csv_has_canvas_columns_points_and_no_formulas() -> None:
    grades = [_grade("ann"), _grade("=HYPERLINK(1)")]
    text, unknown = gradebook_csv(grades, "Lab 99 (4021)")
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Lab 99 (4021)"]
    assert rows[1] == ["Points Possible", "", "", "", "", "6"]
    assert rows[2] == ["ann", "", "", "ann", "", "3.5"] and unknown == []
    assert rows[3][0] == "'=HYPERLINK(1)"  # shown as text by a spreadsheet, never run
    second = Grade("ann", "lab99", "Lab 99", Fraction(6), "error", error="a second file")
    rows = list(csv.reader(io.StringIO(gradebook_csv([second, _grade("ann")], "x")[0])))
    assert [r[-1] for r in rows[2:]] == ["3.5"]  # one row per student: the graded one
    with pytest.raises(ValueError, match=r"different maximum scores .* give points_possible"):
        gradebook_csv([_grade(), Grade("bo", "lab99", "Lab 99", Fraction(5), "fail")], "x")
    with pytest.raises(ValueError, match="needs a name"):
        gradebook_csv(grades, " ")
    # a quiz whose students drew different questions: one column, each scaled to it
    mixed = [_grade("ann"), Grade("bo", "q", "Quiz", Fraction(3), "fail",
                                  (Item("q1", "q1", Fraction(3), Fraction(3), "pass"),))]  # fmt: skip
    rows = list(csv.reader(io.StringIO(gradebook_csv(mixed, "Quiz", None, Fraction(10))[0])))
    assert rows[1][-1] == "10" and [r[-1] for r in rows[2:]] == ["5.8333", "10"]


def test_canvas_roster_names_students_as_canvas_does(tmp_path: Path) -> None:
    export = tmp_path / "canvas-export.csv"
    export.write_text(
        "\ufeffStudent,ID,SIS User ID,SIS Login ID,Section,Lab 1 (4021)\n"
        "    Points Possible,,,,,10\n"
        '"Lovelace, Ada",101,S-1,ada,Sec A,\n'
        '"Hopper, Grace",102,S-2,ghopper,Sec B,\n'
        '"Student, Test",999,,,Sec A,\n',
        encoding="utf-8",
    )
    roster = read_roster(export)
    assert [r["ID"] for r in roster] == ["101", "102"]  # the points row and test student left out
    text, unknown = gradebook_csv([_grade("ada"), _grade("S-2"), _grade("zed")], "Lab 1", roster)
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[2] == ["Lovelace, Ada", "101", "S-1", "ada", "Sec A", "3.5"]
    assert rows[3][:2] == ["Hopper, Grace", "102"] and unknown == ["zed"]
    bad = tmp_path / "grades.csv"
    bad.write_text("student,score\nann,1\n")
    with pytest.raises(RosterError, match="not a Canvas gradebook export: it has no Student"):
        read_roster(bad)
    with pytest.raises(RosterError, match="cannot read the roster"):
        read_roster(tmp_path / "missing.csv")


def test_feedback_page_escapes_what_the_submission_wrote() -> None:
    page = feedback_html(_grade(error="the kernel died", notes=("a note",)))
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;bold" in page
    assert "3.5 of 6 points" in page and "the kernel died" in page and "a note" in page
    assert page.count("<tr>") == 4  # a header and one row per exercise
    assert "run the cell in your notebook and read the traceback" in page


def test_items_refuse_impossible_scores() -> None:
    with pytest.raises(ValueError, match=r"outside 0\.\.2"):
        Item("1", "x", Fraction(3), Fraction(2), "pass")
    with pytest.raises(ValueError, match="status must be one of"):
        Item("1", "x", Fraction(0), Fraction(2), "passed")
    assert number(Fraction(7, 2)) == 3.5 and number(Fraction(4)) == 4 and number(1 / 3) == 0.3333


def test_fix_for_names_what_to_do() -> None:
    assert fix_for("pass", "") == ""
    assert "NotImplementedError" in fix_for("fail", "Exercise 2 (x) is not done yet: ...")
    assert "time limit" in fix_for("error", "not run: cell[5] was still running")
    assert "expected" in fix_for("fail", "ring sum: expected 6, got 5")


# ---------------------------------------------------------------- points and partial credit


def _lab(points: object = None) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("def a():\n    # BEGIN SOLUTION first\n    return 1\n    # END SOLUTION"),
        nbformat.v4.new_code_cell("assert a() == 1", metadata={"tags": ["check"]}),
        nbformat.v4.new_code_cell("def b():\n    # BEGIN SOLUTION second\n    return 2\n    # END SOLUTION"),
        nbformat.v4.new_code_cell("assert b() == 2", metadata={"tags": ["check"]}),
    ]  # fmt: skip
    if points is not None:
        nb.metadata["ddtk"] = {"points": points}
    return nb


def test_points_come_from_the_labs_metadata_and_bad_maps_are_named() -> None:
    specs = lab_checks(_lab())
    assert lab_points(_lab(), specs) == {1: 1, 2: 1}  # no map: one point each
    assert lab_points(_lab({"first": 2, "second": "1.5"}), specs) == {1: 2, 2: Fraction(3, 2)}
    for bad, words in [
        ({"first": 2}, "gives no points to: 'second'"),
        ({"first": 1, "second": 1, "third": 1}, "names no exercise: 'third'"),
        ({"first": 0, "second": 1}, "gives 'first' 0; points are a number > 0"),
        ({"first": True, "second": 1}, "points are a number > 0"),
        ({"first": "lots", "second": 1}, "points are a number > 0"),
        (["first"], "must map exercise titles to points"),
    ]:
        with pytest.raises(NotebookError, match=words):
            lab_points(_lab(bad), specs)


def test_every_real_lab_weighs_every_exercise() -> None:
    from ddtk.course import catalog

    for entry in (e for e in catalog.NOTEBOOKS if e.kind == "lab"):
        solution = nbformat.read(entry.file, as_version=4)
        assert "points" in solution.metadata.get("ddtk", {}), entry.name
        points = lab_points(solution, lab_checks(solution), entry.name)  # complete, positive
        assert len(set(points.values())) > 1, (entry.name, points)  # not all worth the same


def test_a_check_in_parts_gives_the_share_that_passed() -> None:
    parts = Parts()
    for name, ok in [("lost", True), ("dups", False), ("disagree", True), ("schedule", True)]:
        with parts.part(name):
            expect(ok, name, expected=True, got=ok)
    with pytest.raises(
        CheckFailed, match=r"3 of 4 parts passed \(lost, disagree, schedule\); dups"
    ) as exc:
        parts.finish()
    assert exc.value.credit == Fraction(3, 4)
    with pytest.raises(ValueError, match="credit is a share"):
        CheckFailed("x", credit=1)


class _Run:
    """An executed notebook as :func:`score_run` reads it: both checks ran, the second failed."""

    status, reason, seconds, handin = "completed", None, 1.0, {}

    def __init__(self, nb: nbformat.NotebookNode) -> None:
        self.notebook = nb
        nb.cells[3].outputs = [nbformat.v4.new_output(
            "error", ename="CheckFailed", evalue="b(): expected 2, got 3", traceback=[])]  # fmt: skip
        self.finished = {1, 3}


def test_partial_credit_counts_from_a_judge_never_from_the_kernel() -> None:
    nb = _lab({"first": 1, "second": 4})
    specs, points = lab_checks(nb), lab_points(nb, lab_checks(nb))
    row = score_run("ann", "ann.ipynb", specs, _Run(nb), [], None, points)
    assert (row.score, row.max_score) == (1, 5)  # the kernel's failure earns nothing
    verdict = ExerciseResult(2, "second", "fail", "3 of 4 parts passed", Fraction(3, 4))
    row = score_run("ann", "ann.ipynb", specs, _Run(nb), [], {2: verdict}, points)
    assert row.score == 4 and row.exercises[1].earned == 3 and row.status == "fail"


def test_course_check_names_a_lab_whose_points_do_not_cover_its_exercises(tmp_path: Path) -> None:
    from ddtk.course.check import check_points

    (tmp_path / "solutions").mkdir()
    nbformat.write(_lab({"first": 1}), tmp_path / "solutions" / "lab98-x.ipynb")
    nbformat.write(_lab({"first": 1, "second": 2}), tmp_path / "solutions" / "lab97-y.ipynb")
    findings = check_points(tmp_path)
    assert [(f.check, f.path.name) for f in findings] == [("points", "lab98-x.ipynb")]
    assert "gives no points to: 'second'" in findings[0].message
