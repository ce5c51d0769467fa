"""The quiz data model: a :class:`Quiz` holds :class:`Question` objects.

These are plain frozen dataclasses with no behaviour beyond lookups, so that the
loader (:mod:`ddtk.quiz.source`), the builder, the grader and the notebook session
all speak about the same objects. Points, tolerances, the pass mark and numeric
answers are :class:`fractions.Fraction`, so that no score is ever off by rounding.

>>> from fractions import Fraction
>>> q = Question(id="q1", type="single", points=Fraction(1), prompt="Pick one",
...              choices=(Choice("a", "yes"), Choice("b", "no")), answer="a")
>>> quiz = Quiz(id="demo", version=1, title="Demo", pass_mark=Fraction(4, 5), questions=(q,))
>>> quiz.question("q1").choice_ids
('a', 'b')
>>> quiz.max_score
Fraction(1, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

QUESTION_TYPES = ("single", "multi", "numeric", "text", "code")
TEXT_RULES = ("case", "whitespace", "hyphens")


@dataclass(frozen=True)
class Choice:
    """One option of a single- or multiple-choice question, referred to by ``id``."""

    id: str
    text: str


@dataclass(frozen=True)
class Feedback:
    """Teaching feedback shown after grading by key (never by self-check)."""

    correct: str = ""
    incorrect: str = ""
    choices: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Question:
    """One quiz question. Private fields (answer, solution, tests, feedback) are empty
    in a quiz loaded from the public file."""

    id: str
    type: str
    points: Fraction
    prompt: str
    lecture: int | None = None
    objectives: tuple[str, ...] = ()
    choices: tuple[Choice, ...] = ()
    answer: Any = None  # single: str; multi: tuple[str]; numeric: Fraction; text: tuple[str]
    rtol: Fraction = Fraction(0)
    atol: Fraction = Fraction(0)
    normalize: tuple[str, ...] = TEXT_RULES
    function: str | None = None
    starter: str | None = None
    solution: str | None = None
    tests: str | None = None
    timeout: float = 10.0
    feedback: Feedback = field(default_factory=Feedback)
    line: int | None = None  # line of the question in the source, when known

    @property
    def choice_ids(self) -> tuple[str, ...]:
        """The choice ids in source order."""
        return tuple(c.id for c in self.choices)


@dataclass(frozen=True)
class Quiz:
    """A quiz: metadata, the pass mark (a fraction of the maximum score) and questions."""

    id: str
    version: int
    title: str
    pass_mark: Fraction
    questions: tuple[Question, ...]
    draw: int | None = None
    shuffle_questions: bool = False
    shuffle_choices: bool = False
    description: str = ""

    @property
    def shuffles(self) -> bool:
        """True when a student's quiz depends on a seed (drawn or shuffled)."""
        return self.draw is not None or self.shuffle_questions or self.shuffle_choices

    @property
    def max_score(self) -> Fraction:
        """The sum of all question points (a student drawing fewer questions has less)."""
        return sum((q.points for q in self.questions), Fraction(0))

    @property
    def ids(self) -> tuple[str, ...]:
        """Question ids in source order."""
        return tuple(q.id for q in self.questions)

    def question(self, qid: str) -> Question:
        """Return the question with id ``qid`` (KeyError when there is none)."""
        for q in self.questions:
            if q.id == qid:
                return q
        raise KeyError(qid)


@dataclass(frozen=True)
class Problem:
    """One validation problem: where (question id, field, line) and what."""

    message: str
    question: str | None = None
    field: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        parts = []
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.question is not None:
            parts.append(f"question {self.question!r}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        where = ", ".join(parts)
        return f"{where}: {self.message}" if where else self.message


class QuizSourceError(ValueError):
    """A quiz source (or key or public file) is invalid; lists every problem found.

    ``question``, ``field`` and ``line`` describe the first problem.
    """

    def __init__(self, problems: list[Problem], path: str | None = None) -> None:
        self.problems = list(problems)
        self.path = path
        first = self.problems[0] if self.problems else Problem("invalid quiz")
        self.question, self.field, self.line = first.question, first.field, first.line
        head = f"{path}: " if path else ""
        if len(self.problems) == 1:
            text = f"{head}{first}"
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            text = f"{head}{len(self.problems)} problems:\n{lines}"
        super().__init__(text)


def fraction_str(x: Fraction) -> int | str:
    """Write a Fraction for YAML/JSON: an int when whole, else ``"p/q"``."""
    return int(x) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def format_score(x: Fraction) -> str:
    """A score as ``3`` or ``7/2``."""
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"
