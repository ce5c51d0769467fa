"""Gradescope's autograder ``results.json`` for one student.

The format is the one Gradescope's autograder specification documents
(https://gradescope-autograders.readthedocs.io/en/latest/specs/): a top-level
``score``, ``execution_time``, ``output``, ``visibility`` and ``stdout_visibility``, and
``tests``, each with ``name``, ``number``, ``score``, ``max_score``, ``status``
(``passed`` or ``failed``), ``output`` and ``visibility``. A Gradescope autograder's
``run_autograder`` grades the one submission with ``ddtk course grade`` (or ``ddtk quiz
grade``) and copies ``OUT/<student>/gradescope.json`` to
``/autograder/results/results.json``.
"""

from __future__ import annotations

from typing import Any

from ddtk.gradebook import Grade, Item, number

VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")


def _test(item: Item, visibility: str) -> dict[str, Any]:
    output = "\n".join(t for t in (item.message, item.fix) if t) or "passed"
    return {
        "name": f"{item.number}. {item.name}" if item.number[:1].isdigit() else item.name,
        "number": item.number,
        "score": number(item.score),
        "max_score": number(item.max_score),
        "status": "passed" if item.status == "pass" else "failed",
        "output": output,
        "visibility": visibility,
    }


def results_json(grade: Grade, *, visibility: str = "visible") -> dict[str, Any]:
    """``grade`` as Gradescope's ``results.json`` data; ``visibility`` is every test's and
    the whole result's (Gradescope's values: :data:`VISIBILITIES`)."""
    if visibility not in VISIBILITIES:
        raise ValueError(f"visibility must be one of {', '.join(VISIBILITIES)}, got {visibility!r}")
    lines = [f"{grade.title}: {number(grade.score)} of {number(grade.max_score)} points"]
    lines += [f"Not fully graded: {grade.error}"] if grade.error else []
    lines += list(grade.notes)
    return {
        "score": number(grade.score),
        "execution_time": round(grade.seconds),
        "output": "\n".join(lines),
        "visibility": visibility,
        "stdout_visibility": "hidden",
        "tests": [_test(item, visibility) for item in grade.items],
    }


__all__ = ["VISIBILITIES", "results_json"]
