"""Answers files: what a learner submits (YAML or JSON), read strictly, written atomically.

An answers file names the quiz, its version and the student, and maps question ids
to answers (choice ids for choice questions, never positions)::

    quiz: module-202
    version: 1
    student: alice
    seed: 1234567          # recorded when the quiz shuffles; the grader recomputes it
    answers:
      ring-allreduce-bytes: "7/4"
      nccl-facts: [a, c]

:func:`read_answers` checks the file's structure only (it does not know the quiz) and
raises :class:`AnswersError` naming the file and the problem. Problems that need the
key (unknown question id, wrong answer type, another quiz version) are found by
:func:`check_answers` and by the grader.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "alice.yaml"
>>> write_answers(path, Answers("demo", 1, "alice", {"q1": "b", "q2": ["a", "c"]}))
>>> read_answers(path)
Answers(quiz='demo', version=1, student='alice', answers={'q1': 'b', 'q2': ['a', 'c']}, seed=None)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from ddtk.quiz.model import Quiz

STUDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # also a safe folder name
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster
ANSWER_KEYS = {"quiz", "version", "student", "seed", "answers", "meta"}


class AnswersError(ValueError):
    """An answers file cannot be used: unreadable, malformed, or for another quiz."""

    def __init__(self, message: str, path: str | None = None, student: str | None = None) -> None:
        self.message = message
        self.path = path
        self.student = student
        super().__init__(f"{path}: {message}" if path else message)


@dataclass
class Answers:
    """One learner's answers: ``answers`` maps question ids to values."""

    quiz: str
    version: int
    student: str
    answers: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None


def answers_from_dict(data: Any, path: str | None = None) -> Answers:
    """Check the structure of parsed answers data and build :class:`Answers`."""
    if not isinstance(data, dict):
        raise AnswersError(
            "an answers file must be a mapping with quiz, version, student, answers", path
        )
    student = data.get("student")
    if student is None or student == "":
        raise AnswersError("missing student id ('student: ...')", path)
    if (
        not isinstance(student, str | int)
        or isinstance(student, bool)
        or not STUDENT_RE.match(str(student))
    ):
        raise AnswersError(
            f"student id must be letters, digits, '.', '_' or '-' (not first), got {student!r}",
            path,
        )
    student = str(student)
    unknown = sorted(str(k) for k in data if k not in ANSWER_KEYS)
    if unknown:
        raise AnswersError(
            f"unknown top-level field(s) {unknown}; allowed: {sorted(ANSWER_KEYS)}", path, student
        )
    quiz = data.get("quiz")
    if not isinstance(quiz, str) or not quiz:
        raise AnswersError(f"'quiz' must be the quiz id, got {quiz!r}", path, student)
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise AnswersError(f"'version' must be an integer, got {version!r}", path, student)
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise AnswersError(f"'seed' must be an integer, got {seed!r}", path, student)
    answers = data.get("answers")
    if answers is None:
        answers = {}
    if not isinstance(answers, dict):
        raise AnswersError(
            f"'answers' must be a mapping of question id to answer, got {type(answers).__name__}",
            path,
            student,
        )
    bad = [k for k in answers if not isinstance(k, str)]
    if bad:
        raise AnswersError(f"question ids must be text, got {bad!r}", path, student)
    return Answers(quiz, version, student, dict(answers), seed)


def read_answers(path: str | Path) -> Answers:
    """Read an answers file (``.json`` as JSON, anything else as YAML)."""
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AnswersError(f"cannot read: {exc}", name) from None
    try:
        data = (
            json.loads(text) if path.suffix.lower() == ".json" else yaml.load(text, Loader=_LOADER)
        )
    except json.JSONDecodeError as exc:
        raise AnswersError(f"invalid JSON at line {exc.lineno}: {exc.msg}", name) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise AnswersError(f"invalid YAML{where}: {getattr(exc, 'problem', exc)}", name) from None
    return answers_from_dict(data, name)


def _plain(value: Any) -> Any:
    if isinstance(value, Fraction):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def answers_to_dict(answers: Answers) -> dict[str, Any]:
    """The answers as plain data for YAML or JSON (Fractions become ``"p/q"``)."""
    out: dict[str, Any] = {
        "quiz": answers.quiz,
        "version": answers.version,
        "student": answers.student,
    }
    if answers.seed is not None:
        out["seed"] = answers.seed
    out["answers"] = _plain(answers.answers)
    return out


def write_answers(path: str | Path, answers: Answers) -> None:
    """Write ``answers`` atomically, as JSON for ``.json`` and YAML otherwise."""
    from ddtk.quiz.files import write_text

    data = answers_to_dict(answers)
    if Path(path).suffix.lower() == ".json":
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    else:
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000)
    write_text(path, text)


def check_answers(quiz: Quiz, answers: Answers) -> list[str]:
    """File-level problems of ``answers`` against ``quiz`` (wrong quiz or version).

    An empty list means the answers can be graded; per-question problems are reported
    by the grader for the question concerned.
    """
    problems = []
    if answers.quiz != quiz.id:
        problems.append(f"answers are for quiz {answers.quiz!r}, not {quiz.id!r}")
    if answers.version != quiz.version:
        problems.append(
            f"answers are for version {answers.version} of {quiz.id!r}; the key is version {quiz.version}"
        )
    return problems
