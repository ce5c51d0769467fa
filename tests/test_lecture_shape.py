"""The shape of the lectures and labs (:mod:`ddtk.course.shape`), and their collapsed answers.

- every lecture stays within its word range, no markdown cell runs past 600 words,
  every lecture and lab has a troubleshooting section, and no lecture shows an
  exercise's answer in view;
- each collapsed answer follows its attempt cell, which holds exactly the stub of that
  answer (so what the learner sees is the exercise, never the solution);
- the rules themselves catch what they name, and :func:`keep_yours` keeps a learner's
  own function across the answer cell while filling in a stub.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from ddtk.course.answers import (
    ANSWER_SUFFIX,
    answer_cell,
    answer_code,
    answered_lecture,
    is_answer_cell,
)
from ddtk.course.build import _stub_code
from ddtk.course.checks import keep_yours
from ddtk.course.shape import MAX_CELL_WORDS, prose_words, shape_findings

ROOT = Path(__file__).resolve().parents[1]
LECTURES = sorted((ROOT / "course").glob("[0-9][0-9]-*.ipynb"))
APPENDICES = sorted((ROOT / "course" / "appendix").glob("[0-9][0-9]-*.ipynb"))
LABS = sorted((ROOT / "solutions").glob("lab*.ipynb"))


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _src(cell: dict) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def test_lecture_02_has_its_appendix() -> None:
    assert [p.name for p in APPENDICES] == ["02-optuna.ipynb"]


@pytest.mark.parametrize(
    "path", LECTURES + APPENDICES + LABS, ids=lambda p: p.parent.name + "/" + p.stem
)
def test_notebook_keeps_its_shape(path: Path) -> None:
    assert shape_findings(path, _cells(path)) == []


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.stem)
def test_each_answer_is_collapsed_after_the_stub_the_learner_fills_in(path: Path) -> None:
    cells, number = _cells(path), 1
    for i, cell in enumerate(cells):
        if "# BEGIN SOLUTION" not in _src(cell) or cell["cell_type"] != "code":
            continue
        assert is_answer_cell(cell), f"{path.name} {cell['id']}: an answer outside an answer cell"
        attempt = cells[i - 1]
        assert cell["id"] == attempt["id"] + ANSWER_SUFFIX, (path.name, cell["id"], attempt["id"])
        stub, titles = _stub_code(answer_code(cell), path.name, i, number)
        assert _src(attempt) == stub, (
            f"{path.name} {attempt['id']}: the attempt is not the answer's stub"
        )
        number += len(titles)
        assert cells[i + 1]["cell_type"] == "code" and "check" in cells[i + 1]["metadata"].get(
            "tags", []
        )


def test_answered_lecture_puts_each_answer_back() -> None:
    import nbformat

    path = next(p for p in LECTURES if any(is_answer_cell(c) for c in _cells(p)))
    lecture = nbformat.read(path, as_version=4)
    key = answered_lecture(lecture)
    answers = [c for c in lecture.cells if is_answer_cell(c)]
    by_id = {c.id: c for c in key.cells}
    for cell in answers:
        assert by_id[cell.id.removesuffix(ANSWER_SUFFIX)].source == answer_code(cell)
    assert lecture.cells[0].source == key.cells[0].source  # the rest is unchanged


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "id": "m", "metadata": {}, "source": text}


def test_the_rules_catch_what_they_name() -> None:
    words = " ".join(["word"] * (MAX_CELL_WORDS + 1))
    assert prose_words("two words\n```\nnot prose at all here\n```\n<details>") == 2
    lecture = Path("course/05-x.ipynb")
    found = shape_findings(lecture, [_md(words)])
    assert any("more than 600" in f for f in found)
    assert any("no troubleshooting section" in f for f in found)
    assert any("outside 4000-8000" in f for f in found)  # 601 words: far below lecture 5's minimum
    answer = {
        "cell_type": "code",
        "id": "a",
        "metadata": {},
        "source": "# BEGIN SOLUTION\nx = 1\n# END SOLUTION",
    }
    body = [_md("## 9. Troubleshooting\n" + " ".join(["w"] * 500))] * 9
    found = shape_findings(lecture, [*body, answer])
    assert found == [
        "cell[9] (a) shows an exercise's answer: collapse it (metadata.jupyter.source_hidden)"
    ]
    collapsed = answer_cell("a", answer["source"])
    assert shape_findings(lecture, [*body, collapsed]) == []
    assert shape_findings(Path("solutions/lab09-x.ipynb"), [_md("## Troubleshooting\nshort")]) == []
    # an appendix has no word range, but the cell and troubleshooting rules hold
    appendix = Path("course/appendix/05-x.ipynb")
    assert shape_findings(appendix, [_md("## 3. Troubleshooting\nshort")]) == []
    found = shape_findings(appendix, [_md(words)])
    assert len(found) == 2 and "more than 600" in found[0] and "no troubleshooting" in found[1]


def _run(source: str, ns: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "<cell>", "exec"), ns)
    return out.getvalue()


def test_an_answer_cell_keeps_the_learners_function_and_fills_in_a_stub() -> None:
    solution = "def area(r):\n    # BEGIN SOLUTION area\n    return 3 * r * r\n    # END SOLUTION\n"
    stub, _titles = _stub_code(solution, "x", 0, 1)
    answer = _src(answer_cell("x", solution))
    ns: dict = {"__name__": "__main__"}
    _run(stub, ns)
    printed = _run(answer, ns)
    assert ns["area"](2) == 12 and "filled in from this answer: area" in printed
    _run("def area(r):\n    return 3.14 * r * r\n", ns)  # the learner's own answer
    printed = _run(answer, ns)
    assert ns["area"](1) == 3.14 and "kept yours: area" in printed
    _run(stub, ns)  # back to the stub: the answer fills in again
    _run(answer, ns)
    assert ns["area"](1) == 3
    keep_yours(ns).restore()  # nothing changed in between: nothing to say, nothing moved
    assert ns["area"](1) == 3
