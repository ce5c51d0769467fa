"""``ddtk quiz build|check|grade|selfcheck``: the quiz tools from the command line.

Exit codes: 0 when all is well (everyone passed), 1 when someone failed or could not
be graded (or a check found a problem), 2 for usage errors (a missing or invalid
key, no answers files, a bad path).

    ddtk quiz check solutions/quiz/module-quiz.source.yaml
    ddtk quiz build solutions/quiz/module-quiz.source.yaml --out quizzes \\
        --key solutions/quiz/module-quiz.key.json
    ddtk quiz grade submissions/ --key solutions/quiz/module-quiz.key.json --out grades/
    ddtk quiz selfcheck my-answers.yaml --selfcheck quizzes/module-quiz.selfcheck.json

>>> parser = argparse.ArgumentParser(prog="ddtk")
>>> _ = add_parser(parser.add_subparsers())
>>> args = parser.parse_args(["quiz", "grade", "answers/", "--key", "key.json"])
>>> args.answers, args.key, args.out
(['answers/'], 'key.json', 'quiz-results')
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ddtk.gradebook.canvas import add_canvas_options

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_KEY = Path("solutions/quiz/module-quiz.key.json")


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, width=None if sys.stdout.isatty() else 120)


def _error(message: str) -> int:
    from rich.markup import escape

    _console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return EXIT_USAGE


def _build(args: argparse.Namespace) -> int:
    from ddtk.quiz.build import build
    from ddtk.quiz.model import QuizSourceError

    try:
        res = build(args.source, args.out, args.key, check_code=not args.no_code_check)
    except QuizSourceError as exc:
        return _error(str(exc))
    console = _console()
    for label, path in (("public", res.public), ("self-check", res.selfcheck), ("key", res.key)):
        console.print(f"{label:>10}: {path}")
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    from ddtk.quiz.build import solution_problems
    from ddtk.quiz.model import QuizSourceError
    from ddtk.quiz.source import load_source

    try:
        quiz = load_source(args.source)
    except QuizSourceError as exc:
        return _error(str(exc))
    problems = [] if args.no_code_check else solution_problems(quiz)
    for p in problems:
        _console(stderr=True).print(f"{args.source}: {p}", soft_wrap=True, markup=False)
    if not problems:
        counts: dict[str, int] = {}
        for q in quiz.questions:
            counts[q.type] = counts.get(q.type, 0) + 1
        kinds = ", ".join(f"{n} {t}" for t, n in counts.items())
        _console().print(
            f"{args.source}: {len(quiz.questions)} questions ({kinds}), valid", markup=False
        )
    return EXIT_FAILED if problems else EXIT_OK


def _grade(args: argparse.Namespace) -> int:
    from ddtk.gradebook.canvas import RosterError, read_roster
    from ddtk.quiz.classgrade import grade_class, summary_table, write_results
    from ddtk.quiz.model import QuizSourceError
    from ddtk.quiz.source import load_key

    key = Path(args.key) if args.key else DEFAULT_KEY
    if not key.is_file():
        return _error(
            f"no key at {key}: pass --key PATH (the private key built by `ddtk quiz build`)"
        )
    try:
        quiz = load_key(key)
    except QuizSourceError as exc:
        return _error(f"the key is not valid: {exc}")
    out = Path(args.out)
    try:
        roster = read_roster(args.canvas_roster) if args.canvas_roster else None
        result = grade_class(quiz, args.answers, workers=args.workers, skip=[out, key])
    except (FileNotFoundError, RosterError) as exc:
        return _error(str(exc))
    if not result.results:
        return _error("no answers files (*.yaml, *.yml, *.json) found in " + " ".join(args.answers))
    write_results(result, out, roster=roster, canvas_column=args.canvas_column)
    console = _console()
    console.print(summary_table(result))
    console.print(
        f"results: {out}/<student>/results.json, {out}/grades.csv; for the LMS: "
        f"{out}/canvas.csv and {out}/<student>/gradescope.json; for each student: "
        f"{out}/<student>/feedback.html",
        markup=False,
    )
    if (out / "canvas-unmatched.txt").exists():
        console.print(f"not in the Canvas roster (left out of canvas.csv): "
                      f"{out}/canvas-unmatched.txt", markup=False)  # fmt: skip
    return result.exit_code


def _selfcheck(args: argparse.Namespace) -> int:
    import json

    from ddtk.quiz.answers import AnswersError, read_answers
    from ddtk.quiz.selfcheck import self_check

    try:
        answers = read_answers(args.answers)
        report = self_check(json.loads(Path(args.selfcheck).read_text(encoding="utf-8")), answers)
    except (AnswersError, ValueError, OSError, KeyError) as exc:
        return _error(str(exc))
    console = _console()
    for item in report.questions:
        console.print(f"{item.id:<32} {item.status}", markup=False)
    verdict = "pass" if report.passed else "not yet"
    console.print(
        f"self-check: {report.score}/{report.max_score} ({verdict}). {report.note}", markup=False
    )
    return EXIT_OK if report.passed else EXIT_FAILED


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``ddtk quiz`` and its commands."""
    quiz = subparsers.add_parser("quiz", help="build, check, self-check and grade quizzes")
    quiz.set_defaults(func=lambda _args: (quiz.print_help(), EXIT_USAGE)[1])
    sub = quiz.add_subparsers(dest="quiz_command", metavar="COMMAND")

    p = sub.add_parser("build", help="write the public quiz, the self-check file and the key")
    p.add_argument("source", help="quiz source YAML (with answers)")
    p.add_argument("--out", required=True, help="folder for the public and self-check files")
    p.add_argument("--key", required=True, help="where to write the private key (JSON)")
    p.add_argument("--no-code-check", action="store_true", help="skip running the code solutions")
    p.set_defaults(func=_build)

    p = sub.add_parser("check", help="validate a quiz source and run its code solutions")
    p.add_argument("source")
    p.add_argument("--no-code-check", action="store_true")
    p.set_defaults(func=_check)

    p = sub.add_parser("grade", help="grade answers files or folders with the private key")
    p.add_argument("answers", nargs="+", help="answers files and/or folders of them")
    p.add_argument("--key", help=f"private key JSON (default: {DEFAULT_KEY})")
    p.add_argument("--out", default="quiz-results", help="output folder (default: quiz-results)")
    p.add_argument("--workers", type=int, default=None, help="parallel code runs (default: CPUs)")
    add_canvas_options(p)
    p.set_defaults(func=_grade)

    p = sub.add_parser("selfcheck", help="check an answers file against the self-check file")
    p.add_argument("answers")
    p.add_argument("--selfcheck", required=True)
    p.set_defaults(func=_selfcheck)
    return quiz
