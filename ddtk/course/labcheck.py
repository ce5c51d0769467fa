"""Prove that every check cell of a lab fails on the generated stub and passes on the solution.

A lab's code cells come in three kinds:

- **exercise cells** hold ``# BEGIN SOLUTION`` blocks; ``ddtk course build`` replaces
  each block by ``raise NotImplementedError("Exercise N: ...")``;
- **check cells** are tagged ``check``; each one checks the exercise cells written
  since the previous check cell;
- everything else (setup, measurements, plots).

:func:`verify_lab_checks` runs the solution notebook once, in one kernel, in order.
At each check cell it first runs the *stub* version of the exercise cells it covers
and the check, which must fail with :class:`~ddtk.course.checks.CheckFailed` (an
``AssertionError`` whose message teaches, not a bare ``NotImplementedError``); then
it runs the solution version and the check again, which must pass. One kernel
keeps the cost close to a single run of the lab, although every check is tried
both ways. Problems come back in :class:`LabCheckReport`, not as exceptions.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddtk.course.build import _stub_code
from ddtk.course.notebooks import PARAMETERS_TAG, NotebookError, read_notebook

if TYPE_CHECKING:
    from nbformat import NotebookNode

CHECK_TAG = "check"
# What a check cell must raise on a stub: ddtk.course.checks.CheckFailed or its base.
_TEACHING_ERRORS = frozenset({"CheckFailed", "AssertionError"})


@dataclass(frozen=True)
class CheckOutcome:
    """One check cell: the exercise cells it covers, what it said on the stub, how long it took."""

    cell: int
    exercises: tuple[int, ...]
    stub_error: str
    seconds: float


@dataclass
class LabCheckReport:
    """The result of :func:`verify_lab_checks`: an outcome per check cell and any problems."""

    notebook: Path
    outcomes: list[CheckOutcome] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.outcomes)

    def describe(self) -> str:
        """A short text for a test failure or a terminal."""
        lines = [f"{self.notebook.name}: {len(self.outcomes)} checks, {self.seconds:.0f} s"]
        lines += [
            f"  cell[{o.cell}] (exercise cells {list(o.exercises)}) on the stub: {o.stub_error}"
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


def _assignments(parameters: Mapping[str, Any]) -> str:
    return "\n".join(f"{key} = {value!r}" for key, value in parameters.items())


class _Runner:
    """Runs cell sources one at a time in one kernel; returns ``(ename, evalue)`` or None."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def run(self, source: str) -> tuple[str, str] | None:
        import nbformat
        from nbclient.exceptions import CellExecutionError

        cell = nbformat.v4.new_code_cell(source)
        self.client.nb.cells.append(cell)  # nbclient stores the executed cell by index
        try:
            self.client.execute_cell(cell, len(self.client.nb.cells) - 1)
        except CellExecutionError as exc:
            return exc.ename, exc.evalue
        return None


def _run_check(
    runner: _Runner, nb: NotebookNode, index: int, exercises: list[int], stubs: dict[int, str]
) -> tuple[str | None, str | None]:
    """Stub run then solution run of one check; return (stub error text, problem or None)."""
    for e in exercises:
        runner.run(stubs[e])  # a top-level stub raises here; the check must still fail
    failed = runner.run(nb.cells[index].source)
    if failed is None:
        return None, f"check cell[{index}] passed on the stub of exercise cells {exercises}"
    stub_error = f"{failed[0]}: {failed[1]}"
    if failed[0] not in _TEACHING_ERRORS:
        return stub_error, (
            f"check cell[{index}] failed on the stub with {stub_error}; it should raise "
            "CheckFailed with a message that teaches (use ddtk.course.checks.exercise)"
        )
    for e in exercises:
        error = runner.run(nb.cells[e].source)
        if error is not None:
            return stub_error, f"exercise cell[{e}] failed on its solution: {error[0]}: {error[1]}"
    error = runner.run(nb.cells[index].source)
    if error is not None:
        return stub_error, f"check cell[{index}] failed on the solution: {error[0]}: {error[1]}"
    return stub_error, None


def verify_lab_checks(
    solution: Path,
    parameters: Mapping[str, Any] | None = None,
    *,
    cell_timeout: float = 300.0,
    kernel_name: str = "python3",
) -> LabCheckReport:
    """Run ``solution`` once, trying each check cell on the stub and then on the solution.

    Runs in the notebook's directory with ``parameters`` assigned after its
    ``parameters`` cell. Stops at the first problem: later cells may depend on it.
    """
    import nbformat
    from nbclient import NotebookClient

    solution = Path(solution)
    nb = read_notebook(solution)
    stubs, covers = plan(nb, str(solution))
    report = LabCheckReport(solution)
    started = time.perf_counter()
    client = NotebookClient(
        nbformat.v4.new_notebook(), timeout=cell_timeout, kernel_name=kernel_name,
        resources={"metadata": {"path": str(solution.resolve().parent)}},
    )  # fmt: skip
    with client.setup_kernel(cwd=str(solution.resolve().parent)):
        runner = _Runner(client)
        for index, cell in enumerate(nb.cells):
            if cell.get("cell_type") != "code" or index in stubs:
                continue  # exercise cells run with their check
            if index in covers:
                t0 = time.perf_counter()
                stub_error, problem = _run_check(runner, nb, index, covers[index], stubs)
                if stub_error is not None:
                    outcome = CheckOutcome(
                        index, tuple(covers[index]), stub_error, time.perf_counter() - t0
                    )
                    report.outcomes.append(outcome)
            else:
                error = runner.run(cell.source)
                problem = None if error is None else f"cell[{index}] failed: {error[0]}: {error[1]}"
                if error is None and PARAMETERS_TAG in _tags(cell) and parameters:
                    runner.run(_assignments(parameters))
            if problem:
                report.problems.append(problem)
                break
    report.seconds = time.perf_counter() - started
    return report


__all__ = ["CHECK_TAG", "CheckOutcome", "LabCheckReport", "plan", "verify_lab_checks"]
