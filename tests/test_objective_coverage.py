"""Every learning objective is taught, practised with a check, and examined.

Notebook cells name the objectives they serve with cell tags of the form
``objective:<id>`` (``objective:3.3``), ids from ``quizzes/objectives.yaml``:

- in a lecture (``course/*.ipynb``), on the markdown cell that holds a section heading:
  that section teaches the objective;
- in a lab (``solutions/lab*.ipynb``, copied to ``labs/`` by ``ddtk course build``) or a
  lecture, on a cell tagged ``check``: that exercise's check exercises the objective.

Quiz questions name theirs in ``solutions/quiz/module-quiz.source.yaml``. An objective is
covered when it has a lecture section, a checked exercise and a quiz question, and every
objective must be covered. The tags are read with json alone: no kernel, about a second.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ddtk.quiz import load_source

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVES = ROOT / "quizzes" / "objectives.yaml"
QUIZ = ROOT / "solutions" / "quiz" / "module-quiz.source.yaml"
LECTURES = sorted((ROOT / "course").glob("[0-9][0-9]-*.ipynb"))
LABS = sorted((ROOT / "solutions").glob("lab[0-9][0-9]-*.ipynb"))
PREFIX = "objective:"
HEADING = re.compile(r"^#{2,3} ", re.MULTILINE)


def _objective_tags(cell: dict) -> list[str]:
    return [
        t[len(PREFIX) :] for t in cell.get("metadata", {}).get("tags", []) if t.startswith(PREFIX)
    ]


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _where(path: Path, cell: dict) -> str:
    return f"{path.relative_to(ROOT).as_posix()} cell {cell.get('id')}"


def _is_heading(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and bool(HEADING.search("".join(cell["source"])))


def _is_check(cell: dict) -> bool:
    return cell["cell_type"] == "code" and "check" in cell.get("metadata", {}).get("tags", [])


def sections() -> dict[str, list[str]]:
    """Objective id -> the lecture cells (file and cell id) whose section teaches it."""
    found: dict[str, list[str]] = {}
    for path in LECTURES:
        for cell in _cells(path):
            if _is_heading(cell):
                for oid in _objective_tags(cell):
                    found.setdefault(oid, []).append(_where(path, cell))
    return found


def checks() -> dict[str, list[str]]:
    """Objective id -> the check cells (labs and lectures) that exercise it."""
    found: dict[str, list[str]] = {}
    for path in LABS + LECTURES:
        for cell in _cells(path):
            if _is_check(cell):
                for oid in _objective_tags(cell):
                    found.setdefault(oid, []).append(_where(path, cell))
    return found


def questions() -> dict[str, list[str]]:
    """Objective id -> the quiz questions that examine it."""
    found: dict[str, list[str]] = {}
    for q in load_source(QUIZ).questions:
        for oid in q.objectives:
            found.setdefault(str(oid), []).append(q.id)
    return found


def missing_pieces(objective_ids: list[str]) -> dict[str, list[str]]:
    """Objective id -> what it lacks: 'lecture section', 'checked exercise', 'quiz question'."""
    have = {
        "lecture section": sections(),
        "checked exercise": checks(),
        "quiz question": questions(),
    }
    out: dict[str, list[str]] = {}
    for oid in objective_ids:
        lacking = [piece for piece, index in have.items() if not index.get(oid)]
        if lacking:
            out[oid] = lacking
    return out


@pytest.fixture(scope="module")
def objective_ids() -> list[str]:
    data = yaml.safe_load(OBJECTIVES.read_text(encoding="utf-8"))
    return [str(o["id"]) for o in data["objectives"]]


def test_tags_name_known_objectives_on_the_right_cells(objective_ids: list[str]) -> None:
    wrong = []
    for path in LECTURES + LABS:
        for cell in _cells(path):
            tags = _objective_tags(cell)
            if tags and not (_is_heading(cell) or _is_check(cell)):
                wrong.append(
                    f"{_where(path, cell)}: objective tags on a cell that is neither a section heading nor a check"
                )
            wrong += [
                f"{_where(path, cell)}: unknown objective {t!r}"
                for t in tags
                if t not in objective_ids
            ]
    assert not wrong, "\n".join(wrong)


def test_every_objective_is_taught_practised_and_examined(objective_ids: list[str]) -> None:
    missing = missing_pieces(objective_ids)
    problems = [f"objective {oid}: no {', no '.join(p)}" for oid, p in missing.items()]
    assert not problems, (
        "uncovered objectives (tag a section/check, or add a question):\n" + "\n".join(problems)
    )


def test_generated_labs_carry_the_same_tags() -> None:
    for source in LABS:
        built = ROOT / "labs" / source.name
        tags = [_objective_tags(c) for c in _cells(source) if _is_check(c)]
        assert tags == [_objective_tags(c) for c in _cells(built) if _is_check(c)], (
            f"{built.relative_to(ROOT)} is out of date: run `ddtk course build`"
        )


def test_missing_pieces_names_what_is_missing() -> None:
    """On the real notebooks an unknown id lacks all three pieces, and says so."""
    assert missing_pieces(["9.9"]) == {
        "9.9": ["lecture section", "checked exercise", "quiz question"]
    }
