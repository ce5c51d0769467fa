"""The shape rules of a lecture: how long it is, how long one cell is, what it ends with.

A lecture's *main path* is its notebook; reference material lives in ``resources/``, and
material that runs but would push a lecture past its time lives in an appendix notebook
(``course/appendix/NN-*.ipynb``), which keeps every rule but the word range.
:func:`prose_words` counts the words a reader reads in a markdown cell: fenced code
blocks and HTML tags are not prose. :func:`shape_findings` returns one sentence per
broken rule, which ``ddtk course check`` prints and the test suite asserts empty:

- a lecture's prose stays between the module overview's minimum and :data:`MAX_WORDS`;
- no markdown cell holds more than :data:`MAX_CELL_WORDS` words;
- every lecture and lab has a troubleshooting section (a heading that names it);
- an exercise answer (a code cell with ``# BEGIN SOLUTION``) in a lecture is collapsed
  (``metadata.jupyter.source_hidden``), so a learner opens it on purpose.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MAX_WORDS = 8000
MAX_CELL_WORDS = 600
# The module overview's minimum words per lecture, by lecture number.
MIN_WORDS = {1: 5000, 2: 5000, 3: 4500, 4: 4500, 5: 4000, 6: 4500, 7: 5000}

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_TAG = re.compile(r"<[^>\n]+>")
_TROUBLESHOOTING = re.compile(
    r"^#{2,3}\s+(?:\d+\.\s+)?Troubleshooting\b", re.MULTILINE | re.IGNORECASE
)


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return src if isinstance(src, str) else "".join(src)


def prose_words(markdown: str) -> int:
    """Words of prose in ``markdown``: fenced code blocks and HTML tags left out."""
    return len(_TAG.sub(" ", _FENCE.sub(" ", markdown)).split())


def lecture_words(cells: list[dict[str, Any]]) -> int:
    """Prose words of every markdown cell of a notebook."""
    return sum(prose_words(_source(c)) for c in cells if c.get("cell_type") == "markdown")


def is_answer(cell: dict[str, Any]) -> bool:
    """A code cell that holds an exercise's answer."""
    return cell.get("cell_type") == "code" and "# BEGIN SOLUTION" in _source(cell)


def is_collapsed(cell: dict[str, Any]) -> bool:
    """JupyterLab and Notebook 7 show this cell's source folded until it is clicked."""
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def _lecture_number(path: Path) -> int | None:
    """The lecture ``path`` is (``course/NN-*.ipynb``); None for a lab or an appendix."""
    if path.parent.name == "appendix":
        return None
    head = path.name.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def shape_findings(path: Path, cells: list[dict[str, Any]]) -> list[str]:
    """What breaks the shape rules in notebook ``path`` (its ``cells``); empty when none."""
    found = []
    for i, cell in enumerate(cells):
        if cell.get("cell_type") == "markdown":
            words = prose_words(_source(cell))
            if words > MAX_CELL_WORDS:
                found.append(f"cell[{i}] ({cell.get('id')}) holds {words} words of prose, "
                             f"more than {MAX_CELL_WORDS}: split it at a heading")  # fmt: skip
    if not any(
        _TROUBLESHOOTING.search(_source(c)) for c in cells if c.get("cell_type") == "markdown"
    ):
        found.append("no troubleshooting section (a '## Troubleshooting' heading)")
    number = _lecture_number(path)
    if number is None:
        return found
    words, low = lecture_words(cells), MIN_WORDS.get(number, 0)
    if not low <= words <= MAX_WORDS:
        found.append(f"{words} words of prose, outside {low}-{MAX_WORDS}: move reference "
                     "material to resources/ or cut repetition")  # fmt: skip
    for i, cell in enumerate(cells):
        if is_answer(cell) and not is_collapsed(cell):
            found.append(f"cell[{i}] ({cell.get('id')}) shows an exercise's answer: "
                         "collapse it (metadata.jupyter.source_hidden)")  # fmt: skip
    return found
