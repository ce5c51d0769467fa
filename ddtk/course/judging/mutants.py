"""The mutant matrix: the stub fails, the solution passes, every plausible wrong answer fails.

A lab's mutants live beside its solution (``solutions/mutants/labNN.py``, a ``MUTANTS``
dict; see that file), a lecture's with them (``solutions/mutants/lectureNN.py``).
:func:`mutant_matrix` judges the stub, the solution and each mutant, one exercise at a
time, and returns one row each; a row whose outcome is not the expected one is a hole
in the check (or a broken mutant, whose replacement text is no longer in the solution).
"""

from __future__ import annotations

import copy
import runpy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddtk.course.judging import LabJudge, judge_notebook

if TYPE_CHECKING:
    from nbformat import NotebookNode

Changes = tuple[str, list[tuple[str, str]]]


@dataclass(frozen=True)
class MatrixRow:
    """One judged variant: which exercise, which answer, what should and did happen."""

    exercise: int
    variant: str  # "stub", "solution" or the mutant's name
    expected: str  # "pass" or "fail"
    status: str
    message: str

    @property
    def ok(self) -> bool:
        return self.status == self.expected


def mutants_file(solution_path: Path) -> Path:
    """Where the mutants of the solution notebook ``solution_path`` live: beside a lab
    (``solutions/mutants/lab03.py``); for a lecture (``course/02-ray.ipynb``, which
    learners receive whole), with the labs' (``solutions/mutants/lecture02.py``)."""
    word = solution_path.stem.split("-")[0]
    if word.isdigit():
        return solution_path.parent.parent / "solutions" / "mutants" / f"lecture{word}.py"
    return solution_path.parent / "mutants" / f"{word}.py"


def stub_lecture(lecture: NotebookNode, notebook: str = "<lecture>") -> tuple[NotebookNode, int]:
    """A lecture as a learner starts its exercises, and how many it has: every code cell's
    solution blocks replaced by the stub ``ddtk course build`` writes for a lab, numbered
    in the same way. Markdown is left alone: a lecture's prose may name the markers."""
    from ddtk.course.answers import is_answer_cell
    from ddtk.course.build import _stub_code

    stub, count = copy.deepcopy(lecture), 0
    for index, cell in enumerate(stub.cells):
        if cell.get("cell_type") == "code":
            source = cell.get("source", "")
            if is_answer_cell(cell):  # a collapsed answer: the exercises its attempt just had
                _same, titles = _stub_code(source, notebook, index, 1)
                cell["source"], _ = _stub_code(source, notebook, index, count - len(titles) + 1)
                continue
            cell["source"], titles = _stub_code(source, notebook, index, count + 1)
            count += len(titles)
    return stub, count


def solution_notebook(path: Path) -> NotebookNode:
    """The answer key of notebook ``path``: a lab's solution as it is; a lecture with each
    collapsed answer put back into its attempt cell (:func:`ddtk.course.answers.answered_lecture`)."""
    from ddtk.course.answers import answered_lecture
    from ddtk.course.notebooks import read_notebook

    nb = read_notebook(path)
    return answered_lecture(nb) if path.stem.split("-")[0].isdigit() else nb


def load_mutants(path: Path) -> dict[int, dict[str, Changes]]:
    """The ``MUTANTS`` dict of a mutants file (instructor code: it is run to read it)."""
    return runpy.run_path(str(path))["MUTANTS"]


def mutate(solution: NotebookNode, changes: Changes) -> NotebookNode:
    """The solution with one cell's replacements applied; ValueError when one no longer applies."""
    cell_id, replacements = changes
    nb = copy.deepcopy(solution)
    cell = next((c for c in nb.cells if c.get("id") == cell_id), None)
    if cell is None:
        raise ValueError(f"the mutant changes cell {cell_id}, which the solution no longer has")
    for old, new in replacements:
        if old not in cell.source:
            raise ValueError(f"the mutant's text {old[:60]!r} is no longer in cell {cell_id}")
        cell.source = cell.source.replace(old, new)
    return nb


def mutant_matrix(
    judge: LabJudge,
    solution: NotebookNode,
    stub: NotebookNode,
    mutants: dict[int, dict[str, Changes]],
    *,
    on_row: Callable[[MatrixRow], None] | None = None,
    **judge_kw: Any,
) -> list[MatrixRow]:
    """Judge the stub, the solution and every mutant of every judged exercise.

    The variants are the instructor's own code, so their workers are forked from zygotes
    that ran the set-up once (:class:`~ddtk.course.judging.session.WorkerPool`): the
    verdicts are the grader's, without an interpreter and its imports per variant."""
    if "pool" not in judge_kw:
        from ddtk.course.judging.session import WorkerPool

        with WorkerPool() as pool:
            return mutant_matrix(
                judge, solution, stub, mutants, on_row=on_row, pool=pool, **judge_kw
            )
    rows = []

    def add(row: MatrixRow) -> None:
        rows.append(row)
        if on_row is not None:
            on_row(row)

    for number in sorted(judge.exercises):
        variants: list[tuple[str, str, NotebookNode | None, str]] = [
            ("stub", "fail", stub, ""), ("solution", "pass", solution, "")]  # fmt: skip
        for name, changes in mutants.get(number, {}).items():
            try:
                variants.append((name, "fail", mutate(solution, changes), ""))
            except ValueError as exc:
                variants.append((name, "fail", None, str(exc)))
        if len(variants) < 5:
            add(MatrixRow(number, "(mutants)", "3 or more", str(len(variants) - 2),
                          "fewer than three mutants for this exercise"))  # fmt: skip
        for name, expected, nb, broken in variants:
            if nb is None:
                add(MatrixRow(number, name, expected, "broken", broken))
                continue
            verdict = judge_notebook(judge, solution, nb, only=(number,), **judge_kw)[number]
            add(MatrixRow(number, name, expected, verdict.status, verdict.message))
    return rows


__all__ = ["MatrixRow", "load_mutants", "mutant_matrix", "mutants_file", "mutate", "solution_notebook",
           "stub_lecture"]  # fmt: skip
