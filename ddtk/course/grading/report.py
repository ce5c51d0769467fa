"""What ``ddtk course grade`` writes and prints: per-student results, the class files, a table.

``OUT/<student>/results.json``
    the student's row: status, score, each exercise's outcome with the check's message,
    notes (restored cells), seconds, and nothing about any other student; and, when the
    notebook ran,
    ``OUT/<student>/<lab>.executed.ipynb``, the notebook as graded with its outputs, and
    the hand-in files the run wrote (``labNN-report.md`` and ``labNN-report.json``).
``OUT/<student>/feedback.html``
    the student's page: each exercise's verdict, points, the check's message and what
    to fix (:mod:`ddtk.gradebook.feedback`);
``OUT/<student>/gradescope.json``
    the same grade in Gradescope's autograder ``results.json`` format;
``OUT/canvas.csv``
    the class as a Canvas gradebook import (:mod:`ddtk.gradebook.canvas`), matched to
    the roster when Canvas's own export is given;
``OUT/grades.csv``
    one row per student, the columns of ``ddtk quiz grade``'s. Safe to open in a
    spreadsheet: a cell that would start a formula (``=``, ``+``, ``-``, ``@``) is quoted
    with a leading ``'``.
``OUT/results.json``
    the instructor's class report: the lab, the counts, the number of runs, the time,
    every student's row with ``same_as`` (who handed in identical code), and the groups
    of students who shared code (``shared_code``).

``OUT`` holds only what the grader wrote: everything is written into a new folder
beside it, which then replaces it whole, so nothing a run (or anyone) left in ``OUT``
survives, and nothing half-written is ever seen. An ``OUT`` that exists must be one a
previous ``ddtk course grade`` wrote (it holds ``.ddtk-grade``) or empty; anything
else is refused, never deleted. Student folder names keep letters, digits, ``.``,
``_`` and ``-``.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from ddtk.course.grading.classgrade import ClassResult
from ddtk.course.grading.score import StudentResult
from ddtk.gradebook import Grade, Item, fix_for, number, spreadsheet_safe

OUTPUT_NAMES = ("results.json", "grades.csv", "canvas.csv", "canvas-unmatched.txt")


MARK = ".ddtk-grade"  # names a folder that ddtk course grade wrote


class OutputFolderError(ValueError):
    """``--out`` names a folder that holds files the grader did not write."""


def student_dict(r: StudentResult, lab: str, *, instructor: bool = False) -> dict[str, Any]:
    """A student's row as JSON data; ``instructor`` adds who handed in the same code."""
    row = {
        "student": r.student,
        "lab": lab,
        "file": r.file,
        "status": r.status,
        "score": number(r.score),
        "max_score": number(r.max_score),
        "percent": round(r.percent, 2),
        "passed": r.passed,
        "error": r.error,
        "notes": list(r.notes),
        "seconds": round(r.seconds, 2),
        "exercises": [
            {"number": e.number, "title": e.title, "status": e.status, "message": e.message,
             "points": number(e.points), "earned": number(e.earned)}
            for e in r.exercises
        ],
    }
    if instructor:
        row["same_as"] = list(r.same_as)
    return row


def shared_code(result: ClassResult) -> list[list[str]]:
    """The groups of students who handed in identical code (one run graded each group)."""
    groups = {tuple(sorted([r.student, *r.same_as])) for r in result.results if r.same_as}
    return [list(g) for g in sorted(groups)]


def class_dict(result: ClassResult) -> dict[str, Any]:
    """The class's ``results.json`` data."""
    return {
        "lab": result.lab,
        "title": result.title,
        "counts": result.counts(),
        "executions": result.executions,
        "seconds": round(result.seconds, 2),
        "students": [student_dict(r, result.lab, instructor=True) for r in result.results],
        "shared_code": shared_code(result),
    }


def grades_csv_text(result: ClassResult) -> str:
    """The class ``grades.csv``: one row per student, safe to open in a spreadsheet."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(
        ["student", "score", "max_score", "percent", "passed", "status", "file", "error"]
    )
    for r in result.results:
        row = [r.student, number(r.score), number(r.max_score), f"{r.percent:.2f}", str(r.passed).lower(),
               r.status, r.file, r.error or ""]  # fmt: skip
        writer.writerow([spreadsheet_safe(v) for v in row])
    return buf.getvalue()


def lab_grade(r: StudentResult, result: ClassResult) -> Grade:
    """A student's row as a :class:`~ddtk.gradebook.Grade`, for the exports. A row that
    could not be run lists every exercise of the lab, unearned, with the reason."""
    items = [
        Item(str(e.number), e.title, e.earned, e.points, e.status, e.message,
             fix_for(e.status, e.message))
        for e in r.exercises
    ]  # fmt: skip
    if not items:
        why = f"not graded: {r.error}" if r.error else "not graded"
        items = [Item(str(n), t, Fraction(0), p, "error", why, fix_for("error", why))
                 for n, t, p in result.exercises]  # fmt: skip
    return Grade(r.student, result.lab, result.title, r.max_score, r.status, tuple(items),
                 r.error, tuple(r.notes), r.seconds)  # fmt: skip


def _folder_name(student: str, used: set[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", student).lstrip(".") or "_"
    if name in OUTPUT_NAMES:
        name = f"_{name}"
    base, n = name, 2
    while name in used:
        name, n = f"{base}-{n}", n + 1
    used.add(name)
    return name


def _check_out(out_dir: Path) -> None:
    """Refuse an ``out_dir`` that holds anything a previous grading did not write."""
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise OutputFolderError(f"{out_dir} is not a folder; choose another --out")
    if out_dir.is_dir() and not (out_dir / MARK).is_file() and any(out_dir.iterdir()):
        raise OutputFolderError(
            f"{out_dir} holds files that ddtk course grade did not write; it is left as it is: "
            "choose an empty or new --out"
        )


def check_output_folder(out_dir: Path) -> None:
    """Raise :class:`OutputFolderError` now, before grading, for an unusable ``out_dir``."""
    _check_out(out_dir)


def _write_tree(
    result: ClassResult, root: Path, roster: Sequence[dict[str, str]] | None, column: str | None
) -> list[str]:
    """Every output file under ``root`` (a new, empty folder); return their relative paths."""
    from ddtk.course.notebooks import dumps_notebook
    from ddtk.gradebook.canvas import gradebook_csv
    from ddtk.gradebook.feedback import feedback_html
    from ddtk.gradebook.gradescope import results_json

    written: list[str] = []

    def put(rel: str, text: str) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(rel)

    used: set[str] = set()
    grades = [lab_grade(r, result) for r in result.results]
    for r, grade in zip(result.results, grades, strict=True):
        folder = _folder_name(r.student, used)
        put(
            f"{folder}/results.json",
            json.dumps(student_dict(r, result.lab), indent=2, ensure_ascii=False) + "\n",
        )
        put(f"{folder}/feedback.html", feedback_html(grade))
        put(f"{folder}/gradescope.json", json.dumps(results_json(grade), indent=2) + "\n")
        if r.executed is not None:
            put(f"{folder}/{result.lab}.executed.ipynb", dumps_notebook(r.executed))
        for name, data in r.handin.items():  # the hand-in report the run wrote
            put(f"{folder}/{Path(name).name}", data.decode("utf-8", "replace"))
    put("grades.csv", grades_csv_text(result))
    canvas, unknown = gradebook_csv(grades, column or result.title, roster)
    put("canvas.csv", canvas)
    if unknown:
        put("canvas-unmatched.txt", "".join(f"{s}\n" for s in unknown))
    put("results.json", json.dumps(class_dict(result), indent=2, ensure_ascii=False) + "\n")
    put(MARK, "written by ddtk course grade; replaced whole on every grading\n")
    return written


def write_results(
    result: ClassResult, out_dir: Path, *, roster: Sequence[dict[str, str]] | None = None,
    canvas_column: str | None = None,
) -> list[Path]:  # fmt: skip
    """Write every output file (see the module docstring) as ``out_dir``; return their paths.

    ``roster``: Canvas's gradebook export (:func:`ddtk.gradebook.canvas.read_roster`);
    students it does not know are left out of ``canvas.csv`` and listed in
    ``canvas-unmatched.txt``. ``canvas_column``: the assignment's Canvas header (default:
    the lab's title)."""
    import shutil
    import tempfile

    _check_out(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new-", dir=out_dir.parent))
    try:
        written = _write_tree(result, stage, roster, canvas_column)
        stage.chmod(0o755)
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            out_dir.rename(old / "out")
        stage.rename(out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return [out_dir / rel for rel in written if rel != MARK]


def _marks(r: StudentResult) -> str:
    symbols = {"pass": "✓", "fail": "✗", "error": "!"}
    return " ".join(f"{e.number}{symbols[e.status]}" for e in r.exercises)


def _note(r: StudentResult) -> str:
    first = next((e for e in r.exercises if e.status != "pass"), None)
    parts = [r.error] if r.error else []
    if first is not None and not r.error:
        parts.append(f"exercise {first.number}: {first.message}")
    shared = [f"same code as {', '.join(r.same_as)}"] if r.same_as else []
    return "; ".join([*parts, *r.notes, *shared])


def summary_table(result: ClassResult) -> Any:
    """A rich table: one row per student, then the counts, runs and time taken."""
    from rich.markup import escape
    from rich.table import Table

    counts = result.counts()
    table = Table(
        title=f"{result.lab}: {result.title}",
        caption=(
            f"{counts['pass']} passed, {counts['fail']} failed, {counts['error']} not graded; "
            f"{len(result.results)} students, {result.executions} runs, {result.seconds:.1f} s"
        ),
    )
    for name, justify in (("student", "left"), ("score", "right"), ("%", "right"),
                          ("result", "left"), ("exercises", "left"), ("note", "left")):  # fmt: skip
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    styles = {"pass": "green", "fail": "bold red", "error": "bold yellow"}
    for r in result.results:
        table.add_row(
            escape(r.student), f"{number(r.score)}/{number(r.max_score)}", f"{r.percent:.0f}",
            f"[{styles[r.status]}]{r.status}[/]", _marks(r), escape(_note(r)),
        )  # fmt: skip
    return table


__all__ = [
    "MARK", "OutputFolderError", "check_output_folder", "class_dict", "grades_csv_text", "lab_grade",
    "shared_code", "spreadsheet_safe", "student_dict", "summary_table", "write_results",
]  # fmt: skip
