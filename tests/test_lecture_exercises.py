"""Every lecture exercise passes its check as written, and fails it as the stub a learner starts from.

A lecture exercise is a code cell of ``course/*.ipynb`` with a ``# BEGIN SOLUTION`` block,
followed by its check cell (tagged ``check``). Each pair is self-contained, so the test
runs it alone, without the rest of the lecture: the exercise cell and then the check in
a fresh namespace must print "Exercise N passed"; the stub that ``ddtk course build``'s
``_stub_code`` makes of the exercise, then the check, must raise ``CheckFailed`` saying
that exercise N is not done yet. The numbers count the exercises of each lecture in
order, as in the labs. The tests only evaluate small functions (no processes, no Ray):
well under a second each once torch is imported.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from ddtk.course.build import _stub_code
from ddtk.course.checks import CheckFailed

ROOT = Path(__file__).resolve().parents[1]
LECTURES = sorted((ROOT / "course").glob("[0-9][0-9]-*.ipynb"))
BEGIN = re.compile(r"^[ \t]*# BEGIN SOLUTION(?:[ \t]+(.*?))?[ \t]*$", re.MULTILINE)


def _source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def _is_check(cell: dict) -> bool:
    return cell["cell_type"] == "code" and "check" in cell.get("metadata", {}).get("tags", [])


def lecture_exercises() -> list[tuple[str, int, str, str, str]]:
    """(notebook and cell id, exercise number, exercise source, stub source, check source) per exercise."""
    found = []
    for path in LECTURES:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        number = 1
        for i, cell in enumerate(cells):
            source = _source(cell)
            if cell["cell_type"] != "code" or not BEGIN.search(source):
                continue
            stub, titles = _stub_code(source, path.name, i, number)
            check = cells[i + 1] if i + 1 < len(cells) else None
            assert check is not None and _is_check(check), (
                f"{path.name} cell {cell['id']}: an exercise must be followed by its check cell"
            )
            found.append((f"{path.name}:{cell['id']}", number, source, stub, _source(check)))
            number += len(titles)
    return found


EXERCISES = lecture_exercises()


def _run(*sources: str) -> str:
    """Execute `sources` in order in one fresh namespace; return what they printed."""
    namespace: dict = {"__name__": "__lecture_exercise__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for src in sources:
            exec(compile(src, "<cell>", "exec"), namespace)
    return out.getvalue()


def test_the_lectures_have_exercises() -> None:
    assert {where.split(":")[0] for where, *_ in EXERCISES} >= {
        "01-distributed-fundamentals.ipynb",
        "02-ray.ipynb",
        "03-horovod-and-ddp.ipynb",
        "04-nccl-and-networking.ipynb",
    }


@pytest.mark.parametrize(
    ("where", "number", "exercise", "stub", "check"), EXERCISES, ids=[e[0] for e in EXERCISES]
)
def test_check_passes_on_the_answer_and_fails_on_the_stub(
    where: str, number: int, exercise: str, stub: str, check: str
) -> None:
    printed = _run(exercise, check)
    assert f"Exercise {number} passed" in printed, f"{where}: the check did not pass:\n{printed}"
    with pytest.raises(CheckFailed, match=rf"^Exercise {number} \(.+\) is not done yet: "):
        _run(stub, check)
