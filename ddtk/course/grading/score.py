"""Score one run: each check cell's outcome becomes the result of the exercises it covers.

The exercises come from the solution notebook (:func:`lab_checks`): its ``# BEGIN
SOLUTION <title>`` blocks, numbered as ``ddtk course build`` numbers them, each covered
by the next check cell (:func:`ddtk.course.labcheck.plan`). A check cell's outcome is

- ``pass``: it ran to the end;
- ``fail``: it raised ``CheckFailed`` (or a bare ``AssertionError``); the message is the
  check's, which says what was expected and what came back;
- ``error``: it raised anything else (``NameError: ...``), or it never ran because the
  run stopped before it (time limit, dead kernel).

Each exercise is worth the points the solution notebook gives it (:func:`lab_points`:
``metadata.ddtk.points``, by exercise title; 1 each where the lab gives none). A passed
exercise earns its points; a failed one earns nothing, unless a judge (never the
learner's kernel) found part of it right: then ``credit`` is the share it earns. A
student's status is ``pass`` when every exercise passed, ``fail`` otherwise, and
``error`` when the notebook could not be graded (a bad file, a time-out, a dead kernel;
checks that ran before the run stopped are still listed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ddtk.course.build import _stub_code
from ddtk.course.labcheck import CHECK_TAG, plan

if TYPE_CHECKING:
    from nbformat import NotebookNode

    from ddtk.course.grading.sandbox import Execution

_FAILURES = frozenset({"CheckFailed", "AssertionError"})


@dataclass(frozen=True)
class CheckSpec:
    """A check cell of the solution (by id) and the exercises ``(number, title)`` it covers."""

    cell_id: str
    exercises: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class ExerciseResult:
    """One exercise of one student: ``pass``, ``fail`` or ``error``, with the check's message;
    ``credit``: the share of the points a failed exercise still earns (a judge's parts)."""

    number: int
    title: str
    status: str
    message: str = ""
    credit: Fraction = Fraction(0)
    points: Fraction = Fraction(1)

    @property
    def earned(self) -> Fraction:
        """The points this exercise earns."""
        if self.status == "pass":
            return self.points
        return self.points * self.credit if self.status == "fail" else Fraction(0)


@dataclass
class StudentResult:
    """One row of the class: the student's exercises, score and status, and why not graded."""

    student: str
    file: str
    status: str
    max_score: Fraction
    exercises: list[ExerciseResult] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    same_as: list[str] = field(default_factory=list)
    executed: NotebookNode | None = field(default=None, repr=False)  # the run's notebook
    handin: dict[str, bytes] = field(default_factory=dict, repr=False)  # the report it wrote

    @property
    def score(self) -> Fraction:
        return sum((e.earned for e in self.exercises), Fraction(0))

    @property
    def percent(self) -> float:
        return float(100 * self.score / self.max_score) if self.max_score else 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def lab_checks(solution: NotebookNode, name: str = "<solution>") -> list[CheckSpec]:
    """The check cells of ``solution`` and the exercises each covers, in order.

    Raises :class:`~ddtk.course.notebooks.NotebookError` for a solution whose exercises
    and checks do not pair up, or that has none.
    """
    from ddtk.course.notebooks import NotebookError

    _stubs, covers = plan(solution, name)
    numbered: dict[int, list[tuple[int, str]]] = {}
    count = 0
    for index, cell in enumerate(solution.cells):
        if cell.get("cell_type") == "code":
            _src, titles = _stub_code(cell.get("source", ""), name, index, count + 1)
            numbered[index] = [(count + 1 + i, t) for i, t in enumerate(titles)]
            count += len(titles)
    specs = [
        CheckSpec(solution.cells[i]["id"], tuple(e for x in covered for e in numbered[x]))
        for i, covered in sorted(covers.items())
    ]
    if not specs:
        raise NotebookError(f"{name}: no check cells (tagged '{CHECK_TAG}'): nothing to grade")
    return specs


def lab_points(solution: NotebookNode, specs: list[CheckSpec], name: str = "<solution>") -> dict[int, Fraction]:
    """Each exercise's points, by number, from the solution's ``metadata.ddtk.points``
    (``{exercise title: points}``); 1 each when the lab gives none.

    Raises :class:`~ddtk.course.notebooks.NotebookError` for a map that misses an
    exercise, names one the lab does not have, or gives points that are not positive.
    """
    from ddtk.course.notebooks import NotebookError

    titles = {number: title for s in specs for number, title in s.exercises}
    given = solution.get("metadata", {}).get("ddtk", {}).get("points")
    if given is None:
        return {number: Fraction(1) for number in titles}
    if not isinstance(given, dict):
        raise NotebookError(f"{name}: metadata.ddtk.points must map exercise titles to points")
    unknown = sorted(set(given) - set(titles.values()))
    missing = [t for t in titles.values() if t not in given]
    if unknown or missing:
        parts = [f"names no exercise: {', '.join(map(repr, unknown))}"] if unknown else []
        parts += [f"gives no points to: {', '.join(map(repr, missing))}"] if missing else []
        raise NotebookError(f"{name}: metadata.ddtk.points " + "; ".join(parts))
    points = {}
    for number, title in titles.items():
        value = given[title]
        try:
            points[number] = Fraction(str(value))
        except (ValueError, ZeroDivisionError):
            points[number] = Fraction(-1)
        if isinstance(value, bool) or points[number] <= 0:
            raise NotebookError(
                f"{name}: metadata.ddtk.points gives {title!r} {value!r}; points are a number > 0"
            )
    return points


def check_outcome(cell: NotebookNode, ran: bool, why_not: str | None) -> tuple[str, str]:
    """``(status, message)`` of one executed check cell."""
    if not ran:
        return "error", f"not run: {why_not or 'the run stopped before this check'}"
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            ename, evalue = out.get("ename", "Error"), out.get("evalue", "")
            if ename in _FAILURES:
                return "fail", evalue
            return "error", f"{ename}: {evalue}" if evalue else ename
    return "pass", ""


def exercise_results(specs: list[CheckSpec], run: Execution) -> list[ExerciseResult]:
    """Every exercise's result from the executed notebook of ``run``."""
    where = {c.get("id"): i for i, c in enumerate(run.notebook.cells)}
    results = []
    for spec in specs:
        index = where.get(spec.cell_id)
        if index is None:  # cannot happen after restoration; reported rather than hidden
            status, message = "error", "the check cell is missing from the graded notebook"
        else:
            status, message = check_outcome(
                run.notebook.cells[index], index in run.finished, run.reason
            )
        results += [ExerciseResult(n, t, status, message) for n, t in spec.exercises]
    return results


def score_run(
    student: str, file: str, specs: list[CheckSpec], run: Execution, notes: list[str],
    judged: Mapping[int, Any] | None = None, points: Mapping[int, Fraction] | None = None,
) -> StudentResult:  # fmt: skip
    """A student's row from a finished run; ``judged`` (number -> verdict) replaces the
    kernel's check outcome of the exercises judged outside it (:mod:`ddtk.course.judging`);
    ``points`` (number -> points, :func:`lab_points`) weighs them, 1 each by default."""
    exercises = exercise_results(specs, run)
    if judged:  # only a judge's verdict carries partial credit: the kernel's never does
        exercises = [replace(judged[e.number], title=e.title) if e.number in judged else e
                     for e in exercises]  # fmt: skip
    points = points or {}
    exercises = [replace(e, points=points.get(e.number, Fraction(1))) for e in exercises]
    total = sum((points.get(n, Fraction(1)) for s in specs for n, _t in s.exercises), Fraction(0))
    if run.status != "completed":
        status, error = "error", run.reason
    else:
        status = "pass" if all(e.status == "pass" for e in exercises) else "fail"
        error = None
    return StudentResult(
        student, file, status, total, exercises, run.seconds, error, list(notes), [], run.notebook,
        dict(getattr(run, "handin", {})),
    )  # fmt: skip


def error_row(
    student: str, file: str, specs: list[CheckSpec], reason: str,
    points: Mapping[int, Fraction] | None = None,
) -> StudentResult:  # fmt: skip
    """A row for a submission that could not be graded at all."""
    points = points or {}
    total = sum((points.get(n, Fraction(1)) for s in specs for n, _t in s.exercises), Fraction(0))
    return StudentResult(student, file, "error", total, error=reason)


__all__ = [
    "CheckSpec",
    "ExerciseResult",
    "StudentResult",
    "check_outcome",
    "error_row",
    "exercise_results",
    "lab_checks",
    "lab_points",
    "score_run",
]
