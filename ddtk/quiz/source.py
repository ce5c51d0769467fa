"""Load and validate quiz sources, public files and keys, with line numbers.

One validator (:mod:`ddtk.quiz.validation`) serves the three forms of a quiz: the YAML source (with answers), the
public YAML file (``public=True``: no answers) and the JSON key (the validated source
as JSON). YAML is read with a loader that records the line of every mapping key, so a
problem is reported as ``line 12, question 'ring-bytes', field 'atol': must be >= 0``.
Every problem is collected before raising one :class:`QuizSourceError`.

>>> quiz = load_source_text('''
... quiz: {id: demo, version: 1, title: Demo, pass_mark: 80%}
... questions:
...   - id: q1
...     type: numeric
...     prompt: What is 7/4?
...     answer: 7/4
...     atol: -1
... ''')
Traceback (most recent call last):
...
ddtk.quiz.model.QuizSourceError: line 8, question 'q1', field 'atol': must be >= 0, got -1
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddtk.quiz.model import Problem, Question, Quiz, QuizSourceError, fraction_str
from ddtk.quiz.validation import validate
from ddtk.quiz.values import parse_fraction, parse_pass_mark
from ddtk.quiz.yamllines import LineDict, parse_yaml

__all__ = [
    "LineDict",
    "load_key",
    "load_public",
    "load_source",
    "load_source_text",
    "parse_fraction",
    "parse_pass_mark",
    "parse_yaml",
    "quiz_to_dict",
    "validate",
]

PRIVATE_KEYS = ("answer", "solution", "tests", "feedback")


def load_source_text(text: str, *, public: bool = False, path: str | None = None) -> Quiz:
    """Validate quiz YAML given as text (see :func:`load_source`)."""
    try:
        data = parse_yaml(text)
    except QuizSourceError as exc:
        raise QuizSourceError(exc.problems, path) from None
    return validate(data, public=public, path=path)


def load_source(path: str | Path) -> Quiz:
    """Load and validate a quiz source YAML file (with answers, solutions and tests)."""
    path = Path(path)
    return load_source_text(_read(path), path=str(path))


def load_public(path: str | Path) -> Quiz:
    """Load a public quiz file (no answers, solutions, tests or feedback)."""
    path = Path(path)
    return load_source_text(_read(path), public=True, path=str(path))


def load_key(key: str | Path | dict | Quiz) -> Quiz:
    """Load a private key: a path to the JSON (or YAML source), a parsed dict, or a Quiz."""
    if isinstance(key, Quiz):
        return key
    if isinstance(key, dict):
        return validate(key, path="<key>")
    path = Path(key)
    text = _read(path)
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise QuizSourceError(
                [Problem(f"invalid JSON: {exc.msg}", line=exc.lineno)], str(path)
            ) from None
        return validate(data, path=str(path))
    return load_source_text(text, path=str(path))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise QuizSourceError([Problem(f"cannot read: {exc}")], str(path)) from None


# ---------------------------------------------------------------- serialisation


def quiz_to_dict(quiz: Quiz, *, private: bool) -> dict[str, Any]:
    """The quiz as plain YAML/JSON data; ``private=False`` leaves out every secret."""
    meta: dict[str, Any] = {
        "id": quiz.id,
        "version": quiz.version,
        "title": quiz.title,
        "pass_mark": fraction_str(quiz.pass_mark),
    }
    if quiz.description:
        meta["description"] = quiz.description
    meta.update(
        draw=quiz.draw,
        shuffle_questions=quiz.shuffle_questions,
        shuffle_choices=quiz.shuffle_choices,
    )
    return {"quiz": meta, "questions": [_question_dict(q, private) for q in quiz.questions]}


def _question_dict(q: Question, private: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"id": q.id, "type": q.type, "points": fraction_str(q.points)}
    if q.lecture is not None:
        out["lecture"] = q.lecture
    out["objectives"] = list(q.objectives)
    out["prompt"] = q.prompt
    if q.choices:
        out["choices"] = [{"id": c.id, "text": c.text} for c in q.choices]
    if q.type == "numeric":
        out["rtol"] = fraction_str(q.rtol)
        out["atol"] = fraction_str(q.atol)
    if q.type == "text":
        out["normalize"] = list(q.normalize)
    if q.type == "code":
        out["function"] = q.function
        if q.starter:
            out["starter"] = q.starter
        out["timeout"] = q.timeout
    if private:
        if q.type == "numeric":
            out["answer"] = fraction_str(q.answer)
        elif q.type in ("multi", "text"):
            out["answer"] = list(q.answer)
        elif q.type == "single":
            out["answer"] = q.answer
        if q.type == "code":
            out["solution"] = q.solution
            out["tests"] = q.tests
        fb = q.feedback
        if fb.correct or fb.incorrect or fb.choices:
            out["feedback"] = {"correct": fb.correct, "incorrect": fb.incorrect}
            if fb.choices:
                out["feedback"]["choices"] = dict(fb.choices)
    return out
