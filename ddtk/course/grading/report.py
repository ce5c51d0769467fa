"""What ``ddtk course grade`` writes and prints: per-student results, the class files, a table.

``OUT/<student>/results.json``
    the student's row: status, score, each exercise's outcome with the check's message,
    notes (restored cells, identical submissions), seconds; and, when the notebook ran,
    ``OUT/<student>/<lab>.executed.ipynb``, the notebook as graded with its outputs, and
    the hand-in files the run wrote (``labNN-report.md`` and ``labNN-report.json``).
``OUT/grades.csv``
    one row per student, the columns of ``ddtk quiz grade``'s plus ``same_as``.
``OUT/results.json``
    the lab, the counts, the number of runs, the time, and every student's row.

Every file is written atomically (:func:`ddtk.quiz.files.write_text`), so a reader never
sees half of one. Student folder names keep letters, digits, ``.``, ``_`` and ``-``.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

from ddtk.course.grading.classgrade import ClassResult
from ddtk.course.grading.score import StudentResult
from ddtk.quiz.files import write_text

OUTPUT_NAMES = ("results.json", "grades.csv")


def student_dict(r: StudentResult, lab: str) -> dict[str, Any]:
    """A student's row as JSON data."""
    return {
        "student": r.student,
        "lab": lab,
        "file": r.file,
        "status": r.status,
        "score": r.score,
        "max_score": r.max_score,
        "percent": round(r.percent, 2),
        "passed": r.passed,
        "error": r.error,
        "notes": list(r.notes),
        "same_as": list(r.same_as),
        "seconds": round(r.seconds, 2),
        "exercises": [
            {"number": e.number, "title": e.title, "status": e.status, "message": e.message}
            for e in r.exercises
        ],
    }


def class_dict(result: ClassResult) -> dict[str, Any]:
    """The class's ``results.json`` data."""
    return {
        "lab": result.lab,
        "title": result.title,
        "counts": result.counts(),
        "executions": result.executions,
        "seconds": round(result.seconds, 2),
        "students": [student_dict(r, result.lab) for r in result.results],
    }


def grades_csv_text(result: ClassResult) -> str:
    """The class ``grades.csv``: one row per student."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(
        ["student", "score", "max_score", "percent", "passed", "status", "file", "error", "same_as"]
    )
    for r in result.results:
        writer.writerow(
            [r.student, r.score, r.max_score, f"{r.percent:.2f}", str(r.passed).lower(),
             r.status, r.file, r.error or "", " ".join(r.same_as)]
        )  # fmt: skip
    return buf.getvalue()


def _folder_name(student: str, used: set[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", student).lstrip(".") or "_"
    if name in OUTPUT_NAMES:
        name = f"_{name}"
    base, n = name, 2
    while name in used:
        name, n = f"{base}-{n}", n + 1
    used.add(name)
    return name


def write_results(result: ClassResult, out_dir: Path) -> list[Path]:
    """Write every output file (see the module docstring) under ``out_dir``; return their paths."""
    from ddtk.course.notebooks import dumps_notebook

    written: list[Path] = []
    used: set[str] = set()
    for r in result.results:
        folder = out_dir / _folder_name(r.student, used)
        path = folder / "results.json"
        text = json.dumps(student_dict(r, result.lab), indent=2, ensure_ascii=False) + "\n"
        write_text(path, text, durable=False)
        written.append(path)
        if r.executed is not None:
            executed = folder / f"{result.lab}.executed.ipynb"
            write_text(executed, dumps_notebook(r.executed), durable=False)
            written.append(executed)
        for name, data in r.handin.items():  # the hand-in report the run wrote
            write_text(folder / name, data.decode("utf-8", "replace"), durable=False)
            written.append(folder / name)
    for name, text in (
        ("grades.csv", grades_csv_text(result)),
        ("results.json", json.dumps(class_dict(result), indent=2, ensure_ascii=False) + "\n"),
    ):
        write_text(out_dir / name, text)
        written.append(out_dir / name)
    return written


def _marks(r: StudentResult) -> str:
    symbols = {"pass": "✓", "fail": "✗", "error": "!"}
    return " ".join(f"{e.number}{symbols[e.status]}" for e in r.exercises)


def _note(r: StudentResult) -> str:
    first = next((e for e in r.exercises if e.status != "pass"), None)
    parts = [r.error] if r.error else []
    if first is not None and not r.error:
        parts.append(f"exercise {first.number}: {first.message}")
    return "; ".join([*parts, *r.notes])


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
            escape(r.student), f"{r.score}/{r.max_score}", f"{r.percent:.0f}",
            f"[{styles[r.status]}]{r.status}[/]", _marks(r), escape(_note(r)),
        )  # fmt: skip
    return table


__all__ = ["class_dict", "grades_csv_text", "student_dict", "summary_table", "write_results"]
