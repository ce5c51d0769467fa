"""Grade a class's lab notebooks: find, restore, run each distinct notebook once, score.

1. Every submission is found and read (:mod:`~ddtk.course.grading.submissions`); a bad
   one becomes an ``error`` row at once, and so does a second submission under a name
   already seen.
2. Each readable notebook gets the instructor's check and parameters cells back
   (:mod:`~ddtk.course.grading.restore`).
3. Notebooks whose restored code is identical (same fingerprint) are **run once**: every
   student who handed it in gets that run's result. Handing in the untouched stub, or
   the solution with its checks tampered with, costs nothing extra; identical answers
   are also worth an instructor's look, so the class report lists them (a student's own
   results never name a classmate).
4. The distinct notebooks run in sandboxes (:mod:`~ddtk.course.grading.sandbox`), one at
   a time or ``jobs`` at once, and each run is scored (:mod:`~ddtk.course.grading.score`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddtk.course.grading.jail import private_paths
from ddtk.course.grading.restore import fingerprint, restore
from ddtk.course.grading.sandbox import execute
from ddtk.course.grading.score import (
    CheckSpec,
    StudentResult,
    error_row,
    lab_checks,
    lab_points,
    score_run,
)
from ddtk.course.grading.submissions import Submission, find_submissions, load, notebook_title
from ddtk.quiz.classgrade import ClassTally

if TYPE_CHECKING:
    from nbformat import NotebookNode

    from ddtk.course.executions import ExecutionCache

# Called with the students of a run when it starts, and with their rows when it ends.
StartCallback = Callable[[list[str]], None]
DoneCallback = Callable[[list[StudentResult]], None]


@dataclass
class ClassResult(ClassTally):
    """Every student's row (in name order), the lab, how many runs it took and how long;
    ``exercises``: the lab's ``(number, title, points)``, for rows with none (errors)."""

    lab: str
    title: str
    results: list[StudentResult] = field(default_factory=list)
    exercises: list[tuple[int, str, Fraction]] = field(default_factory=list)
    executions: int = 0
    seconds: float = 0.0


@dataclass
class _Group:
    """Students whose restored notebooks are identical: one run serves them all."""

    notebook: NotebookNode
    members: list[tuple[Submission, list[str]]] = field(default_factory=list)

    @property
    def students(self) -> list[str]:
        return [sub.student for sub, _notes in self.members]


def _judged(
    lab: Path, solution: NotebookNode, nb: NotebookNode, parameters: Mapping[str, Any],
    hide: list[Path],
) -> dict[int, Any]:  # fmt: skip
    """The verdicts of the lab's exercises judged outside the kernel (none when it has no judge)."""
    from ddtk.course.judges import judge_for
    from ddtk.course.judging import Verdict, judge_notebook

    judge = judge_for(lab.stem)
    if judge is None:
        return {}
    try:
        return judge_notebook(judge, solution, nb, parameters=parameters, hide=hide)
    except Exception as exc:  # the judge itself broke: this student's exercises are errors
        why = f"the judge could not check it ({type(exc).__name__}: {exc})"
        return {n: Verdict(n, e.title, "error", why) for n, e in judge.exercises.items()}


def _rows(
    group: _Group, specs: list[CheckSpec], run: Any, judged: dict[int, Any],
    points: dict[int, Fraction],
) -> list[StudentResult]:  # fmt: skip
    rows = []
    for sub, notes in group.members:
        row = score_run(sub.student, str(sub.path), specs, run, notes, judged, points)
        # for the instructor's class report only: a student's own results never name another
        row.same_as = [s for s in group.students if s != sub.student]
        rows.append(row)
    return rows


def _group(
    subs: list[Submission], solution: NotebookNode, specs: list[CheckSpec],
    parameters: Mapping[str, Any], lab: Path, points: dict[int, Fraction],
) -> tuple[list[StudentResult], list[_Group]]:  # fmt: skip
    """Error rows for unusable submissions, and the runnable ones grouped by fingerprint."""
    errors: list[StudentResult] = []
    groups: dict[str, _Group] = {}
    seen: dict[str, Path] = {}
    for sub in subs:
        if sub.student in seen:
            reason = (
                f"a second submission for {sub.student!r} (also {seen[sub.student]}); not graded"
            )
            errors.append(error_row(sub.student, str(sub.path), specs, reason, points))
            continue
        seen[sub.student] = sub.path
        load(sub, solution, lab)
        if sub.notebook is None:
            why = sub.error or "unreadable"
            errors.append(error_row(sub.student, str(sub.path), specs, why, points))
            continue
        restored = restore(sub.notebook, solution, parameters)
        key = fingerprint(restored.notebook)
        groups.setdefault(key, _Group(restored.notebook)).members.append((sub, restored.notes))
    return errors, list(groups.values())


def grade_lab(
    lab: Path,
    submissions: Path,
    *,
    parameters: Mapping[str, Any] | None = None,
    jobs: int = 1,
    timeout: float = 900.0,
    memory_mb: int = 8192,
    skip: tuple[Path, ...] = (),
    on_start: StartCallback | None = None,
    on_done: DoneCallback | None = None,
    cache: ExecutionCache | None = None,
) -> ClassResult:
    """Grade every submission in ``submissions`` against the solution notebook ``lab``.

    Raises :class:`~ddtk.course.notebooks.NotebookError` for an unusable solution and
    FileNotFoundError / NotADirectoryError for a missing submissions folder; everything
    wrong with a submission is a row. With ``cache``, a notebook whose run is stored
    there (same code, limits and environment) is not run again.
    """
    from ddtk.course.notebooks import read_notebook

    started = time.perf_counter()
    solution = read_notebook(lab)
    specs = lab_checks(solution, str(lab))
    points = lab_points(solution, specs, str(lab))
    subs = find_submissions(submissions, skip)
    hide = private_paths(lab.parent, submissions, *skip)
    errors, groups = _group(subs, solution, specs, dict(parameters or {}), lab, points)
    result = ClassResult(lab.stem, notebook_title(solution) or lab.stem, executions=len(groups))
    result.exercises = [(n, t, points[n]) for s in specs for n, t in s.exercises]
    if on_done is not None and errors:
        on_done(errors)

    # One judge at a time (its reference runs share this process's global RNGs), beside
    # the kernels: a group is judged while its notebook runs, which mostly waits.
    judge_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ddtk-judge")

    def grade_group(group: _Group) -> list[StudentResult]:
        if on_start is not None:
            on_start(group.students)
        judging = judge_pool.submit(
            _judged, lab, solution, group.notebook, dict(parameters or {}), hide
        )
        limits = {"name": lab.name, "timeout": timeout, "memory_mb": memory_mb}
        if cache is not None:
            run = cache.sandboxed(group.notebook, **limits, hide=hide)
        else:
            run = execute(group.notebook, **limits, hide=hide)
        rows = _rows(group, specs, run, judging.result(), points)
        if on_done is not None:
            on_done(rows)
        return rows

    rows = list(errors)
    with judge_pool, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for group_rows in pool.map(grade_group, groups):
            rows += group_rows
    result.results = sorted(rows, key=lambda r: r.student)
    result.seconds = time.perf_counter() - started
    return result


__all__ = ["ClassResult", "grade_lab"]
