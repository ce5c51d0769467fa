"""Grade a whole class: files or folders of answers -> results.json, grades.csv, a table.

Every answers file is graded on its own: a file that cannot be read or is for another
quiz becomes an ``error`` row for that student and everyone else is still graded. The
code questions of all students run first, in parallel subprocesses, so a class of 30
takes about as long as a few code runs. A second file for a student already seen
(files are taken in sorted path order) is an error row too, so nobody is graded twice.

>>> import tempfile, pathlib
>>> from ddtk.quiz.source import load_source_text
>>> from ddtk.quiz.answers import Answers, write_answers
>>> quiz = load_source_text('''
... quiz: {id: demo, version: 1, pass_mark: 1/2}
... questions:
...   - {id: q1, type: single, prompt: "Pick", answer: b,
...      choices: [{id: a, text: A}, {id: b, text: B}]}
... ''')
>>> tmp = pathlib.Path(tempfile.mkdtemp())
>>> write_answers(tmp / "ann.yaml", Answers("demo", 1, "ann", {"q1": "b"}))
>>> _ = (tmp / "bad.json").write_text("{not json")
>>> result = grade_class(quiz, [tmp])
>>> [(r.student, r.status) for r in result.results], result.exit_code
([('ann', 'pass'), ('bad.json', 'error')], 1)
"""

from __future__ import annotations

import csv
import io
import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from ddtk.quiz.answers import Answers, AnswersError, check_answers, read_answers
from ddtk.quiz.grading import CodeResult, StudentResult, error_result, grade, questions_for
from ddtk.quiz.model import Quiz
from ddtk.quiz.source import load_key

ANSWER_SUFFIXES = (".yaml", ".yml", ".json")
OUTPUT_NAMES = ("results.json", "grades.csv", "canvas.csv", "canvas-unmatched.txt")


class ClassTally:
    """What a class's results add up to; any class with ``results`` (each with a ``status``)."""

    results: list[Any]

    @property
    def exit_code(self) -> int:
        """0 when every student passed, 1 when someone failed or could not be graded."""
        return 0 if self.results and all(r.status == "pass" for r in self.results) else 1

    def counts(self) -> dict[str, int]:
        """How many students passed, failed and could not be graded."""
        out = {"pass": 0, "fail": 0, "error": 0}
        for r in self.results:
            out[r.status] += 1
        return out


@dataclass
class ClassResult(ClassTally):
    """Every student's result, in file order, and how long grading took."""

    quiz: Quiz
    results: list[StudentResult] = field(default_factory=list)
    seconds: float = 0.0
    code_runs: int = 0


def collect_paths(paths: Iterable[str | Path], skip: Iterable[str | Path] = ()) -> list[Path]:
    """Expand folders into their answers files (recursively, sorted); keep files as given.

    Raises FileNotFoundError for a path that does not exist. Files under ``skip``
    (the output folder, the key) and earlier outputs are left out.
    """
    skipped = [Path(s).resolve() for s in skip]

    def keep(p: Path) -> bool:
        rp = p.resolve()
        return not any(rp == s or s in rp.parents for s in skipped)

    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for p in sorted(path.rglob("*")):
                rel = p.relative_to(path).parts
                if (
                    p.is_file()
                    and p.suffix.lower() in ANSWER_SUFFIXES
                    and p.name not in OUTPUT_NAMES
                    and not any(part.startswith(".") for part in rel)
                    and keep(p)
                ):
                    found.append(p)
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")
    return list(dict.fromkeys(found))


def _read_all(quiz: Quiz, files: Sequence[Path]) -> list[Answers | StudentResult]:
    seen: dict[str, Path] = {}
    out: list[Answers | StudentResult] = []
    for path in files:
        try:
            answers = read_answers(path)
        except AnswersError as exc:
            out.append(error_result(exc.student or path.name, exc.message, quiz, str(path)))
            continue
        if answers.student in seen:
            msg = f"second answers file for {answers.student!r} (also {seen[answers.student]}); not graded"
            out.append(error_result(answers.student, msg, quiz, str(path)))
            continue
        seen[answers.student] = path
        out.append(answers)
    return out


def grade_class(
    key: Quiz | dict | str | Path,
    paths: Iterable[str | Path],
    *,
    workers: int | None = None,
    skip: Iterable[str | Path] = (),
) -> ClassResult:
    """Grade every answers file in ``paths`` (files or folders) with ``key``."""
    from ddtk.quiz.codecheck import run_many

    start = time.perf_counter()
    quiz = load_key(key)
    files = collect_paths(paths, skip)
    entries = _read_all(quiz, files)
    jobs, owners = [], []
    for i, entry in enumerate(entries):
        if isinstance(entry, Answers) and not check_answers(quiz, entry):
            for q in questions_for(quiz, entry.student):
                value = entry.answers.get(q.id)
                if q.type == "code" and isinstance(value, str) and value.strip():
                    jobs.append((q, value))
                    owners.append((i, q.id))
    code: dict[int, dict[str, CodeResult]] = {}
    for (i, qid), res in zip(owners, run_many(jobs, workers)):
        code.setdefault(i, {})[qid] = res
    result = ClassResult(quiz, code_runs=len(jobs))
    for i, (entry, path) in enumerate(zip(entries, files)):
        if isinstance(entry, StudentResult):
            result.results.append(entry)
        else:
            result.results.append(grade(quiz, entry, code_results=code.get(i, {}), file=str(path)))
    result.seconds = time.perf_counter() - start
    return result


# ---------------------------------------------------------------- outputs


def _frac(x: Fraction) -> str:
    return str(x)


def result_to_dict(r: StudentResult) -> dict[str, Any]:
    """A student's result as JSON data; scores are exact ``"p/q"`` strings plus a float."""
    return {
        "student": r.student,
        "quiz": r.quiz,
        "version": r.version,
        "file": r.file,
        "status": r.status,
        "score": _frac(r.score),
        "max_score": _frac(r.max_score),
        "percent": round(r.percent, 2),
        "pass_mark": _frac(r.pass_mark),
        "passed": r.passed,
        "error": r.error,
        "warnings": list(r.warnings),
        "questions": [
            {
                "id": q.id,
                "score": _frac(q.score),
                "max": _frac(q.max),
                "status": q.status,
                "feedback": q.feedback,
            }
            for q in r.questions
        ],
    }


def _folder_name(r: StudentResult, used: set[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", r.student).lstrip(".") or "_"
    if r.error is not None or name in OUTPUT_NAMES:
        name = f"{name}.error" if r.error is not None else f"_{name}"
    base, n = name, 2
    while name in used:
        name, n = f"{base}-{n}", n + 1
    used.add(name)
    return name


_QUIZ_STATUS = {"correct": "pass", "partial": "fail", "incorrect": "fail", "unanswered": "fail",
                "invalid": "error"}  # fmt: skip
_QUIZ_FIX = {
    "partial": "Part of the answer earned points: the feedback says what the rest needs.",
    "incorrect": "Read the feedback, then the lecture section it points to.",
    "unanswered": "This question was not answered.",
    "invalid": "The answer could not be read for this question's type: see the note.",
}


def quiz_grade(r: StudentResult, quiz: Quiz) -> Any:
    """A student's result as a :class:`~ddtk.gradebook.Grade`, for the exports."""
    from ddtk.gradebook import Grade, Item

    items = tuple(
        Item(q.id, q.id, q.score, q.max, _QUIZ_STATUS.get(q.status, "fail"),
             q.note if q.status == "invalid" else q.feedback, _QUIZ_FIX.get(q.status, ""))
        for q in r.questions
    )  # fmt: skip
    status = "error" if r.error else ("pass" if r.passed else "fail")
    return Grade(r.student, quiz.id, quiz.title or quiz.id, r.max_score, status, items,
                 r.error, tuple(r.warnings))  # fmt: skip


def write_results(
    result: ClassResult, out_dir: str | Path, *, roster: Sequence[dict[str, str]] | None = None,
    canvas_column: str | None = None,
) -> list[Path]:  # fmt: skip
    """Write ``out_dir/<student>/results.json``, ``feedback.html`` and ``gradescope.json``
    for every row (``<name>.error/`` for a file that could not be graded), and
    ``out_dir/grades.csv`` and ``out_dir/canvas.csv`` (:mod:`ddtk.gradebook`: scores scaled
    to the quiz's full points where students drew different questions); return the paths."""
    from ddtk.gradebook.canvas import gradebook_csv
    from ddtk.gradebook.feedback import feedback_html
    from ddtk.gradebook.gradescope import results_json
    from ddtk.quiz.files import write_text

    out_dir = Path(out_dir)
    written, used = [], set()
    grades = [quiz_grade(r, result.quiz) for r in result.results]
    for r, export in zip(result.results, grades, strict=True):
        folder = out_dir / _folder_name(r, used)
        for name, text in (
            ("results.json", json.dumps(result_to_dict(r), indent=2, ensure_ascii=False) + "\n"),
            ("feedback.html", feedback_html(export)),
            ("gradescope.json", json.dumps(results_json(export), indent=2) + "\n"),
        ):
            write_text(folder / name, text, durable=False)
            written.append(folder / name)
    written.append(write_grades_csv(result, out_dir / "grades.csv"))
    canvas, unknown = gradebook_csv(grades, canvas_column or result.quiz.title or result.quiz.id,
                                    roster, result.quiz.max_score)  # fmt: skip
    write_text(out_dir / "canvas.csv", canvas)
    written.append(out_dir / "canvas.csv")
    unmatched = out_dir / "canvas-unmatched.txt"
    if unknown:
        write_text(unmatched, "".join(f"{s}\n" for s in unknown))
        written.append(unmatched)
    elif unmatched.exists():
        unmatched.unlink()
    return written


def grades_csv_text(result: ClassResult) -> str:
    """The class ``grades.csv``: one row per file, exact scores and a percentage."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(
        ["student", "score", "max_score", "percent", "passed", "status", "file", "error"]
    )
    for r in result.results:
        writer.writerow(
            [
                r.student,
                _frac(r.score),
                _frac(r.max_score),
                f"{r.percent:.2f}",
                str(r.passed).lower(),
                r.status,
                r.file or "",
                r.error or "",
            ]
        )
    return buf.getvalue()


def write_grades_csv(result: ClassResult, path: str | Path) -> Path:
    """Write :func:`grades_csv_text` atomically to ``path``."""
    from ddtk.quiz.files import write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = grades_csv_text(result)
    write_text(path, text)
    return path


def summary_table(result: ClassResult) -> Any:
    """A rich table: one row per student, then the counts and the time taken."""
    from rich.markup import escape
    from rich.table import Table

    q = result.quiz
    counts = result.counts()
    table = Table(
        title=f"{q.id} v{q.version}: pass mark {float(q.pass_mark) * 100:g}%",
        caption=(
            f"{counts['pass']} passed, {counts['fail']} failed, {counts['error']} not graded; "
            f"{len(result.results)} files, {result.code_runs} code runs, {result.seconds:.2f} s"
        ),
    )
    for name, justify in (
        ("student", "left"),
        ("score", "right"),
        ("%", "right"),
        ("result", "left"),
        ("note", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    styles = {"pass": "green", "fail": "bold red", "error": "bold yellow"}
    for r in result.results:
        score = "-" if r.error else f"{_short(r.score)}/{_short(r.max_score)}"
        pct = "-" if r.error else f"{r.percent:.1f}"
        note = r.error or "; ".join(r.warnings)
        table.add_row(
            escape(r.student), score, pct, f"[{styles[r.status]}]{r.status}[/]", escape(note)
        )
    return table


def _short(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):.2f}"
