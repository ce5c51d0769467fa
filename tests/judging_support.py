"""What the tests of judged exercises share: a notebook's solution and stub, a notebook
with one cell replaced, and a mutant matrix with every row as expected."""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from ddtk.course.judging import LabJudge
from ddtk.course.judging.mutants import MatrixRow, mutant_matrix, stub_lecture

ROOT = Path(__file__).resolve().parents[1]


def notebook_pair(path: Path) -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    """The solution at ``path`` and its stub: a lab's generated ``labs/`` copy, or a
    lecture stubbed in memory."""
    solution = nbformat.read(path, as_version=4)
    if path.parent.name == "course":
        return solution, stub_lecture(solution, path.name)[0]
    return solution, nbformat.read(ROOT / "labs" / path.name, as_version=4)


def with_cell(nb: nbformat.NotebookNode, cell_id: str, source: str) -> nbformat.NotebookNode:
    """A copy of ``nb`` with cell ``cell_id``'s source replaced."""
    nb = copy.deepcopy(nb)
    next(c for c in nb.cells if c.get("id") == cell_id).source = source
    return nb


def proved_matrix(
    judge: LabJudge, solution: nbformat.NotebookNode, stub: nbformat.NotebookNode, mutants: dict
) -> dict[str, str]:
    """Run the matrix; fail on any unexpected row or an exercise with fewer than three
    mutants; return each variant's message, for asserting that it says why."""
    rows: list[MatrixRow] = mutant_matrix(judge, solution, stub, mutants)
    bad = [r for r in rows if not r.ok]
    assert not bad, "\n".join(f"{r.exercise} {r.variant}: {r.status} {r.message}" for r in bad)
    for number in judge.exercises:
        assert len(mutants.get(number, {})) >= 3, f"exercise {number} has fewer than 3 mutants"
    return {r.variant: r.message for r in rows}


def assert_shortcuts_earn_nothing(
    judge: LabJudge, solution: nbformat.NotebookNode, cases: dict[int, tuple[str, str, str]]
) -> None:
    """Each ``{exercise: (cell id, answer source, words)}`` earns nothing, with ``words``
    in the message (the caller has made starting a worker impossible)."""
    from ddtk.course.judging import judge_notebook

    for number, (cell_id, source, words) in cases.items():
        nb = with_cell(solution, cell_id, source)
        verdict = judge_notebook(judge, solution, nb, only=(number,))[number]
        assert verdict.status == "fail" and "earns nothing" in verdict.message, verdict
        assert words in verdict.message, verdict
