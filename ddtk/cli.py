"""The ``ddtk`` command line: ``ddtk doctor``, ``ddtk course ...``, ``ddtk bench ...``, ``ddtk profile ...``, ``ddtk quiz ...``, ``ddtk project check``.

Each command group lives next to the code it drives and contributes its own
sub-parser through an ``add_parser(subparsers)`` function, so this file only
wires them together. Heavy imports (torch, papermill, matplotlib) happen inside
the command handlers, which keeps ``ddtk --help`` fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ddtk import __version__


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every command group registered."""
    from ddtk import doctor
    from ddtk.bench import cli as bench_cli
    from ddtk.course import cli as course_cli
    from ddtk.profiling import cli as profile_cli
    from ddtk.project import cli as project_cli
    from ddtk.quiz import cli as quiz_cli

    parser = argparse.ArgumentParser(
        prog="ddtk",
        description="Distributed Training at Scale course kit.",
    )
    parser.add_argument("--version", action="version", version=f"ddtk {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    doctor.add_parser(sub)
    course_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    profile_cli.add_parser(sub)
    quiz_cli.add_parser(sub)
    project_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ddtk`` script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
