"""Grade one learner's answers against the private key, exactly (``Fraction`` scores).

Grading uses only the key and the instructor tests; nothing in the submission can
change how it is graded (a stored seed is checked, not used). Rules per type:

- ``single``: full points for the key's choice id, else 0.
- ``multi``: ``points * max(0, (right picks - wrong picks) / number of right choices)``:
  partial credit, never negative. Picking every choice scores what the wrong picks leave.
- ``numeric``: correct when ``|x - a| <= atol + rtol * |a|``, computed exactly with
  ``Fraction``. Accepts ``1.75``, ``"7/4"``, ``"1.75e0"`` and surrounding spaces; a
  value with a unit (``"1.75 GB"``) scores 0 with a note asking for a unit-free number.
- ``text``: correct when the answer equals any accepted answer after normalisation
  (``case``: case-folded; ``whitespace``: runs of spaces collapsed and ends trimmed;
  ``hyphens``: hyphens, en and em dashes read as spaces).
- ``code``: ``points * passed checks / total checks``; the instructor tests run against
  the learner's code in a fresh ``python -I`` subprocess (:mod:`ddtk.quiz.codecheck`).
  Feedback says "k of n checks passed" and never shows the hidden tests.

A student passes when ``score >= pass_mark * max_score``. With ``draw``, the maximum
is over the questions drawn for that student.

>>> from ddtk.quiz.source import load_source_text
>>> from ddtk.quiz.answers import Answers
>>> quiz = load_source_text('''
... quiz: {id: demo, version: 1, pass_mark: 4/5}
... questions:
...   - {id: q1, type: numeric, prompt: "7/4?", answer: 1.75, atol: 0.01}
...   - {id: q2, type: multi, prompt: "Pick", answer: [a, b],
...      choices: [{id: a, text: A}, {id: b, text: B}, {id: c, text: C}]}
... ''')
>>> result = grade(quiz, Answers("demo", 1, "alice", {"q1": " 7/4 ", "q2": ["a", "c"]}))
>>> result.score, result.max_score, result.passed
(Fraction(1, 1), Fraction(2, 1), False)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from ddtk.quiz.answers import Answers, check_answers
from ddtk.quiz.codecheck import CodeResult, run_code_question
from ddtk.quiz.model import Question, Quiz
from ddtk.quiz.seeding import order_ids, seed_for
from ddtk.quiz.source import load_key, parse_fraction

ZERO = Fraction(0)


@dataclass
class QuestionResult:
    """The score of one question with the feedback the learner sees."""

    id: str
    score: Fraction
    max: Fraction
    feedback: str = ""
    status: str = "incorrect"  # correct | partial | incorrect | unanswered | invalid
    note: str = ""  # why an invalid answer was not graded


@dataclass
class StudentResult:
    """One student's grade. ``error`` is set when the file could not be graded at all."""

    student: str
    score: Fraction
    max_score: Fraction
    passed: bool
    questions: list[QuestionResult] = field(default_factory=list)
    quiz: str = ""
    version: int = 0
    pass_mark: Fraction = ZERO
    file: str | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``pass``, ``fail`` or ``error``."""
        return "error" if self.error else ("pass" if self.passed else "fail")

    @property
    def percent(self) -> float:
        """The score as a percentage, for display only (decisions use Fractions)."""
        return float(100 * self.score / self.max_score) if self.max_score else 0.0


# ---------------------------------------------------------------- per-type rules


def normalize_text(text: str, rules: tuple[str, ...] | list[str]) -> str:
    """Normalise free text by the question's rules (``case``, ``whitespace``, ``hyphens``).

    >>> normalize_text("  Dynamic  Loss-Scaling ", ("case", "whitespace", "hyphens"))
    'dynamic loss scaling'
    """
    if "hyphens" in rules:
        text = re.sub(r"[-\u2010-\u2015]", " ", text)
    if "case" in rules:
        text = text.casefold()
    if "whitespace" in rules:
        text = " ".join(text.split())
    return text


def parse_number_answer(value: Any) -> Fraction:
    """Read a learner's numeric answer exactly; raise ValueError with a note for the learner."""
    if (
        isinstance(value, str)
        and re.search(r"\d\s*[A-Za-z%]", value.strip())
        and not re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+\s*", value)
    ):
        raise ValueError(
            f"{value.strip()!r} is not a unit-free number: give the number only, e.g. 1.75 or 7/4"
        )
    return parse_fraction(value)


def _feedback(q: Question, correct: bool, extra: str = "") -> str:
    text = q.feedback.correct if correct else q.feedback.incorrect
    return " ".join(s for s in (extra, text) if s)


def _single(q: Question, value: Any) -> QuestionResult:
    if not isinstance(value, str | int) or isinstance(value, bool):
        return _invalid(q, f"expected one choice id, got {type(value).__name__}")
    value = str(value)
    if value not in q.choice_ids:
        return _invalid(q, f"{value!r} is not a choice of this question")
    ok = value == q.answer
    note = q.feedback.choices.get(value, "")
    return QuestionResult(
        q.id,
        q.points if ok else ZERO,
        q.points,
        _feedback(q, ok, note),
        "correct" if ok else "incorrect",
    )


def _multi(q: Question, value: Any) -> QuestionResult:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in value
    ):
        return _invalid(q, "expected a list of choice ids")
    picks = {str(v) for v in value}
    unknown = sorted(picks - set(q.choice_ids))
    if unknown:
        return _invalid(q, f"{unknown} are not choices of this question")
    right = set(q.answer)
    credit = max(ZERO, Fraction(len(picks & right) - len(picks - right), len(right)))
    score = q.points * credit
    status = "correct" if score == q.points else ("partial" if score else "incorrect")
    notes = " ".join(q.feedback.choices[c] for c in sorted(picks) if c in q.feedback.choices)
    return QuestionResult(q.id, score, q.points, _feedback(q, status == "correct", notes), status)


def _numeric(q: Question, value: Any) -> QuestionResult:
    try:
        x = parse_number_answer(value)
    except ValueError as exc:
        return _invalid(q, str(exc))
    a = q.answer
    ok = abs(x - a) <= q.atol + q.rtol * abs(a)
    return QuestionResult(
        q.id, q.points if ok else ZERO, q.points, _feedback(q, ok), "correct" if ok else "incorrect"
    )


def _text(q: Question, value: Any) -> QuestionResult:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        return _invalid(q, "expected text")
    given = normalize_text(value, q.normalize)
    ok = any(given == normalize_text(a, q.normalize) for a in q.answer)
    return QuestionResult(
        q.id, q.points if ok else ZERO, q.points, _feedback(q, ok), "correct" if ok else "incorrect"
    )


def _code(q: Question, value: Any, result: CodeResult | None) -> QuestionResult:
    if not isinstance(value, str) or not value.strip():
        return _invalid(q, "expected Python source code")
    if result is None:
        result = run_code_question(q, value)
    score = q.points * Fraction(result.passed, result.total) if result.total else ZERO
    ok = result.total > 0 and result.passed == result.total
    status = "correct" if ok else ("partial" if score else "incorrect")
    summary = f"{result.passed} of {result.total} checks passed."
    if result.note:
        summary = f"{summary} {result.note}"
    return QuestionResult(q.id, score, q.points, _feedback(q, ok, summary), status)


def _invalid(q: Question, why: str) -> QuestionResult:
    feedback = _feedback(q, False, f"Answer not graded: {why}.")
    return QuestionResult(q.id, ZERO, q.points, feedback, "invalid", note=why)


def score_question(
    q: Question, value: Any, code_result: CodeResult | None = None
) -> QuestionResult:
    """Score one answer by the rules above; ``None`` (or empty) is unanswered."""
    if value is None or (isinstance(value, str | list) and not value and q.type != "text"):
        return QuestionResult(
            q.id, ZERO, q.points, _feedback(q, False, "Not answered."), "unanswered"
        )
    if q.type == "single":
        return _single(q, value)
    if q.type == "multi":
        return _multi(q, value)
    if q.type == "numeric":
        return _numeric(q, value)
    if q.type == "text":
        if isinstance(value, str) and not value.strip():
            return QuestionResult(
                q.id, ZERO, q.points, _feedback(q, False, "Not answered."), "unanswered"
            )
        return _text(q, value)
    return _code(q, value, code_result)


# ---------------------------------------------------------------- one student


def questions_for(quiz: Quiz, student: str) -> list[Question]:
    """The questions drawn for ``student`` (all of them unless the quiz draws)."""
    if quiz.draw is None:
        return list(quiz.questions)
    ids, _ = order_ids(quiz.ids, {}, seed=seed_for(quiz.id, quiz.version, student), draw=quiz.draw)
    chosen = set(ids)
    return [q for q in quiz.questions if q.id in chosen]


def error_result(
    student: str, message: str, quiz: Quiz | None = None, file: str | None = None
) -> StudentResult:
    """The result for a submission that could not be graded (score 0, not passed)."""
    return StudentResult(
        student=student,
        score=ZERO,
        max_score=quiz.max_score if quiz else ZERO,
        passed=False,
        quiz=quiz.id if quiz else "",
        version=quiz.version if quiz else 0,
        pass_mark=quiz.pass_mark if quiz else ZERO,
        file=file,
        error=message,
    )


def grade(
    key: Quiz | dict | str | Path,
    answers: Answers,
    *,
    code_results: dict[str, CodeResult] | None = None,
    file: str | None = None,
) -> StudentResult:
    """Grade ``answers`` with the private ``key`` (a Quiz, the key dict, or its path).

    ``code_results`` may hold precomputed results of code questions (the class grader
    runs them in parallel); missing ones are run here. A wrong quiz id or version gives
    an error result; unknown question ids are reported as warnings and ignored.
    """
    quiz = load_key(key)
    problems = check_answers(quiz, answers)
    if problems:
        return error_result(answers.student, "; ".join(problems), quiz, file)
    questions = questions_for(quiz, answers.student)
    warnings = []
    expected_seed = seed_for(quiz.id, quiz.version, answers.student)
    if quiz.shuffles and answers.seed is not None and answers.seed != expected_seed:
        warnings.append(
            f"the stored seed {answers.seed} is not this student's seed; graded with {expected_seed}"
        )
    drawn = {q.id for q in questions}
    for qid in answers.answers:
        if qid not in drawn:
            why = (
                "not a question of this quiz"
                if qid not in quiz.ids
                else "not drawn for this student"
            )
            warnings.append(f"answer for {qid!r} ignored: {why}")
    code_results = code_results or {}
    results = [
        score_question(q, answers.answers.get(q.id), code_results.get(q.id)) for q in questions
    ]
    warnings += [f"{r.id}: answer not graded: {r.note}" for r in results if r.status == "invalid"]
    score = sum((r.score for r in results), ZERO)
    max_score = sum((q.points for q in questions), ZERO)
    return StudentResult(
        student=answers.student,
        score=score,
        max_score=max_score,
        passed=score >= quiz.pass_mark * max_score,
        questions=results,
        quiz=quiz.id,
        version=quiz.version,
        pass_mark=quiz.pass_mark,
        file=file,
        warnings=warnings,
    )
