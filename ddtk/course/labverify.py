"""Prove that every check of a lab fails on the stub with a teaching message and passes on the answer.

:func:`verify_lab_checks` gathers its evidence from three runs, each a sandboxed run
(:func:`~ddtk.course.grading.sandbox.execute`) that an :class:`~ddtk.course.executions.ExecutionCache`
can share with a lab's graded class, so proving the checks costs no run of its own
where the class already made it:

1. **The solution, whole**, with the instructor's parameters: every cell must run
   without an error and every check must pass.
2. **The check matrix, at function level.** A check whose names all come from cheap
   cells (the set-up cells before the first exercise, the exercise cells, cells that
   only import and define, read by :mod:`~ddtk.course.cellnames`, and cells that took
   under ``CHEAP_S`` in run 1) is tried on its own, in a
   kernel that has run only the set-up cells: the cells it needs, the *stub* of its
   exercise and the check, which must raise ``CheckFailed``; then the answer and the
   check, which must pass. The answer's side is left to run 1 when the check took
   ``quick_s`` seconds or more there (a Ray Train job, say): the stub's side fails
   before it starts anything.
3. **The stub, whole** (the ``labs/`` notebook): for a check that needs cells which
   compute (a training run, a profile), the stub's own run shows it failing. Its
   message must still say that this exercise is not done yet.

Problems come back in :class:`~ddtk.course.labcheck.LabCheckReport`, not as exceptions.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddtk.course.cellnames import binds, only_defines, reads
from ddtk.course.labcheck import CheckOutcome, LabCheckReport, plan
from ddtk.course.notebooks import PARAMETERS_TAG, read_notebook

if TYPE_CHECKING:
    from nbformat import NotebookNode

    from ddtk.course.executions import ExecutionCache
    from ddtk.course.grading.sandbox import Execution

# What a check cell must raise on a stub: ddtk.course.checks.CheckFailed or its base.
TEACHING_ERRORS = frozenset({"CheckFailed", "AssertionError"})
QUICK_S = 10.0  # a check that took longer in the solution's run is not run again on the answer
CHEAP_S = 1.0  # a cell that took less may run again for a check that needs what it makes


def _code_cells(nb: NotebookNode) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if c.get("cell_type") == "code"]


def _definer(nb: NotebookNode, name: str, before: int) -> int | None:
    """The last code cell before ``before`` that binds ``name`` at its top level."""
    for index in reversed(_code_cells(nb)):
        if index < before and name in binds(nb.cells[index].source):
            return index
    return None


def closure(
    nb: NotebookNode,
    check: int,
    own: list[int],
    stubs: Mapping[int, str],
    cheap: AbstractSet[int] = frozenset(),
) -> list[int] | None:
    """The cells (besides the set-up cells and ``own``) that check ``check`` needs, or
    None when it needs a cell that is costly to run again.

    A cell may be run again when it only imports and defines, or when it is in
    ``cheap`` (it took under a second in the solution's run: a small data set made,
    say); one that trains, profiles or starts a cluster may not.
    """
    first_exercise = min(stubs)
    needed: set[int] = set()
    todo = [(name, check) for name in reads(nb.cells[check].source)]
    todo += [(name, e) for e in own for name in reads(nb.cells[e].source)]
    while todo:
        name, before = todo.pop()
        index = _definer(nb, name, before)
        if index is None:
            return None  # defined later, or by nothing a reader can see
        if index < first_exercise or index in own or index in needed:
            continue
        if index not in cheap and not only_defines(nb.cells[index].source):
            return None
        needed.add(index)
        todo += [(n, index) for n in reads(nb.cells[index].source)]
    return sorted(needed)


def _seconds(cell: NotebookNode) -> float | None:
    """How long ``cell`` ran, from the timestamps nbclient records, or None."""
    stamps = cell.get("metadata", {}).get("execution", {})
    start, end = stamps.get("iopub.execute_input"), stamps.get("shell.execute_reply")
    if not (start and end):
        return None
    parse = datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def _error(cell: NotebookNode | None) -> tuple[str, str] | None:
    """``(ename, evalue)`` of the first error output of an executed cell, or None."""
    for out in (cell or {}).get("outputs", []):
        if out.get("output_type") == "error":
            return out.get("ename", "Error"), out.get("evalue", "")
    return None


def _by_id(run: Execution) -> dict[str, NotebookNode]:
    """The cells of ``run`` that ran to the end, by id."""
    return {c.get("id"): c for i, c in enumerate(run.notebook.cells) if i in run.finished}


def _code(source: str, cell_id: str) -> NotebookNode:
    import nbformat

    cell = nbformat.v4.new_code_cell(source)
    cell["id"] = cell_id
    return cell


def _assignments(parameters: Mapping[str, Any]) -> str:
    return "\n".join(f"{key} = {value!r}" for key, value in parameters.items())


def matrix_notebook(
    nb: NotebookNode,
    parameters: Mapping[str, Any],
    checks: Mapping[int, tuple[list[int], list[int], bool]],
    stubs: Mapping[int, str],
) -> NotebookNode:
    """One notebook that runs the set-up cells once, then for each check of ``checks``
    (index -> (its exercise cells, the other cells it needs, answer side too)) the
    cells it needs, the stub and the check (id ``<check id>--stub``), then the answer
    and the check (``<check id>--answer``)."""
    import nbformat

    matrix = nbformat.v4.new_notebook()
    for index in _code_cells(nb):
        if index >= min(stubs):
            break
        matrix.cells.append(_code(nb.cells[index].source, f"setup-{index}"))
        if parameters and PARAMETERS_TAG in nb.cells[index].get("metadata", {}).get("tags", []):
            matrix.cells.append(_code(_assignments(parameters), "injected-parameters"))
    for check, (own, needed, answer_too) in checks.items():
        cid = nb.cells[check]["id"]
        matrix.cells += [_code(nb.cells[i].source, f"{cid}-needs-{i}") for i in needed]
        matrix.cells += [_code(stubs[e], f"{cid}-stub-{e}") for e in own]
        matrix.cells.append(_code(nb.cells[check].source, f"{cid}--stub"))
        if answer_too:
            matrix.cells += [_code(nb.cells[e].source, f"{cid}-answer-{e}") for e in own]
            matrix.cells.append(_code(nb.cells[check].source, f"{cid}--answer"))
    return matrix


class _Runs:
    """Sandboxed runs, through the cache when there is one."""

    def __init__(self, cache: ExecutionCache | None, name: str, timeout: float, memory_mb: int):
        self.cache, self.name, self.timeout, self.memory_mb = cache, name, timeout, memory_mb

    def run(self, nb: NotebookNode) -> Execution:
        from ddtk.course.grading.sandbox import execute

        limits = {"name": self.name, "timeout": self.timeout, "memory_mb": self.memory_mb}
        if self.cache is not None:
            return self.cache.sandboxed(nb, **limits)
        return execute(nb, **limits)


def _solution_problems(nb: NotebookNode, run: Execution, checks: list[int]) -> list[str]:
    """Every cell of the solution's whole run that failed, and every check that did not pass."""
    if run.status != "completed":
        return [f"the solution's run did not complete: {run.reason}"]
    ran = _by_id(run)
    problems = []
    for index in _code_cells(nb):
        error = _error(ran.get(nb.cells[index]["id"]))
        if error is None:
            continue
        where = "check cell" if index in checks else "cell"
        problems.append(f"{where}[{index}] failed on the solution: {error[0]}: {error[1]}")
    return problems


def _stub_problem(index: int, own: list[int], error: tuple[str, str] | None) -> str | None:
    if error is None:
        return f"check cell[{index}] passed on the stub of exercise cells {own}"
    if error[0] not in TEACHING_ERRORS:
        return (
            f"check cell[{index}] failed on the stub with {error[0]}: {error[1]}; it should raise "
            "CheckFailed with a message that teaches (use ddtk.course.checks.exercise)"
        )
    return None


def verify_lab_checks(
    solution: Path,
    parameters: Mapping[str, Any] | None = None,
    *,
    cache: ExecutionCache | None = None,
    stub: Path | None = None,
    stub_parameters: Mapping[str, Any] | None = None,
    timeout: float = 900.0,
    memory_mb: int = 8192,
    quick_s: float = QUICK_S,
) -> LabCheckReport:
    """Check every check cell of ``solution`` both ways (see the module docstring).

    ``stub`` is the learner's notebook (default: built from ``solution`` as ``ddtk
    course build`` builds it); ``stub_parameters`` are the parameters of its whole run
    (default: ``parameters``), so that a graded class's stub run can serve. ``timeout``
    and ``memory_mb`` limit each run as ``ddtk course grade`` does.
    """
    from ddtk.course.build import build_lab
    from ddtk.course.grading.restore import restore

    started = time.perf_counter()
    solution = Path(solution)
    nb = read_notebook(solution)
    stubs, covers = plan(nb, str(solution))
    params = dict(parameters or {})
    runs = _Runs(cache, solution.name, timeout, memory_mb)
    report = LabCheckReport(solution)

    report.solution_run = runs.run(restore(copy.deepcopy(nb), nb, params).notebook)
    report.problems += _solution_problems(nb, report.solution_run, list(covers))
    ran = _by_id(report.solution_run)
    took = {i: _seconds(ran.get(nb.cells[i]["id"], {})) for i in _code_cells(nb)}
    cheap = {i for i, s in took.items() if s is not None and s < CHEAP_S}
    checks: dict[int, tuple[list[int], list[int], bool]] = {}
    for index, own in covers.items():
        needed = closure(nb, index, own, stubs, cheap)
        if needed is not None:
            seconds = took[index]
            checks[index] = (own, needed, seconds is not None and seconds < quick_s)
    if checks:
        report.matrix_run = runs.run(matrix_notebook(nb, params, checks, stubs))
    if len(checks) < len(covers):
        learner = read_notebook(stub) if stub is not None else build_lab(nb, str(solution))[0]
        sp = params if stub_parameters is None else dict(stub_parameters)
        report.stub_run = runs.run(restore(learner, nb, sp).notebook)
    report.problems += _outcomes(report, nb, covers, checks)
    report.seconds = time.perf_counter() - started
    return report


def _outcomes(
    report: LabCheckReport,
    nb: NotebookNode,
    covers: Mapping[int, list[int]],
    checks: Mapping[int, tuple[list[int], list[int], bool]],
) -> list[str]:
    """Fill ``report.outcomes`` from the matrix and the stub's run; return the problems."""
    problems = []
    matrix = _by_id(report.matrix_run) if report.matrix_run is not None else {}
    stub_run = _by_id(report.stub_run) if report.stub_run is not None else {}
    for index, own in sorted(covers.items()):
        cid = nb.cells[index]["id"]
        if index in checks:
            level, cell = "function", matrix.get(f"{cid}--stub")
            answer = matrix.get(f"{cid}--answer")
            if answer is not None and _error(answer) is not None:
                error = _error(answer)
                problems.append(
                    f"check cell[{index}] failed on the solution, run on its own after the "
                    f"set-up cells: {error[0]}: {error[1]}"
                )
        else:
            level, cell = "notebook", stub_run.get(cid)
        if cell is None:
            problems.append(f"check cell[{index}] did not run on the stub ({level} level)")
            continue
        error = _error(cell)
        problem = _stub_problem(index, own, error)
        if problem:
            problems.append(problem)
        if error is not None:
            report.outcomes.append(
                CheckOutcome(index, tuple(own), f"{error[0]}: {error[1]}", _seconds(cell) or 0.0, level)
            )
    return problems


__all__ = ["CHEAP_S", "QUICK_S", "TEACHING_ERRORS", "closure", "matrix_notebook", "verify_lab_checks"]
