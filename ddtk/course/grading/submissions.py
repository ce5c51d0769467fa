"""Find a class's lab notebooks and read each one, turning a bad file into a reason.

A submissions folder holds, per student, either a notebook file (``ann.ipynb``: the
student is ``ann``) or a folder (``ann/``) holding one ``.ipynb`` (checkpoint folders
and hidden files are ignored). Anything else at the top level (``bob.txt``) is a
submission that cannot be graded. Each problem becomes a one-sentence reason on that
student's row, never an exception that stops the class:

- the file is empty, not JSON, or JSON that is not a Jupyter notebook;
- the folder holds no notebook, or several;
- the notebook has no code cell;
- the notebook is another lab's: it shares none of the solution's cell ids and its
  title (first markdown heading) is not the solution's. A notebook with the
  solution's title but none of its ids (ids stripped by an old tool) is graded, with
  check cells matched by tag (see :mod:`ddtk.course.grading.restore`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nbformat import NotebookNode

_HEADING = re.compile(r"^\s*#+\s+(?P<title>.+?)\s*$", re.MULTILINE)


@dataclass
class Submission:
    """One student's hand-in: the path found, and the notebook or the reason it is unusable."""

    student: str
    path: Path
    notebook: NotebookNode | None = None
    error: str | None = None


def _visible(path: Path) -> bool:
    return not path.name.startswith(".")


def _one_notebook(folder: Path) -> tuple[Path, str | None]:
    """The single ``.ipynb`` inside a student's folder, or the folder and why it is unusable."""
    found = [
        p
        for p in sorted(folder.rglob("*.ipynb"))
        if p.is_file() and all(_visible(Path(part)) for part in p.relative_to(folder).parts)
        and ".ipynb_checkpoints" not in p.relative_to(folder).parts
    ]  # fmt: skip
    if not found:
        return folder, "the folder holds no .ipynb notebook"
    if len(found) > 1:
        names = ", ".join(str(p.relative_to(folder)) for p in found)
        return folder, f"the folder holds {len(found)} notebooks ({names}); hand in exactly one"
    return found[0], None


def find_submissions(folder: Path, skip: tuple[Path, ...] = ()) -> list[Submission]:
    """Every student entry directly in ``folder`` (sorted), with unreadable ones marked.

    Raises FileNotFoundError / NotADirectoryError when ``folder`` is not a folder. Paths
    under ``skip`` (the output folder) are left out. Notebooks are not read yet.
    """
    if not folder.exists():
        raise FileNotFoundError(f"no such folder: {folder}")
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder of submissions")
    skipped = [s.resolve() for s in skip]
    out: list[Submission] = []
    for entry in sorted(folder.iterdir()):
        resolved = entry.resolve()
        if not _visible(entry) or any(resolved == s or s in resolved.parents for s in skipped):
            continue
        if entry.is_dir():
            path, error = _one_notebook(entry)
            out.append(Submission(entry.name, path, error=error))
        elif entry.suffix == ".ipynb":
            out.append(Submission(entry.stem, entry))
        else:
            out.append(Submission(entry.name, entry, error="not a notebook (.ipynb) file"))
    return out


def notebook_title(nb: NotebookNode) -> str | None:
    """The first markdown heading of ``nb`` (its title), or None."""
    for cell in nb.cells:
        if cell.get("cell_type") == "markdown":
            match = _HEADING.search(cell.get("source", ""))
            if match:
                return match.group("title")
    return None


def cell_ids(nb: NotebookNode) -> set[str]:
    """The ids of ``nb``'s cells (notebooks before nbformat 4.5 have none)."""
    return {str(c["id"]) for c in nb.cells if c.get("id")}


def parse_notebook(text: str) -> NotebookNode:
    """Parse notebook JSON text; raise ValueError with a one-sentence reason when it is not one."""
    import warnings

    import nbformat

    if not text.strip():
        raise ValueError("the file is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ValueError("JSON, but not a Jupyter notebook (no list of cells)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a repeated cell id is reported by restoration
            nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except Exception as exc:  # nbformat raises several types for a bad schema
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"not a valid Jupyter notebook ({first[:160]})") from None
    raw = data["cells"]
    if len(raw) == len(nb.cells):  # nbformat renames a repeated id; restoration must see it
        for cell, original in zip(nb.cells, raw):
            if isinstance(original, dict) and isinstance(original.get("id"), str):
                cell["id"] = original["id"]
    if not any(c.get("cell_type") == "code" for c in nb.cells):
        raise ValueError("the notebook has no code cells")
    return nb


def other_lab(nb: NotebookNode, solution: NotebookNode, solution_path: Path) -> str | None:
    """Why ``nb`` is not the lab of ``solution`` (None when it is), naming the lab it looks like."""
    if cell_ids(nb) & cell_ids(solution):
        return None
    title, expected = notebook_title(nb), notebook_title(solution)
    if title is not None and title == expected:
        return None
    from ddtk.course.notebooks import NotebookError, read_notebook

    for other in sorted(solution_path.parent.glob("*.ipynb")):
        if other.resolve() == solution_path.resolve():
            continue
        try:
            theirs = read_notebook(other)
        except NotebookError:
            continue
        if cell_ids(nb) & cell_ids(theirs) or (title and title == notebook_title(theirs)):
            return f"this is another lab's notebook ({other.stem}), not {solution_path.stem}"
    shown = f"its title is {title!r}" if title else "it has no title"
    return f"this is not {solution_path.stem}: it shares no cells with the lab and {shown}"


def load(sub: Submission, solution: NotebookNode, solution_path: Path) -> Submission:
    """Read ``sub``'s notebook and check it is this lab's; set ``notebook`` or ``error``."""
    if sub.error is not None:
        return sub
    try:
        text = sub.path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        sub.error = "not a notebook: the file is not UTF-8 text"
        return sub
    except OSError as exc:
        sub.error = f"the file cannot be read ({exc.strerror or exc})"
        return sub
    try:
        nb = parse_notebook(text)
    except ValueError as exc:
        sub.error = str(exc)
        return sub
    sub.error = other_lab(nb, solution, solution_path)
    sub.notebook = nb if sub.error is None else None
    return sub


__all__ = [
    "Submission",
    "cell_ids",
    "find_submissions",
    "load",
    "notebook_title",
    "other_lab",
    "parse_notebook",
]
