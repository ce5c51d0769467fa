"""Take a quiz from Python or a notebook: record answers, save them, check yourself.

:class:`QuizSession` is the learner's side of :mod:`ddtk.quiz`. It reads the public
quiz file (prompts and choices, no answers) and, optionally, the self-check file
(salted hashes). Answers are recorded by question id and choice id, each checked at
once so that a typo is caught when it is typed, not when the quiz is graded. Three
routes lead to the same answers file:

- ``session.answer("pick-parallelism", "b")`` in code;
- the ipywidgets form of :meth:`QuizSession.widget` in JupyterLab;
- editing the YAML file written by :meth:`QuizSession.template`, then :meth:`QuizSession.load`.

:meth:`QuizSession.save` writes the answers file (with the student's seed when the
quiz shuffles) and :meth:`QuizSession.check` reports "correct" / "not yet" per
question without the key. Grading by key (``ddtk quiz grade``) is the instructor's.

>>> import tempfile, pathlib
>>> from ddtk.quiz import build
>>> tmp = pathlib.Path(tempfile.mkdtemp())
>>> _ = (tmp / "demo.source.yaml").write_text('''
... quiz: {id: demo, version: 1, pass_mark: 1/2}
... questions:
...   - {id: q1, type: single, prompt: "Pick b", answer: b,
...      choices: [{id: a, text: "A"}, {id: b, text: "B"}]}
...   - {id: q2, type: numeric, prompt: "7/4?", answer: 1.75, atol: 0.01}
... ''')
>>> built = build(tmp / "demo.source.yaml", tmp, tmp / "demo.key.json")
>>> s = QuizSession(built.public, built.selfcheck, student="alice",
...                 answers_path=tmp / "alice.yaml")
>>> s.answer("q1", "b")
>>> s.answer("q2", " 7/4 ")
>>> s.save().name
'alice.yaml'
>>> report = s.check()
>>> report.status, report.score, report.passed
({'q1': 'correct', 'q2': 'correct'}, Fraction(2, 1), True)
>>> s.answer("q1", "c")
Traceback (most recent call last):
...
ValueError: question 'q1': 'c' is not one of its choices ['a', 'b']
"""

from __future__ import annotations

import ast
import difflib
import json
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from ddtk.quiz.answers import STUDENT_RE, Answers, read_answers, write_answers
from ddtk.quiz.grading import parse_number_answer
from ddtk.quiz.model import Question, Quiz, format_score
from ddtk.quiz.seeding import order_for, seed_for
from ddtk.quiz.selfcheck import SelfCheckReport, self_check
from ddtk.quiz.source import load_public

_EMPTY = (None, "", [], ())


def check_student(student: Any) -> str:
    """Return ``student`` as a valid student id or raise ValueError saying what is allowed."""
    if not isinstance(student, str) or not STUDENT_RE.match(student):
        raise ValueError(
            f"student id must be letters, digits, '.', '_' or '-' (e.g. alice or s1234), "
            f"got {student!r}"
        )
    return student


def format_report(report: SelfCheckReport) -> str:
    """The self-check as text: a score line, then one line per question."""
    pct = float(100 * report.score / report.max_score) if report.max_score else 0.0
    verdict = "passed" if report.passed else "not yet passed"
    lines = [
        f"Self-check for {report.student}: score {format_score(report.score)}"
        f"/{format_score(report.max_score)} ({pct:.0f}%), "
        f"pass mark {float(100 * report.pass_mark):.0f}%: {verdict}"
    ]
    lines += [f"  {item.status:<10} {item.id}" for item in report.questions]
    lines.append(report.note)
    return "\n".join(lines)


class QuizSession:
    """A learner's attempt at one quiz: answers by id, saved to an answers file.

    ``public_path`` is the public quiz (YAML), ``selfcheck_path`` the self-check JSON
    (needed by :meth:`check` only). ``student`` may be given later (``session.student =
    "alice"``); it must be set before saving, and it fixes the order of questions and
    choices when the quiz shuffles. ``answers_path`` defaults to
    ``<quiz id>-<student>.answers.yaml`` in the working directory; when that file
    already exists, its answers are loaded so that work carries over between sessions.
    """

    def __init__(
        self,
        public_path: str | Path,
        selfcheck_path: str | Path | None = None,
        student: str | None = None,
        answers_path: str | Path | None = None,
    ) -> None:
        self.quiz: Quiz = load_public(public_path)
        self.selfcheck_path = Path(selfcheck_path) if selfcheck_path is not None else None
        self._selfcheck: dict[str, Any] | None = None
        self._student: str | None = None
        self._answers: dict[str, Any] = {}
        self._answers_path = Path(answers_path) if answers_path is not None else None
        if student:
            self.student = student
        path = self._answers_path if self._answers_path is not None else self._default_path()
        if path is not None and path.is_file():
            self.load(path)

    # ---- identity and order -------------------------------------------------------------

    @property
    def student(self) -> str | None:
        """The student id (None until set)."""
        return self._student

    @student.setter
    def student(self, value: str) -> None:
        self._student = check_student(value)
        drawn = set(self.question_ids)
        self._answers = {k: v for k, v in self._answers.items() if k in drawn}

    @property
    def answers_path(self) -> Path:
        """Where :meth:`save` writes by default."""
        path = self._answers_path or self._default_path()
        if path is None:
            raise ValueError("no student id yet: set session.student = '...' or pass a path")
        return path

    def _default_path(self) -> Path | None:
        if self._student is None:
            return None
        return Path(f"{self.quiz.id}-{self._student}.answers.yaml")

    @property
    def seed(self) -> int | None:
        """The student's seed when the quiz draws or shuffles (stored in the answers file)."""
        if not self.quiz.shuffles or self._student is None:
            return None
        return seed_for(self.quiz.id, self.quiz.version, self._student)

    @property
    def question_ids(self) -> list[str]:
        """The ids of this student's questions, in the order shown."""
        if self._student is None or not self.quiz.shuffles:
            return list(self.quiz.ids)
        return order_for(self.quiz, self._student)[0]

    @property
    def questions(self) -> list[Question]:
        """This student's questions in the order shown, choices in the order shown.

        Before a student id is set, a quiz that draws or shuffles shows every question
        in source order; set the student first to see the personal order.
        """
        if self._student is None or not self.quiz.shuffles:
            return list(self.quiz.questions)
        ids, choice_order = order_for(self.quiz, self._student)
        out = []
        for qid in ids:
            q = self.quiz.question(qid)
            if qid in choice_order:
                by_id = {c.id: c for c in q.choices}
                q = replace(q, choices=tuple(by_id[c] for c in choice_order[qid]))
            out.append(q)
        return out

    def question(self, qid: str) -> Question:
        """The question ``qid``, or ValueError naming the close matches."""
        if qid in self.quiz.ids and qid in self.question_ids:
            return self.quiz.question(qid)
        if qid in self.quiz.ids:
            raise ValueError(
                f"question {qid!r} is not among the questions drawn for {self._student}"
            )
        near = difflib.get_close_matches(str(qid), self.quiz.ids, n=3)
        hint = f"; did you mean {', '.join(map(repr, near))}?" if near else ""
        raise ValueError(f"unknown question id {qid!r} in quiz {self.quiz.id!r}{hint}")

    # ---- answers ------------------------------------------------------------------------

    @property
    def answers(self) -> dict[str, Any]:
        """A copy of the answers recorded so far, by question id."""
        return dict(self._answers)

    def answer(self, qid: str, value: Any) -> None:
        """Record the answer to ``qid``; None or an empty value clears it.

        Choice questions take choice ids (a list for ``multi``), never positions;
        numeric ones a number or text such as ``"7/4"`` or ``" 1.75e0 "``; text and code
        questions a string. A bad value raises ValueError naming the question.
        """
        q = self.question(qid)
        if value in _EMPTY:
            self._answers.pop(qid, None)
            return
        self._answers[qid] = validate_answer(q, value)

    def clear(self, qid: str | None = None) -> None:
        """Forget the answer to ``qid``, or every answer."""
        if qid is None:
            self._answers.clear()
        else:
            self._answers.pop(self.question(qid).id, None)

    def to_answers(self) -> Answers:
        """The answers as :class:`~ddtk.quiz.Answers` (needs the student id)."""
        if self._student is None:
            raise ValueError("no student id yet: set session.student = '...' before saving")
        order = {qid: i for i, qid in enumerate(self.question_ids)}
        ordered = dict(sorted(self._answers.items(), key=lambda kv: order.get(kv[0], 0)))
        return Answers(self.quiz.id, self.quiz.version, self._student, ordered, self.seed)

    def save(self, path: str | Path | None = None) -> Path:
        """Write the answers file (YAML, or JSON for ``.json``) and return its path."""
        answers = self.to_answers()
        target = Path(path) if path is not None else self.answers_path
        write_answers(target, answers)
        return target

    def load(self, path: str | Path | None = None) -> None:
        """Replace the answers by those of an answers file (e.g. an edited template).

        Every answer is validated; all problems are reported together in one ValueError.
        """
        target = Path(path) if path is not None else self.answers_path
        data = read_answers(target)
        if data.quiz != self.quiz.id or data.version != self.quiz.version:
            raise ValueError(
                f"{target}: answers for {data.quiz!r} version {data.version}, "
                f"not {self.quiz.id!r} version {self.quiz.version}"
            )
        if self._student is not None and data.student != self._student:
            raise ValueError(f"{target}: answers of {data.student!r}, not of {self._student!r}")
        self._student = data.student
        answers: dict[str, Any] = {}
        problems = []
        for qid, value in data.answers.items():
            try:
                q = self.question(qid)
                if value not in _EMPTY:
                    answers[qid] = validate_answer(q, value)
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError(f"{target}: " + "; ".join(problems))
        self._answers = answers

    def template(self, path: str | Path | None = None) -> Path:
        """Write a YAML answers file to edit by hand: every question, prompts as comments.

        Fill in the values, then call :meth:`load` (or just :meth:`check` after
        ``load``). Answers already recorded are filled in.
        """
        answers = self.to_answers()
        target = Path(path) if path is not None else self.answers_path
        head = {"quiz": answers.quiz, "version": answers.version, "student": answers.student}
        if answers.seed is not None:
            head["seed"] = answers.seed
        lines = [yaml.safe_dump(head, sort_keys=False).rstrip(), "answers:"]
        for q in self.questions:
            lines += _template_entry(q, self._answers.get(q.id))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return target

    # ---- checking -----------------------------------------------------------------------

    def check(self) -> SelfCheckReport:
        """Self-check the current answers against the salted hashes (no key needed)."""
        if self.selfcheck_path is None:
            raise ValueError("no self-check file: pass selfcheck_path= to QuizSession")
        if self._selfcheck is None:
            self._selfcheck = json.loads(self.selfcheck_path.read_text(encoding="utf-8"))
        return self_check(self._selfcheck, self.to_answers())

    def summary(self) -> str:
        """The self-check as text (see :func:`format_report`)."""
        return format_report(self.check())

    def widget(self) -> Any:
        """The ipywidgets form for this session (see :mod:`ddtk.quiz.widget`)."""
        from ddtk.quiz.widget import QuizWidget

        return QuizWidget(self).box

    def __repr__(self) -> str:
        return (
            f"QuizSession(quiz={self.quiz.id!r} v{self.quiz.version}, student={self._student!r}, "
            f"answered={len(self._answers)}/{len(self.question_ids)})"
        )


def validate_answer(q: Question, value: Any) -> Any:
    """Check ``value`` for question ``q``; return it as stored (ValueError when wrong)."""
    where = f"question {q.id!r}"
    if q.type == "single":
        if not isinstance(value, str):
            raise ValueError(
                f"{where}: give a choice id such as {q.choice_ids[0]!r} (ids, not positions), "
                f"got {value!r}"
            )
        _check_choice(q, value.strip())
        return value.strip()
    if q.type == "multi":
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list | tuple | set) or not all(
            isinstance(v, str) for v in values
        ):
            raise ValueError(
                f"{where}: give a list of choice ids such as {list(q.choice_ids[:2])!r}, got {value!r}"
            )
        picked = [v.strip() for v in values]
        for v in picked:
            _check_choice(q, v)
        return sorted(set(picked), key=q.choice_ids.index)
    if q.type == "numeric":
        if isinstance(value, bool) or not isinstance(value, int | float | str | Fraction):
            raise ValueError(f"{where}: give a number such as 1.75 or '7/4', got {value!r}")
        try:
            parse_number_answer(value)
        except (ValueError, ZeroDivisionError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        if isinstance(value, Fraction):
            return f"{value.numerator}/{value.denominator}"
        return value.strip() if isinstance(value, str) else value
    if not isinstance(value, str):
        raise ValueError(f"{where}: give text, got {type(value).__name__} {value!r}")
    if q.type == "code":
        _check_code(q, value)
    return value


def _check_choice(q: Question, cid: str) -> None:
    if cid not in q.choice_ids:
        raise ValueError(
            f"question {q.id!r}: {cid!r} is not one of its choices {list(q.choice_ids)}"
        )


def _check_code(q: Question, source: str) -> None:
    """Catch what would surely score zero: a syntax error or a missing function."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(
            f"question {q.id!r}: syntax error at line {exc.lineno}: {exc.msg}"
        ) from None
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    if q.function and q.function not in names:
        raise ValueError(f"question {q.id!r}: define a function named {q.function}()")


def _template_entry(q: Question, current: Any) -> list[str]:
    """YAML lines for one question of the template: the prompt as comments, then the value."""
    lines = [f"  # --- {q.id} ({q.type}, {format_score(q.points)} point(s))"]
    lines += [f"  # {line}".rstrip() for line in q.prompt.strip().splitlines()]
    lines += [f"  #   {c.id}: {c.text}" for c in q.choices]
    if q.type == "multi":
        lines.append("  # a list of choice ids, e.g. [a, c]")
    if q.type == "code":
        code = current if current is not None else (q.starter or f"def {q.function}(): ...\n")
        lines.append(f"  {q.id}: |")
        lines += [f"    {line}".rstrip() for line in code.rstrip().splitlines()]
        return lines
    value = "" if current is None else yaml.safe_dump(current, default_flow_style=True).strip()
    value = value.removesuffix("\n...").strip()
    lines.append(f"  {q.id}: {value}".rstrip())
    return lines
