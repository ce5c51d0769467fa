"""``ddtk project check DIR``: score a final-project submission against the rubric.

Exit codes (as ``ddtk quiz grade``): 0 when every automatic criterion passes, 1
when one fails or cannot be evaluated, 2 for usage errors (no such folder, a bad
``--timeout``, an unreadable rubric).

    ddtk project check solutions/project
    ddtk project check my-project --json results.json --timeout 120

>>> parser = argparse.ArgumentParser(prog="ddtk")
>>> _ = add_parser(parser.add_subparsers())
>>> args = parser.parse_args(["project", "check", "mine", "--timeout", "30"])
>>> args.dir, args.timeout, args.json
('mine', 30.0, None)
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, width=None if sys.stdout.isatty() else 140)


def _error(message: str) -> int:
    from rich.markup import escape

    _console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return EXIT_USAGE


def _check(args: argparse.Namespace) -> int:
    from ddtk.course.grading.jail import confinement
    from ddtk.project.check import check_project
    from ddtk.project.report import summary_table, write_json
    from ddtk.project.rubric import RubricError, load_rubric

    root = Path(args.dir)
    if not root.is_dir():
        return _error(f"no such project folder: {root}")
    if args.timeout is not None and (not math.isfinite(args.timeout) or args.timeout <= 0):
        return _error(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    try:
        rubric = load_rubric(args.rubric)
    except RubricError as exc:
        return _error(str(exc))
    console = _console()
    console.print(confinement().summary(), markup=False)  # what protects this machine's runs
    result = check_project(root, rubric, args.timeout)
    console.print(summary_table(result))
    if args.json:
        try:
            path = write_json(result, args.json)
        except OSError as exc:
            return _error(f"cannot write {args.json}: {exc.strerror or exc}")
        console.print(f"results: {path}", markup=False)
    return result.exit_code


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``ddtk project`` and its ``check`` command."""
    project = subparsers.add_parser("project", help="check a final-project submission")
    project.set_defaults(func=lambda _args: (project.print_help(), EXIT_USAGE)[1])
    sub = project.add_subparsers(dest="project_command", metavar="COMMAND")
    p = sub.add_parser(
        "check", help="score the automatic criteria of the rubric, list the manual ones"
    )
    p.add_argument("dir", help="the submission folder (with project.yaml)")
    p.add_argument("--json", help="also write the per-criterion results to this JSON file")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per run (default: project.yaml's check.timeout_s)",
    )
    p.add_argument("--rubric", default=None, help="rubric YAML (default: project/rubric.yaml)")
    p.set_defaults(func=_check)
    return project
