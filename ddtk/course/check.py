"""Repository checks for the course notebooks, and the ``strip`` fix for the first of them.

:func:`check_repo` enforces the notebook conventions of the course kit:

- ``outputs``: no notebook under ``course/``, ``solutions/``, ``labs/`` or ``quizzes/``
  stores outputs or execution counts (run :func:`strip_paths` / ``ddtk course strip``);
- ``labs``: ``labs/`` is exactly what ``ddtk course build`` generates from ``solutions/``;
- ``parameters``: every notebook of ``course/`` and ``solutions/`` has exactly one code
  cell tagged ``parameters``, and it is the first code cell, so papermill can override
  the laptop defaults.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ddtk.course.notebooks import (
    EXECUTED_DIRS,
    NOTEBOOK_DIRS,
    PARAMETERS_TAG,
    NotebookError,
    code_cell_indices,
    has_outputs,
    iter_notebooks,
    read_notebook,
    repo_notebooks,
    strip_outputs,
    tagged_cell_indices,
    write_notebook,
)

if TYPE_CHECKING:
    from nbformat import NotebookNode


@dataclass(frozen=True)
class Finding:
    """One problem found by :func:`check_repo`.

    ``check`` is ``"outputs"``, ``"labs"``, ``"parameters"``, ``"points"`` or ``"unreadable"``;
    ``cell`` is the 0-based cell index when the problem is in one cell.
    """

    check: str
    path: Path
    message: str
    cell: int | None = None


def _output_findings(path: Path, nb: NotebookNode) -> list[Finding]:
    cells = [i for i, cell in enumerate(nb.cells) if has_outputs(cell)]
    if not cells:
        return []
    shown = ", ".join(f"cell[{i}]" for i in cells[:5]) + (" ..." if len(cells) > 5 else "")
    return [
        Finding(
            "outputs",
            path,
            f"{len(cells)} code cell(s) store outputs or execution counts ({shown}); "
            "run `ddtk course strip`",
            cells[0],
        )
    ]


def _parameter_findings(path: Path, nb: NotebookNode) -> list[Finding]:
    tagged = tagged_cell_indices(nb, PARAMETERS_TAG)
    code = code_cell_indices(nb)
    if not tagged:
        first = f"cell[{code[0]}]" if code else "a first code cell"
        return [
            Finding(
                "parameters",
                path,
                f"no code cell tagged '{PARAMETERS_TAG}'; tag {first} holding the laptop defaults",
            )
        ]
    if len(tagged) > 1:
        cells = ", ".join(f"cell[{i}]" for i in tagged)
        return [
            Finding(
                "parameters",
                path,
                f"{len(tagged)} code cells tagged '{PARAMETERS_TAG}' ({cells}); keep exactly one",
                tagged[1],
            )
        ]
    if tagged[0] != code[0]:
        return [
            Finding(
                "parameters",
                path,
                f"the '{PARAMETERS_TAG}' cell is cell[{tagged[0]}] but the first code cell is "
                f"cell[{code[0]}]; move it first",
                tagged[0],
            )
        ]
    return []


def check_notebooks(root: Path) -> list[Finding]:
    """The ``outputs`` and ``parameters`` findings for the notebooks under ``root``."""
    findings: list[Finding] = []
    executed = [root / d for d in EXECUTED_DIRS]
    for path in repo_notebooks(root, NOTEBOOK_DIRS):
        try:
            nb = read_notebook(path)
        except NotebookError as exc:
            findings.append(Finding("unreadable", path, str(exc)))
            continue
        findings += _output_findings(path, nb)
        if any(path.is_relative_to(d) for d in executed):
            findings += _parameter_findings(path, nb)
    return findings


def check_labs(root: Path) -> list[Finding]:
    """The ``labs`` findings: what differs between ``labs/`` and a fresh build of ``solutions/``."""
    from ddtk.course.build import diff_labs

    src, dst = root / "solutions", root / "labs"
    if not src.is_dir():
        return [] if not dst.is_dir() else _orphans_without_solutions(dst)
    try:
        differences = diff_labs(src, dst)
    except NotebookError as exc:
        return [Finding("labs", src, f"cannot build labs: {exc}")]
    hint = {"missing": "run `ddtk course build`", "stale": "run `ddtk course build`"}
    hint["orphan"] = "delete it or run `ddtk course build`"
    return [
        Finding("labs", dst / d.name, f"{d.kind}: {d.detail}; {hint[d.kind]}") for d in differences
    ]


def check_points(root: Path) -> list[Finding]:
    """The ``points`` findings: a lab whose ``metadata.ddtk.points`` does not weigh every
    exercise, or names one it does not have (what ``ddtk course grade`` would refuse)."""
    from ddtk.course.grading.score import lab_checks, lab_points

    findings = []
    for path in sorted((root / "solutions").glob("lab*.ipynb")):
        try:
            solution = read_notebook(path)
            if "points" not in solution.metadata.get("ddtk", {}):
                continue  # one point per exercise: nothing to check
            lab_points(solution, lab_checks(solution, path.name), path.name)
        except NotebookError as exc:
            findings.append(Finding("points", path, str(exc)))
    return findings


def _orphans_without_solutions(dst: Path) -> list[Finding]:
    return [
        Finding("labs", path, "orphan: there is no solutions/ directory to generate it from")
        for path in sorted(dst.glob("*.ipynb"))
    ]


def check_repo(root: Path) -> list[Finding]:
    """Run every check on the course repository at ``root``; an empty list means all is well."""
    if not any((root / d).is_dir() for d in NOTEBOOK_DIRS):
        dirs = ", ".join(f"{d}/" for d in NOTEBOOK_DIRS)
        raise NotebookError(f"{root}: none of {dirs} exists; is this the course repository?")
    return check_notebooks(root) + check_labs(root) + check_points(root)


def strip_paths(paths: Iterable[Path]) -> list[Path]:
    """Strip outputs and execution counts, in place, from the notebooks under ``paths``.

    Returns the notebooks that changed; notebooks already clean are not rewritten.
    """
    changed = []
    for path in iter_notebooks(paths):
        nb = read_notebook(path)
        if strip_outputs(nb):
            write_notebook(nb, path)
            changed.append(path)
    return changed
