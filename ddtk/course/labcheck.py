"""A lab's exercises and the check cells that cover them, and the report of proving them.

A lab's code cells come in three kinds:

- **exercise cells** hold ``# BEGIN SOLUTION`` blocks; ``ddtk course build`` replaces
  each block by ``raise NotImplementedError("Exercise N: ...")``;
- **check cells** are tagged ``check``; each one checks the exercise cells written
  since the previous check cell;
- everything else (setup, measurements, plots).

:func:`plan` pairs them; :func:`ddtk.course.labverify.verify_lab_checks` proves that
each check fails on the stub with a teaching message and passes on the answer, and
reports it here as a :class:`LabCheckReport`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ddtk.course.build import _stub_code
from ddtk.course.notebooks import NotebookError

if TYPE_CHECKING:
    from nbformat import NotebookNode

    from ddtk.course.grading.sandbox import Execution

CHECK_TAG = "check"


@dataclass(frozen=True)
class CheckOutcome:
    """One check cell: the exercise cells it covers, what it said on the stub, how long it took."""

    cell: int
    exercises: tuple[int, ...]
    stub_error: str
    seconds: float
    level: str = "function"  # "function": tried on its own; "notebook": in the stub's whole run


@dataclass
class LabCheckReport:
    """The result of :func:`verify_lab_checks`: an outcome per check cell and any problems."""

    notebook: Path
    outcomes: list[CheckOutcome] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    solution_run: Execution | None = field(default=None, repr=False)
    matrix_run: Execution | None = field(default=None, repr=False)
    stub_run: Execution | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.outcomes)

    def describe(self) -> str:
        """A short text for a test failure or a terminal."""
        lines = [f"{self.notebook.name}: {len(self.outcomes)} checks, {self.seconds:.0f} s"]
        lines += [
            f"  cell[{o.cell}] (exercise cells {list(o.exercises)}, {o.level} level) on the stub: "
            f"{o.stub_error}"
            for o in self.outcomes
        ]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        return "\n".join(lines)


def _tags(cell: NotebookNode) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def plan(nb: NotebookNode, name: str = "<notebook>") -> tuple[dict[int, str], dict[int, list[int]]]:
    """Stub sources of the exercise cells, and the exercise cells each check cell covers.

    Raises :class:`NotebookError` for an exercise with no check cell after it, or a
    check cell with no exercise before it.
    """
    stubs: dict[int, str] = {}
    covers: dict[int, list[int]] = {}
    pending: list[int] = []
    exercise_count = 0
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        stub, titles = _stub_code(cell.source, name, index, exercise_count + 1)
        if titles:
            exercise_count += len(titles)
            stubs[index] = stub
            pending.append(index)
        if CHECK_TAG in _tags(cell):
            if not pending:
                raise NotebookError(f"{name}: check cell[{index}] has no exercise cell before it")
            covers[index], pending = pending, []
    if pending:
        raise NotebookError(f"{name}: exercise cell(s) {pending} have no check cell after them")
    return stubs, covers


__all__ = ["CHECK_TAG", "CheckOutcome", "LabCheckReport", "plan"]
