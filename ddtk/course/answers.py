"""A lecture exercise's answer, collapsed below the learner's own cell.

A lecture hands the learner whole: the answer must be there (CI runs it, and a learner
who is stuck reads it), but not in view before the learner has tried. Each exercise is
therefore two code cells before its check:

1. the *attempt* cell, in view: the stub ``ddtk course build`` would write (the function's
   signature and docstring, its body ``raise NotImplementedError("Exercise N: ...")``).
   It keeps the exercise's cell id, so the judges (:mod:`ddtk.course.judges`) read what
   the learner wrote there;
2. the *answer* cell, collapsed (``metadata.jupyter.source_hidden``, tag ``answer``, id
   ``<attempt id>-answer``): the solution between ``# BEGIN SOLUTION`` and
   ``# END SOLUTION``, framed by :data:`HEAD` and :data:`TAIL`. Run as it is, it defines
   only what the attempt still leaves as the stub (:func:`ddtk.course.checks.keep_yours`),
   so the check that follows tests the learner's code when there is some, and the
   answer otherwise (a headless run).

:func:`answered_lecture` puts each answer back into its attempt cell, in memory: the
notebook as an answer key, which the mutant matrices judge.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbformat import NotebookNode

ANSWER_TAG = "answer"
ANSWER_SUFFIX = "-answer"
HEAD = (
    "# One answer, collapsed so that you open it on purpose. Run as it is, it keeps every\n"
    "# function you wrote in the cell above (the check then tests yours) and fills in the rest.\n"
    "from ddtk.course.checks import keep_yours\n"
    "\n"
    "_kept = keep_yours(globals())\n"
)
TAIL = "\n_kept.restore()"


def _source(cell: Any) -> str:
    src = cell.get("source", "")
    return src if isinstance(src, str) else "".join(src)


def is_answer_cell(cell: Any) -> bool:
    """A collapsed answer cell (tag ``answer``)."""
    return cell.get("cell_type") == "code" and ANSWER_TAG in cell.get("metadata", {}).get(
        "tags", []
    )


def answer_code(cell: Any) -> str:
    """The solution an answer cell holds, without its :data:`HEAD` and :data:`TAIL`."""
    source = _source(cell)
    if not (source.startswith(HEAD) and source.endswith(TAIL)):
        raise ValueError(f"answer cell {cell.get('id')} does not start and end with the keep lines")
    return source[len(HEAD) : -len(TAIL)]


def answer_cell(attempt_id: str, solution: str) -> dict[str, Any]:
    """The collapsed answer cell for the attempt cell ``attempt_id``."""
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": attempt_id + ANSWER_SUFFIX,
        "metadata": {"jupyter": {"source_hidden": True}, "tags": [ANSWER_TAG]},
        "outputs": [],
        "source": HEAD + solution + TAIL,
    }


def answered_lecture(lecture: NotebookNode) -> NotebookNode:
    """``lecture`` with each answer put back in its attempt cell: the answer key."""
    nb = copy.deepcopy(lecture)
    by_id = {c.get("id"): c for c in nb.cells}
    for cell in nb.cells:
        if not is_answer_cell(cell):
            continue
        attempt = by_id.get(cell["id"].removesuffix(ANSWER_SUFFIX))
        if attempt is None:
            raise ValueError(f"answer cell {cell['id']} has no attempt cell before it")
        attempt["source"] = answer_code(cell)
    return nb


__all__ = ["ANSWER_TAG", "HEAD", "TAIL", "answer_cell", "answer_code", "answered_lecture",
           "is_answer_cell"]  # fmt: skip
