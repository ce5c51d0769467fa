"""Validate the data of a quiz (source, public file or key) into a :class:`~ddtk.quiz.model.Quiz`.

Every problem is collected with the question id, the field and the line (from
:mod:`ddtk.quiz.yamllines`) before one :class:`~ddtk.quiz.model.QuizSourceError`
is raised, so an author fixes a whole file in one pass. :mod:`ddtk.quiz.source`
reads the files and calls :func:`validate`.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from ddtk.quiz.model import (
    QUESTION_TYPES,
    TEXT_RULES,
    Choice,
    Feedback,
    Problem,
    Question,
    Quiz,
    QuizSourceError,
)
from ddtk.quiz.values import parse_fraction, parse_pass_mark
from ddtk.quiz.yamllines import line_of

__all__ = ["validate"]

ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


CHOICE_ID_RE = re.compile(r"^[A-Za-z0-9_-]+$")


FUNCTION_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


QUIZ_KEYS = {
    "id",
    "version",
    "title",
    "pass_mark",
    "draw",
    "shuffle_questions",
    "shuffle_choices",
    "description",
}


COMMON_KEYS = {"id", "type", "points", "lecture", "objectives", "prompt", "feedback"}


TYPE_KEYS = {
    "single": {"choices", "answer"},
    "multi": {"choices", "answer"},
    "numeric": {"answer", "rtol", "atol"},
    "text": {"answer", "normalize"},
    "code": {"function", "starter", "solution", "tests", "timeout"},
}


class _Checker:
    """Collects problems while turning checked mappings into model objects."""

    def __init__(self, public: bool) -> None:
        self.public = public
        self.problems: list[Problem] = []

    def add(self, msg: str, qid: str | None, fld: str | None, where: Any, key: str | None) -> None:
        self.problems.append(Problem(msg, qid, fld, line_of(where, key)))

    def unknown_keys(self, data: dict, allowed: set[str], qid: str | None, prefix: str) -> None:
        for key in data:
            if key not in allowed:
                hint = f" (allowed: {', '.join(sorted(allowed))})"
                self.add(f"unknown field{hint}", qid, f"{prefix}{key}", data, key)

    def text(self, data: dict, key: str, qid: str | None, required: bool, fld: str = "") -> str:
        value = data.get(key)
        if value is None:
            if required:
                self.add("is required", qid, fld or key, data, key)
            return ""
        if not isinstance(value, str):
            self.add(f"must be text, got {value!r}", qid, fld or key, data, key)
            return ""
        return value

    def number(self, data: dict, key: str, qid: str, default: Fraction) -> Fraction:
        if data.get(key) is None:
            return default
        try:
            value = parse_fraction(data[key])
        except ValueError as exc:
            self.add(str(exc), qid, key, data, key)
            return default
        if value < 0:
            self.add(f"must be >= 0, got {data[key]!r}", qid, key, data, key)
            return default
        return value


def _quiz_meta(ck: _Checker, data: Any) -> dict[str, Any]:
    meta = data.get("quiz") if isinstance(data, dict) else None
    if not isinstance(meta, dict):
        ck.add(
            "a mapping with id, version, title and pass_mark is required",
            None,
            "quiz",
            data,
            "quiz",
        )
        return {}
    ck.unknown_keys(meta, QUIZ_KEYS, None, "quiz.")
    out: dict[str, Any] = {}
    qid = ck.text(meta, "id", None, True, "quiz.id")
    if qid and not ID_RE.match(qid):
        ck.add(f"must match [a-z0-9-]+, got {qid!r}", None, "quiz.id", meta, "id")
    out["id"] = qid
    version = meta.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        ck.add(
            f"must be a positive integer, got {version!r}", None, "quiz.version", meta, "version"
        )
        version = 1
    out["version"] = version
    out["title"] = ck.text(meta, "title", None, False, "quiz.title") or qid
    out["description"] = ck.text(meta, "description", None, False, "quiz.description")
    try:
        out["pass_mark"] = parse_pass_mark(meta.get("pass_mark"))
    except ValueError as exc:
        ck.add(str(exc), None, "quiz.pass_mark", meta, "pass_mark")
        out["pass_mark"] = Fraction(1)
    draw = meta.get("draw")
    if draw is not None and (isinstance(draw, bool) or not isinstance(draw, int) or draw < 1):
        ck.add(f"must be a positive integer or null, got {draw!r}", None, "quiz.draw", meta, "draw")
        draw = None
    out["draw"] = draw
    for key in ("shuffle_questions", "shuffle_choices"):
        value = meta.get(key, False)
        if not isinstance(value, bool):
            ck.add(f"must be true or false, got {value!r}", None, f"quiz.{key}", meta, key)
            value = False
        out[key] = value
    return out


def _choices(ck: _Checker, q: dict, qid: str) -> tuple[Choice, ...]:
    raw = q.get("choices")
    if not isinstance(raw, list) or len(raw) < 2:
        ck.add("must be a list of at least two {id, text}", qid, "choices", q, "choices")
        return ()
    out: list[Choice] = []
    for i, c in enumerate(raw):
        fld = f"choices[{i}]"
        if not isinstance(c, dict) or set(c) - {"id", "text"} or "id" not in c:
            ck.add(
                f"must be a mapping {{id, text}}, got {c!r}",
                qid,
                fld,
                q if not isinstance(c, dict) else c,
                "choices" if not isinstance(c, dict) else None,
            )
            continue
        cid = (
            str(c["id"]) if isinstance(c["id"], str | int) and not isinstance(c["id"], bool) else ""
        )
        if not CHOICE_ID_RE.match(cid):
            ck.add(
                f"choice id must match [A-Za-z0-9_-]+, got {c['id']!r}", qid, f"{fld}.id", c, "id"
            )
            continue
        if cid in {x.id for x in out}:
            ck.add(f"duplicate choice id {cid!r}", qid, f"{fld}.id", c, "id")
            continue
        text = ck.text(c, "text", qid, True, f"{fld}.text")
        out.append(Choice(cid, text))
    return tuple(out)


def _answer(ck: _Checker, q: dict, qid: str, qtype: str, choices: tuple[Choice, ...]) -> Any:
    if "answer" not in q or q["answer"] is None:
        if not ck.public:
            ck.add("is required", qid, "answer", q, "answer")
        return None
    if ck.public:
        ck.add("must not appear in a public quiz file", qid, "answer", q, "answer")
        return None
    raw = q["answer"]
    ids = {c.id for c in choices}
    if qtype == "single":
        value = str(raw) if isinstance(raw, str | int) and not isinstance(raw, bool) else None
        if value is None or (choices and value not in ids):
            ck.add(f"{raw!r} is not among the choices {sorted(ids)}", qid, "answer", q, "answer")
        return value
    if qtype == "multi":
        if not isinstance(raw, list) or not raw:
            ck.add(
                f"must be a non-empty list of choice ids, got {raw!r}", qid, "answer", q, "answer"
            )
            return ()
        values = tuple(str(x) for x in raw)
        bad = [v for v in values if v not in ids]
        if choices and bad:
            ck.add(f"{bad} not among the choices {sorted(ids)}", qid, "answer", q, "answer")
        if len(set(values)) != len(values):
            ck.add(f"repeats a choice id: {list(values)}", qid, "answer", q, "answer")
        return tuple(sorted(set(values)))
    if qtype == "numeric":
        try:
            return parse_fraction(raw)
        except ValueError as exc:
            ck.add(str(exc), qid, "answer", q, "answer")
            return None
    # text
    values = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(values, list)
        or not values
        or not all(isinstance(v, str) and v.strip() for v in values)
    ):
        ck.add(
            f"must be a non-empty list of accepted strings, got {raw!r}", qid, "answer", q, "answer"
        )
        return ()
    return tuple(values)


def _feedback(ck: _Checker, q: dict, qid: str, choices: tuple[Choice, ...]) -> Feedback:
    raw = q.get("feedback")
    if raw is None:
        return Feedback()
    if ck.public:
        ck.add("must not appear in a public quiz file", qid, "feedback", q, "feedback")
        return Feedback()
    if isinstance(raw, str):
        return Feedback(correct=raw, incorrect=raw)
    if not isinstance(raw, dict):
        ck.add(
            "must be text or a mapping {correct, incorrect, choices}",
            qid,
            "feedback",
            q,
            "feedback",
        )
        return Feedback()
    ck.unknown_keys(raw, {"correct", "incorrect", "choices"}, qid, "feedback.")
    per_choice = raw.get("choices") or {}
    if not isinstance(per_choice, dict):
        ck.add("must be a mapping {choice id: text}", qid, "feedback.choices", raw, "choices")
        per_choice = {}
    ids = {c.id for c in choices}
    for cid in per_choice:
        if str(cid) not in ids:
            ck.add(f"{cid!r} is not among the choices", qid, "feedback.choices", per_choice, cid)
    return Feedback(
        correct=ck.text(raw, "correct", qid, False, "feedback.correct"),
        incorrect=ck.text(raw, "incorrect", qid, False, "feedback.incorrect"),
        choices={str(k): str(v) for k, v in per_choice.items()},
    )


def _code_fields(ck: _Checker, q: dict, qid: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fn = ck.text(q, "function", qid, True)
    if fn and not FUNCTION_RE.match(fn):
        ck.add(f"must be a Python identifier, got {fn!r}", qid, "function", q, "function")
    out["function"] = fn or None
    out["starter"] = ck.text(q, "starter", qid, False) or None
    for key in ("solution", "tests"):
        if ck.public:
            if key in q:
                ck.add("must not appear in a public quiz file", qid, key, q, key)
            out[key] = None
            continue
        src = ck.text(q, key, qid, True)
        if src:
            try:
                compile(src, f"<{qid}.{key}>", "exec")
            except SyntaxError as exc:
                base = line_of(q, key)
                line = base + (exc.lineno or 0) if base else None
                ck.problems.append(Problem(f"is not valid Python: {exc.msg}", qid, key, line))
        out[key] = src or None
    timeout = q.get("timeout", 10)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 300:
        ck.add(
            f"must be a number of seconds in (0, 300], got {timeout!r}",
            qid,
            "timeout",
            q,
            "timeout",
        )
        timeout = 10
    out["timeout"] = float(timeout)
    return out


def _question(ck: _Checker, q: Any, index: int, seen: dict[str, int | None]) -> Question | None:
    if not isinstance(q, dict):
        ck.problems.append(Problem(f"questions[{index}] must be a mapping, got {q!r}"))
        return None
    qid = q.get("id")
    if not isinstance(qid, str) or not ID_RE.match(qid):
        ck.add(
            f"questions[{index}] needs an id matching [a-z0-9-]+, got {qid!r}", None, "id", q, "id"
        )
        qid = f"#{index + 1}"
    elif qid in seen:
        ck.add(f"duplicate id (first on line {seen[qid]})", qid, "id", q, "id")
    seen.setdefault(qid, line_of(q, "id"))
    qtype = q.get("type")
    if qtype not in QUESTION_TYPES:
        ck.add(
            f"unknown type {qtype!r}; use one of {', '.join(QUESTION_TYPES)}",
            qid,
            "type",
            q,
            "type",
        )
        return None
    ck.unknown_keys(q, COMMON_KEYS | TYPE_KEYS[qtype], qid, "")
    points = Fraction(1)
    if q.get("points") is not None:
        try:
            points = parse_fraction(q["points"])
            if points <= 0:
                raise ValueError(f"must be > 0, got {q['points']!r}")
        except ValueError as exc:
            ck.add(str(exc), qid, "points", q, "points")
            points = Fraction(1)
    lecture = q.get("lecture")
    if lecture is not None and (
        isinstance(lecture, bool) or not isinstance(lecture, int) or not 1 <= lecture <= 7
    ):
        ck.add(f"must be a lecture number 1..7, got {lecture!r}", qid, "lecture", q, "lecture")
        lecture = None
    objectives = q.get("objectives") or []
    if isinstance(objectives, str | int | float):
        objectives = [objectives]
    if not isinstance(objectives, list):
        ck.add(
            f"must be a list of objective ids, got {objectives!r}",
            qid,
            "objectives",
            q,
            "objectives",
        )
        objectives = []
    prompt = ck.text(q, "prompt", qid, True)
    choices = _choices(ck, q, qid) if qtype in ("single", "multi") else ()
    fields: dict[str, Any] = {}
    if qtype != "code":
        fields["answer"] = _answer(ck, q, qid, qtype, choices)
    if qtype == "numeric":
        fields["rtol"] = ck.number(q, "rtol", qid, Fraction(0))
        fields["atol"] = ck.number(q, "atol", qid, Fraction(0))
    if qtype == "text":
        rules = q.get("normalize", list(TEXT_RULES))
        if not isinstance(rules, list) or any(r not in TEXT_RULES for r in rules):
            ck.add(
                f"must be a list drawn from {list(TEXT_RULES)}, got {rules!r}",
                qid,
                "normalize",
                q,
                "normalize",
            )
            rules = list(TEXT_RULES)
        fields["normalize"] = tuple(rules)
    if qtype == "code":
        fields.update(_code_fields(ck, q, qid))
    return Question(
        id=qid,
        type=qtype,
        points=points,
        prompt=prompt,
        lecture=lecture,
        objectives=tuple(str(o) for o in objectives),
        choices=choices,
        feedback=_feedback(ck, q, qid, choices),
        line=line_of(q),
        **fields,
    )


def validate(data: Any, *, public: bool = False, path: str | None = None) -> Quiz:
    """Check a parsed quiz (source, key or, with ``public=True``, public file) and build it.

    Raises :class:`QuizSourceError` listing every problem, each with the question id,
    the field and, when the data came from YAML, the line.
    """
    ck = _Checker(public)
    if not isinstance(data, dict):
        raise QuizSourceError(
            [Problem("a quiz must be a mapping with 'quiz' and 'questions'")], path
        )
    ck.unknown_keys(data, {"quiz", "questions"}, None, "")
    meta = _quiz_meta(ck, data)
    raw_questions = data.get("questions")
    questions: list[Question] = []
    if not isinstance(raw_questions, list) or not raw_questions:
        ck.add("a non-empty list of questions is required", None, "questions", data, "questions")
    else:
        seen: dict[str, int | None] = {}
        for i, q in enumerate(raw_questions):
            question = _question(ck, q, i, seen)
            if question is not None:
                questions.append(question)
    if meta.get("draw") and raw_questions and meta["draw"] > len(raw_questions):
        ck.add(
            f"draws {meta['draw']} of only {len(raw_questions)} questions",
            None,
            "quiz.draw",
            data.get("quiz"),
            "draw",
        )
    if ck.problems:
        raise QuizSourceError(ck.problems, path)
    return Quiz(questions=tuple(questions), **meta)
