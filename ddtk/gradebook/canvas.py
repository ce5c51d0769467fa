"""A Canvas gradebook CSV: the file Canvas's Gradebook *Import* takes.

Canvas reads the columns of its own gradebook export: ``Student``, ``ID``, ``SIS User
ID``, ``SIS Login ID`` and ``Section`` name the student, and every further column is an
assignment whose header is its name (with ``(id)`` when it is an existing assignment;
a new name creates one). A ``Points Possible`` row under the header gives the
assignment's points.

Canvas matches rows to students by ``ID`` (or the SIS IDs), so the export is best
made against the class roster: pass Canvas's own gradebook export (``read_roster``)
and each student is found by SIS login ID, SIS user ID, Canvas ID or name, in that
order. Without a roster, the student's name in the submissions is written as both
``Student`` and ``SIS Login ID``. Every text cell is spreadsheet-safe (no formulas).
"""

from __future__ import annotations

import argparse
import csv
import io
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

from ddtk.gradebook import Grade, number, spreadsheet_safe

IDENTITY = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
_MATCH_BY = ("SIS Login ID", "SIS User ID", "ID", "Student")


class RosterError(ValueError):
    """The roster file is not a Canvas gradebook export."""


def add_canvas_options(p: argparse.ArgumentParser) -> None:
    """``--canvas-roster`` and ``--canvas-column``: how canvas.csv names students and the column."""
    p.add_argument(
        "--canvas-roster",
        metavar="CSV",
        help="Canvas's gradebook export: canvas.csv then names each student as Canvas does",
    )
    p.add_argument(
        "--canvas-column",
        metavar="NAME",
        help="the assignment's column in canvas.csv, e.g. 'Lab 1 (4021)' for an existing "
        "Canvas assignment (default: the lab's or quiz's title, which creates a new one)",
    )


def read_roster(path: str | Path) -> list[dict[str, str]]:
    """The students of a Canvas gradebook export (its identity columns), in file order."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise RosterError(f"cannot read the roster {path}: {exc}") from None
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in IDENTITY if c not in (reader.fieldnames or [])]
    if missing:
        raise RosterError(
            f"{path} is not a Canvas gradebook export: it has no {', '.join(missing)} column(s)"
        )
    rows = []
    for row in reader:
        name = (row.get("Student") or "").strip()
        if not name or name == "Points Possible" or name == "Student, Test":
            continue  # Canvas's points row and its test student
        rows.append({c: (row.get(c) or "").strip() for c in IDENTITY})
    return rows


def _find(student: str, roster: Sequence[dict[str, str]]) -> dict[str, str] | None:
    key = student.strip().lower()
    for column in _MATCH_BY:
        for row in roster:
            if row[column] and row[column].lower() == key:
                return row
    return None


def _scaled(g: Grade, possible: Fraction) -> Fraction:
    return g.score * possible / g.max_score if g.max_score else Fraction(0)


def _one_per_student(grades: Sequence[Grade]) -> list[Grade]:
    """One grade per student: a graded row over one that could not be graded (a second
    file handed in by the same student is an error row beside the graded first)."""
    chosen: dict[str, Grade] = {}
    for g in grades:
        seen = chosen.get(g.student)
        if seen is None or (seen.status == "error" and g.status != "error"):
            chosen[g.student] = g
    return list(chosen.values())


def gradebook_csv(
    grades: Sequence[Grade], column: str, roster: Sequence[dict[str, str]] | None = None,
    points_possible: Fraction | None = None,
) -> tuple[str, list[str]]:  # fmt: skip
    """The CSV text, and the students the roster does not know (left out of the file).

    ``column`` is the assignment's header: its name, or ``Name (id)`` for an existing
    Canvas assignment. Canvas gives a column one maximum: grades out of different
    maxima (a quiz whose students drew different questions) need ``points_possible``,
    and each score is then scaled to it (the same percentage)."""
    if not column.strip():
        raise ValueError("the Canvas assignment column needs a name")
    maxima = {g.max_score for g in grades if g.max_score}
    if points_possible is None and len(maxima) > 1:
        raise ValueError(f"the grades have different maximum scores {sorted(maxima)}: give "
                         "points_possible to scale them to one")  # fmt: skip
    possible = points_possible if points_possible is not None else max(maxima, default=Fraction(0))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*IDENTITY, column])
    if grades:
        writer.writerow(["Points Possible", "", "", "", "", number(possible)])
    unknown = []
    for g in _one_per_student(grades):
        if roster is None:
            who = {"Student": g.student, "ID": "", "SIS User ID": "", "SIS Login ID": g.student,
                   "Section": ""}  # fmt: skip
        else:
            found = _find(g.student, roster)
            if found is None:
                unknown.append(g.student)
                continue
            who = found
        writer.writerow([*(spreadsheet_safe(who[c]) for c in IDENTITY), number(_scaled(g, possible))])
    return buf.getvalue(), unknown


__all__ = ["IDENTITY", "RosterError", "add_canvas_options", "gradebook_csv", "read_roster"]
