"""Self-check without the key: salted hashes of the canonical answers.

The self-check file holds, per question, ``sha256(salt:question id:canonical answer)``:

- ``single``: the choice id; ``multi``: the sorted choice ids joined by ``,``;
- ``text``: one hash per accepted answer, after the question's normalisation;
- ``numeric`` with ``rtol == 0``: exact answers (``atol == 0``) hash the reduced
  fraction ``"7/4"``. With ``atol > 0`` the answer line is cut into a grid of step
  ``atol / 4`` and every grid point within ``atol + step / 2`` of the answer is
  hashed; a learner's value matches when its nearest grid point is among them. So
  every value within tolerance is "correct", and values up to ``1.25 * atol`` away may
  be too (grading by key stays exact). With ``rtol > 0`` the grid step would reveal the
  size of the answer, so those questions are ``unchecked``;
- ``code``: ``unchecked`` (only the instructor tests can judge code).

A self-check says only "correct" or "not yet": the teaching feedback comes with
grading by key. Its score and pass/fail cover the checkable questions only.

>>> from ddtk.quiz.source import load_source_text
>>> from ddtk.quiz.answers import Answers
>>> quiz = load_source_text('''
... quiz: {id: demo, version: 1, pass_mark: 1/2}
... questions:
...   - {id: q1, type: numeric, prompt: "7/4?", answer: 1.75, atol: 0.01}
...   - {id: q2, type: text, prompt: "Name it", answer: [loss scaling]}
... ''')
>>> report = self_check(make_selfcheck(quiz), Answers("demo", 1, "bob", {"q1": "1.755", "q2": "Loss-Scaling"}))
>>> [(i.id, i.status) for i in report.questions], report.score, report.passed
([('q1', 'correct'), ('q2', 'correct')], Fraction(2, 1), True)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from ddtk.quiz.answers import Answers
from ddtk.quiz.grading import normalize_text, parse_number_answer
from ddtk.quiz.model import Question, Quiz, fraction_str
from ddtk.quiz.seeding import order_ids, seed_for

GRID_DIVISIONS = 4


def default_salt(quiz: Quiz) -> str:
    """A salt fixed by the quiz id and version, so rebuilding gives the same file."""
    return hashlib.sha256(f"ddtk-quiz-selfcheck:{quiz.id}:{quiz.version}".encode()).hexdigest()[:16]


def _hash(salt: str, qid: str, canonical: str) -> str:
    return hashlib.sha256(f"{salt}:{qid}:{canonical}".encode()).hexdigest()


def _numeric_check(q: Question, salt: str) -> dict[str, Any]:
    if q.rtol != 0:
        return {"type": "numeric", "mode": "unchecked"}
    if q.atol == 0:
        return {"type": "numeric", "mode": "exact", "hashes": [_hash(salt, q.id, str(q.answer))]}
    step = q.atol / GRID_DIVISIONS
    reach = q.atol + step / 2
    lo, hi = math.ceil((q.answer - reach) / step), math.floor((q.answer + reach) / step)
    hashes = sorted(_hash(salt, q.id, str(k)) for k in range(lo, hi + 1))
    return {"type": "numeric", "mode": "grid", "step": fraction_str(step), "hashes": hashes}


def _check_for(q: Question, salt: str) -> dict[str, Any]:
    if q.type == "single":
        return {"type": "single", "hashes": [_hash(salt, q.id, q.answer)]}
    if q.type == "multi":
        return {"type": "multi", "hashes": [_hash(salt, q.id, ",".join(sorted(q.answer)))]}
    if q.type == "text":
        norm = sorted({normalize_text(a, q.normalize) for a in q.answer})
        return {
            "type": "text",
            "normalize": list(q.normalize),
            "hashes": sorted(_hash(salt, q.id, a) for a in norm),
        }
    if q.type == "numeric":
        return _numeric_check(q, salt)
    return {"type": "code", "mode": "unchecked"}


def make_selfcheck(quiz: Quiz, salt: str | None = None) -> dict[str, Any]:
    """Build the self-check data of a validated quiz (with answers)."""
    salt = salt or default_salt(quiz)
    checks = {}
    for q in quiz.questions:
        check = _check_for(q, salt)
        check["points"] = fraction_str(q.points)
        if q.choices:
            check["choices"] = list(q.choice_ids)
        checks[q.id] = check
    return {
        "quiz": quiz.id,
        "version": quiz.version,
        "pass_mark": fraction_str(quiz.pass_mark),
        "draw": quiz.draw,
        "salt": salt,
        "checks": checks,
    }


@dataclass
class SelfCheckItem:
    """One question's self-check status: correct, not yet, unanswered or unchecked."""

    id: str
    status: str
    points: Fraction


@dataclass
class SelfCheckReport:
    """A self-check over the checkable questions only (code and rtol numerics excluded)."""

    student: str
    questions: list[SelfCheckItem] = field(default_factory=list)
    score: Fraction = Fraction(0)
    max_score: Fraction = Fraction(0)
    passed: bool = False
    pass_mark: Fraction = Fraction(1)
    note: str = "Score and pass/fail count only the questions a self-check can judge."

    @property
    def status(self) -> dict[str, str]:
        """``{question id: status}``."""
        return {i.id: i.status for i in self.questions}


def _canonical(check: dict[str, Any], value: Any) -> list[str] | None:
    """Canonical strings to hash for a learner's value (None when it cannot match)."""
    kind = check["type"]
    if kind == "single":
        return (
            [str(value)] if isinstance(value, str | int) and not isinstance(value, bool) else None
        )
    if kind == "multi":
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list | tuple):
            return None
        return [",".join(sorted({str(v) for v in values}))]
    if kind == "text":
        return (
            [normalize_text(str(value), check.get("normalize", []))]
            if isinstance(value, str | int | float)
            else None
        )
    try:
        x = parse_number_answer(value)
    except ValueError:
        return None
    if check["mode"] == "exact":
        return [str(x)]
    return [str(round(x / Fraction(check["step"])))]


def self_check(selfcheck: dict | str | Path, answers: Answers) -> SelfCheckReport:
    """Check ``answers`` against the self-check data (a dict or a path to the JSON)."""
    if not isinstance(selfcheck, dict):
        selfcheck = json.loads(Path(selfcheck).read_text(encoding="utf-8"))
    if answers.quiz != selfcheck["quiz"] or answers.version != selfcheck["version"]:
        raise ValueError(
            f"answers are for {answers.quiz!r} version {answers.version}, the self-check file "
            f"for {selfcheck['quiz']!r} version {selfcheck['version']}"
        )
    salt, checks = selfcheck["salt"], selfcheck["checks"]
    ids = list(checks)
    if selfcheck.get("draw"):
        seed = seed_for(selfcheck["quiz"], selfcheck["version"], answers.student)
        ids, _ = order_ids(ids, {}, seed=seed, draw=selfcheck["draw"])
    report = SelfCheckReport(answers.student, pass_mark=Fraction(str(selfcheck["pass_mark"])))
    for qid in ids:
        check = checks[qid]
        points = Fraction(str(check["points"]))
        value = answers.answers.get(qid)
        if check.get("mode") == "unchecked":
            status = "unchecked"
        elif value is None or value == "" or value == []:
            status = "unanswered"
        else:
            canon = _canonical(check, value) or []
            ok = any(_hash(salt, qid, c) in check["hashes"] for c in canon)
            status = "correct" if ok else "not yet"
        report.questions.append(SelfCheckItem(qid, status, points))
        if status != "unchecked":
            report.max_score += points
            report.score += points if status == "correct" else 0
    report.passed = report.max_score > 0 and report.score >= report.pass_mark * report.max_score
    return report
