"""Grades that leave the machine: one model for a lab's and a quiz's results, and its exports.

``ddtk course grade`` and ``ddtk quiz grade`` each turn their rows into :class:`Grade`
(a student, an assignment, and one :class:`Item` per exercise or question), and every
export reads only that:

- :mod:`~ddtk.gradebook.gradescope`: Gradescope's autograder ``results.json``, one per
  student (a test per item, with its score, status and output);
- :mod:`~ddtk.gradebook.canvas`: a Canvas gradebook CSV that Canvas's *Import* takes,
  matched to the class roster when the instructor gives Canvas's own export;
- :mod:`~ddtk.gradebook.feedback`: a self-contained HTML page per student: each item's
  verdict, the check's message, and what to fix. It names no one else.

Scores are exact (:class:`~fractions.Fraction`) until they are written; files get
:func:`number`: an integer when whole, else a float rounded to 4 places.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

STATUSES = ("pass", "fail", "error")


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: object) -> str:
    """``value`` as CSV text that a spreadsheet shows as text, never runs as a formula."""
    text = str(value)
    return "'" + text if text.startswith(_FORMULA) else text


def number(x: Fraction | int | float) -> int | float:
    """``x`` for a file: an int when whole, else a float rounded to 4 decimal places."""
    x = Fraction(x)
    return int(x) if x.denominator == 1 else round(float(x), 4)


@dataclass(frozen=True)
class Item:
    """One graded exercise or question of one student."""

    number: str  # "3" for exercise 3, "q4" for a quiz question
    name: str  # what the learner knows it by
    score: Fraction
    max_score: Fraction
    status: str  # pass, fail or error
    message: str = ""  # what the check said
    fix: str = ""  # what to do about it

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")
        if not 0 <= self.score <= self.max_score:
            raise ValueError(f"{self.name}: score {self.score} is outside 0..{self.max_score}")


@dataclass(frozen=True)
class Grade:
    """One student's graded submission of one assignment."""

    student: str
    assignment: str  # short name: lab01-ray-train, quiz id
    title: str  # what the class calls it
    max_score: Fraction
    status: str
    items: tuple[Item, ...] = ()
    error: str | None = None  # why it could not be (fully) graded
    notes: tuple[str, ...] = field(default=())
    seconds: float = 0.0

    @property
    def score(self) -> Fraction:
        return sum((i.score for i in self.items), Fraction(0))


def fix_for(status: str, message: str) -> str:
    """What a learner should do about an exercise with this outcome: one plain sentence."""
    if status == "pass":
        return ""
    if "not done yet" in message or "NotImplementedError" in message:
        return ("Replace the exercise's `raise NotImplementedError(...)` with your answer, "
                "then run its cell and the check below it.")  # fmt: skip
    if message.startswith("not run"):
        return ("The run stopped before this check: make the notebook run from top to bottom "
                "within the time limit (Kernel > Restart and Run All), then hand it in again.")  # fmt: skip
    if "earns nothing" in message:
        return "Write the exercise yourself: the message names what the answer may not import."
    if status == "error":
        return ("Your code raised an error before the check could decide: run the cell in your "
                "notebook and read the traceback.")  # fmt: skip
    return ("The answer ran but did not do what the check expects: the message says what was "
            "expected and what came back; rerun the check in your notebook after fixing it.")  # fmt: skip


__all__ = ["STATUSES", "Grade", "Item", "fix_for", "number", "spreadsheet_safe"]
