"""Shared notebook helpers for ``ddtk course``: read, write, strip, find cells and notebooks.

Every course tool reads and writes notebooks through these functions, so they all
agree on one JSON layout (nbformat's: sorted keys, one-space indent, a final
newline) and on what "stripped" means. nbformat is imported inside the functions
to keep ``ddtk --help`` fast.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbformat import NotebookNode

PARAMETERS_TAG = "parameters"
# Directories of the repository that hold notebooks, in the order tools report them.
NOTEBOOK_DIRS: tuple[str, ...] = ("course", "solutions", "labs", "quizzes")
# Directories whose notebooks must start with a ``parameters`` cell (labs/ is generated
# from solutions/ and quizzes/ are not executed by ``ddtk course run``).
EXECUTED_DIRS: tuple[str, ...] = ("course", "solutions")
# Cell metadata written by Jupyter or papermill while executing; stripped with the outputs.
_EXECUTION_CELL_METADATA = ("execution", "papermill")
# Notebook metadata written while executing: papermill's record and saved widget state.
_EXECUTION_NB_METADATA = ("papermill", "widgets")


class NotebookError(ValueError):
    """A notebook cannot be used as asked; the message names the notebook and says why."""


def read_notebook(path: Path) -> NotebookNode:
    """Read ``path`` as an nbformat v4 notebook, with a clear error for a broken file."""
    import nbformat

    try:
        return nbformat.read(str(path), as_version=4)
    except FileNotFoundError:
        raise NotebookError(f"{path}: no such notebook") from None
    except Exception as exc:  # nbformat raises several types for bad JSON or schema
        raise NotebookError(f"{path}: not a readable notebook ({exc})") from exc


def dumps_notebook(nb: NotebookNode) -> str:
    """Serialize ``nb`` the way every course tool writes it: nbformat JSON plus a final newline.

    The text depends only on the notebook's content, so regenerating a notebook and
    comparing bytes tells whether it changed.
    """
    import nbformat

    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def write_notebook(nb: NotebookNode, path: Path) -> bool:
    """Write ``nb`` to ``path`` (creating parents); return False when the file already held it.

    Leaving an identical file untouched keeps its modification time, so tools that
    watch files do not see a change that did not happen.
    """
    text = dumps_notebook(nb)
    data = text.encode("utf-8")
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


def has_outputs(cell: dict[str, Any]) -> bool:
    """True when a code cell stores outputs or an execution count."""
    if cell.get("cell_type") != "code":
        return False
    return bool(cell.get("outputs")) or cell.get("execution_count") is not None


def strip_outputs(nb: NotebookNode) -> bool:
    """Remove outputs, execution counts and execution metadata from ``nb`` in place.

    Returns True when anything was removed. Besides outputs and counts this drops the
    per-cell timing Jupyter records (``metadata.execution``), papermill's records and
    saved widget state, all of which change on every run and make diffs noisy.
    """
    changed = False
    for cell in nb.cells:
        meta = cell.get("metadata", {})
        for key in _EXECUTION_CELL_METADATA:
            if key in meta:
                del meta[key]
                changed = True
        if cell.get("cell_type") != "code":
            continue
        if has_outputs(cell):
            changed = True
        cell["outputs"] = []
        cell["execution_count"] = None
    for key in _EXECUTION_NB_METADATA:
        if key in nb.metadata:
            del nb.metadata[key]
            changed = True
    return changed


def code_cell_indices(nb: NotebookNode) -> list[int]:
    """Indices (0-based, among all cells) of the code cells of ``nb``."""
    return [i for i, cell in enumerate(nb.cells) if cell.get("cell_type") == "code"]


def tagged_cell_indices(nb: NotebookNode, tag: str) -> list[int]:
    """Indices of the code cells of ``nb`` whose ``metadata.tags`` contain ``tag``."""
    return [
        i for i in code_cell_indices(nb) if tag in nb.cells[i].get("metadata", {}).get("tags", [])
    ]


def parameter_names(source: str) -> set[str] | None:
    """Names assigned at top level in a ``parameters`` cell, or None if it is not plain Python.

    Used to warn about a ``-p`` name the notebook does not declare (a likely typo).
    """
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def iter_notebooks(paths: Iterable[Path]) -> Iterator[Path]:
    """Yield the ``.ipynb`` files named by ``paths`` (files, or directories searched recursively).

    Hidden directories such as ``.ipynb_checkpoints`` are skipped; the order is sorted
    so reports are stable.
    """
    for path in paths:
        if path.is_file():
            yield path
            continue
        if not path.is_dir():
            continue
        for found in sorted(path.rglob("*.ipynb")):
            parts = found.relative_to(path).parts
            if not any(part.startswith(".") for part in parts):
                yield found


def repo_notebooks(root: Path, dirs: Iterable[str] = NOTEBOOK_DIRS) -> list[Path]:
    """Notebooks under the named top-level directories of ``root`` (missing ones are skipped)."""
    return list(iter_notebooks(root / d for d in dirs))


def find_root(start: Path | None = None) -> Path:
    """The course repository to work on: the nearest directory at or above ``start`` with notebooks.

    A directory counts when it has a ``course/`` or ``solutions/`` directory. When none
    is found, the checkout ``ddtk`` itself was imported from is used.
    """
    from ddtk.course.catalog import REPO_ROOT

    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "course").is_dir() or (candidate / "solutions").is_dir():
            return candidate
    return REPO_ROOT


def display_path(path: Path, base: Path | None = None) -> str:
    """``path`` relative to ``base`` (default: the working directory) when inside it, else absolute."""
    base = (base or Path.cwd()).resolve()
    resolved = path.resolve()
    try:
        return str(resolved.relative_to(base))
    except ValueError:
        return str(resolved)
