"""Generate ``labs/`` from ``solutions/``: the solution notebooks with the answers taken out.

``solutions/`` is the single source. In a code cell an answer sits between two lines::

    # BEGIN SOLUTION ring all-reduce
    ...answer...
    # END SOLUTION

and becomes one line at the indentation of ``# BEGIN SOLUTION``::

    raise NotImplementedError("Exercise 2: ring all-reduce")

where the number counts the code exercises of the notebook in order and the title is
the optional text after ``# BEGIN SOLUTION``. Blocks of one cell with the same title
are one exercise (an answer spread over two functions) and share its number. In a
markdown cell, text between the lines ``<!-- BEGIN SOLUTION -->`` and
``<!-- END SOLUTION -->`` is removed (and a cell left empty is dropped). Markers must be lines of their own; a marker anywhere
else, or an unbalanced one, is an error naming the notebook and the cell, so an
answer can never leak into a lab. Labs are written stripped of outputs in nbformat's
stable JSON, so regenerating them and comparing bytes tells whether ``labs/`` is up
to date (:func:`diff_labs`).
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ddtk.course.notebooks import (
    NotebookError,
    dumps_notebook,
    read_notebook,
    strip_outputs,
)

if TYPE_CHECKING:
    from nbformat import NotebookNode

_CODE_BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION(?:[ \t]+(?P<title>.*?))?[ \t\r]*$")
_CODE_END = re.compile(r"^[ \t]*# END SOLUTION[ \t\r]*$")
_MD_BEGIN = re.compile(r"^[ \t]*<!--[ \t]*BEGIN SOLUTION[ \t]*-->[ \t\r]*$")
_MD_END = re.compile(r"^[ \t]*<!--[ \t]*END SOLUTION[ \t]*-->[ \t\r]*$")
_ANY_MARKER = re.compile(r"(BEGIN|END) SOLUTION")


class MarkerError(NotebookError):
    """A solution marker is unbalanced or malformed; the message names notebook, cell and line."""


@dataclass
class Lab:
    """One generated lab: its file name, serialized text and the exercise titles it stubs out."""

    source: Path
    name: str
    text: str
    exercises: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LabDifference:
    """How one file of ``labs/`` differs from what :func:`build_labs` would write.

    ``kind`` is ``"missing"`` (no lab for a solution), ``"stale"`` (the lab differs) or
    ``"orphan"`` (a lab with no solution).
    """

    name: str
    kind: str
    detail: str


def _where(notebook: str, cell_index: int, line_no: int | None = None) -> str:
    line = f", line {line_no}" if line_no is not None else ""
    return f"{notebook}: cell[{cell_index}]{line}"


def _stub_code(
    source: str, notebook: str, cell_index: int, first_exercise: int
) -> tuple[str, list[str]]:
    """Replace each solution block of a code cell's source; return the new source and titles."""
    out: list[str] = []
    titles: list[str] = []
    open_at: int | None = None
    for line_no, line in enumerate(source.split("\n"), start=1):
        begin, end = _CODE_BEGIN.match(line), _CODE_END.match(line)
        if begin:
            if open_at is not None:
                raise MarkerError(
                    f"{_where(notebook, cell_index, line_no)}: '# BEGIN SOLUTION' inside the block "
                    f"opened on line {open_at}; close it with '# END SOLUTION' first"
                )
            open_at = line_no
            title = (begin.group("title") or "").strip()
            if title and title in titles:  # another block of the same exercise (two functions)
                number = first_exercise + titles.index(title)
            else:
                number = first_exercise + len(titles)
                titles.append(title)
            message = f"Exercise {number}: {title}" if title else f"Exercise {number}"
            out.append(
                f"{begin.group('indent')}raise NotImplementedError({json.dumps(message, ensure_ascii=False)})"
            )
        elif end:
            if open_at is None:
                raise MarkerError(
                    f"{_where(notebook, cell_index, line_no)}: '# END SOLUTION' without a "
                    "matching '# BEGIN SOLUTION'"
                )
            open_at = None
        elif open_at is None:
            _reject_stray_marker(line, notebook, cell_index, line_no, "# BEGIN SOLUTION [title]")
            out.append(line)
    if open_at is not None:
        raise MarkerError(
            f"{_where(notebook, cell_index, open_at)}: '# BEGIN SOLUTION' is never closed "
            "by '# END SOLUTION' in the same cell"
        )
    return "\n".join(out), titles


def _strip_markdown(source: str, notebook: str, cell_index: int) -> str:
    """Remove the solution blocks of a markdown cell's source."""
    out: list[str] = []
    open_at: int | None = None
    for line_no, line in enumerate(source.split("\n"), start=1):
        if _MD_BEGIN.match(line):
            if open_at is not None:
                raise MarkerError(
                    f"{_where(notebook, cell_index, line_no)}: '<!-- BEGIN SOLUTION -->' inside "
                    f"the block opened on line {open_at}"
                )
            open_at = line_no
        elif _MD_END.match(line):
            if open_at is None:
                raise MarkerError(
                    f"{_where(notebook, cell_index, line_no)}: '<!-- END SOLUTION -->' without a "
                    "matching '<!-- BEGIN SOLUTION -->'"
                )
            open_at = None
        elif open_at is None:
            _reject_stray_marker(line, notebook, cell_index, line_no, "<!-- BEGIN SOLUTION -->")
            out.append(line)
    if open_at is not None:
        raise MarkerError(
            f"{_where(notebook, cell_index, open_at)}: '<!-- BEGIN SOLUTION -->' is never closed "
            "by '<!-- END SOLUTION -->' in the same cell"
        )
    text = "\n".join(out)
    # Blank lines that separated the question from a removed answer would trail the cell.
    return text.rstrip() if len(out) < source.count("\n") + 1 else text


def _reject_stray_marker(
    line: str, notebook: str, cell_index: int, line_no: int, form: str
) -> None:
    """Refuse a line that mentions a marker without being one, so no answer leaks into a lab."""
    if _ANY_MARKER.search(line):
        raise MarkerError(
            f"{_where(notebook, cell_index, line_no)}: {line.strip()!r} looks like a solution "
            f"marker but is not one; markers are lines of their own, such as {form!r}"
        )


def build_lab(nb: NotebookNode, notebook: str = "<notebook>") -> tuple[NotebookNode, list[str]]:
    """Return a stripped copy of solution notebook ``nb`` with its answers removed, and the exercise titles.

    ``notebook`` names the notebook in error messages. ``nb`` itself is not changed.
    """
    lab = copy.deepcopy(nb)
    titles: list[str] = []
    kept = []
    for index, cell in enumerate(lab.cells):
        if cell.get("cell_type") == "code":
            cell["source"], new = _stub_code(
                cell.get("source", ""), notebook, index, len(titles) + 1
            )
            titles.extend(new)
        elif cell.get("cell_type") == "markdown":
            before = cell.get("source", "")
            cell["source"] = _strip_markdown(before, notebook, index)
            if before.strip() and not cell["source"].strip():
                continue  # the cell held only an answer
        kept.append(cell)
    lab.cells = kept
    strip_outputs(lab)
    return lab, titles


def render_labs(src: Path) -> list[Lab]:
    """Build, in memory, the lab of every ``*.ipynb`` directly in ``src`` (sorted by name)."""
    if not src.is_dir():
        raise NotebookError(f"{src}: no such directory of solution notebooks")
    labs = []
    for path in sorted(src.glob("*.ipynb")):
        lab, titles = build_lab(read_notebook(path), str(path))
        labs.append(Lab(source=path, name=path.name, text=dumps_notebook(lab), exercises=titles))
    return labs


def build_labs(src: Path, dst: Path, *, remove_orphans: bool = True) -> list[Path]:
    """Write the lab of every solution notebook in ``src`` into ``dst``; return the lab paths.

    Everything is rendered before anything is written, so a marker error leaves ``dst``
    as it was. With ``remove_orphans``, notebooks in ``dst`` that no longer have a
    solution are deleted: ``labs/`` holds generated files only.
    """
    labs = render_labs(src)
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for lab in labs:
        path = dst / lab.name
        data = lab.text.encode("utf-8")
        if not (path.is_file() and path.read_bytes() == data):
            path.write_bytes(data)
        written.append(path)
    if remove_orphans:
        names = {lab.name for lab in labs}
        for path in sorted(dst.glob("*.ipynb")):
            if path.name not in names:
                path.unlink()
    return written


def _first_difference(expected: Path, actual: Path) -> str:
    """Say where two notebook files first differ, to point a reviewer at the stale part."""
    try:
        want, have = json.loads(expected.read_text("utf-8")), json.loads(actual.read_text("utf-8"))
    except (OSError, ValueError):
        return "not a readable notebook"
    want_cells, have_cells = want.get("cells", []), have.get("cells", [])
    for index, (a, b) in enumerate(zip(want_cells, have_cells)):
        if a != b:
            return f"differs from its solution at cell[{index}]"
    if len(want_cells) != len(have_cells):
        return f"has {len(have_cells)} cells where the solution gives {len(want_cells)}"
    if want != have:
        return "notebook metadata differs"
    return "formatting differs (not written by `ddtk course build`)"


def diff_labs(src: Path, dst: Path) -> list[LabDifference]:
    """Build the labs of ``src`` into a temporary directory and compare them with ``dst``.

    Returns one :class:`LabDifference` per lab that is missing, stale or orphaned; an
    empty list means ``dst`` is up to date. Nothing under ``dst`` is written.
    """
    with tempfile.TemporaryDirectory(prefix="ddtk-labs-") as tmp:
        fresh = Path(tmp)
        build_labs(src, fresh, remove_orphans=False)
        differences = []
        for path in sorted(fresh.glob("*.ipynb")):
            current = dst / path.name
            if not current.is_file():
                differences.append(LabDifference(path.name, "missing", "not generated yet"))
            elif current.read_bytes() != path.read_bytes():
                differences.append(
                    LabDifference(path.name, "stale", _first_difference(path, current))
                )
        expected = {p.name for p in fresh.glob("*.ipynb")}
    if dst.is_dir():
        for path in sorted(dst.glob("*.ipynb")):
            if path.name not in expected:
                differences.append(LabDifference(path.name, "orphan", f"has no notebook in {src}"))
    return differences


__all__ = [
    "Lab",
    "LabDifference",
    "MarkerError",
    "build_lab",
    "build_labs",
    "diff_labs",
    "render_labs",
]
