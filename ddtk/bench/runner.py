"""The common run of a sweep benchmark: check the arguments, print a header, measure, publish.

``ddtk bench dp``, ``tp``, ``pipeline``, ``zero`` and ``precision`` all do the same
around their own measurement: refuse bad arguments in one sentence (exit 2), print
a header with the environment, measure one point of the sweep at a time (a world
size, a stage count, a workload) under a status line, keep what was measured when
the user presses Ctrl-C, and then print the table and write the JSON and the PNG
(:func:`~ddtk.bench.report.publish`; exit 1 when nothing was measured). A
benchmark describes its own parts in a :class:`Sweep`; :func:`run_sweep` does the rest.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from ddtk.bench.collectives import environment
from ddtk.bench.report import publish

__all__ = ["Point", "Sweep", "run_sweep"]

Rows = list[dict]


@dataclass(frozen=True)
class Point:
    """One point of a sweep: the status line shown while it runs, and how to measure it."""

    status: str
    measure: Callable[[], Rows]


@dataclass(frozen=True)
class Sweep:
    """What one benchmark brings to :func:`run_sweep`.

    ``plan(args)`` checks the arguments and returns what the other parts need
    (ValueError with a one-sentence message for bad input); ``header(args, env,
    plan)`` is the text after ``ddtk bench NAME``; ``points(args, plan)`` yields the
    sweep's :class:`Point` s; ``after_point(rows)`` runs after each point and
    ``after_all(rows)`` once at the end (both may add columns); ``summary(rows)``
    gives lines printed after the table. ``width`` is the console width when the
    output is not a terminal (None: rich's default); ``environment(env, args,
    plan)`` may add to the environment recorded with the results.
    """

    name: str
    plan: Callable[[argparse.Namespace], Any]
    header: Callable[[argparse.Namespace, dict, Any], str]
    points: Callable[[argparse.Namespace, Any], Iterable[Point]]
    table: Callable[[Rows], Any]
    plot: Callable[[Rows, str], None]
    width: int | None = None
    environment: Callable[[dict, argparse.Namespace, Any], None] | None = None
    after_point: Callable[[Rows], Any] | None = None
    after_all: Callable[[Rows], Any] | None = None
    summary: Callable[[Rows], Iterable[str]] | None = None


def run_sweep(sweep: Sweep, args: argparse.Namespace) -> int:
    """Run ``sweep`` with the parsed ``args``; 0 when published, 1 if nothing was measured, 2 on bad input."""
    console = Console(width=None if Console().is_terminal else sweep.width)
    try:
        plan = sweep.plan(args)
    except ValueError as exc:
        console.print(f"ddtk bench {sweep.name}: {exc}")
        return 2
    env = environment()
    if sweep.environment is not None:
        sweep.environment(env, args, plan)
    console.print(f"[bold]ddtk bench {sweep.name}[/bold]  {sweep.header(args, env, plan)}")
    rows = measure_points(console, sweep, sweep.points(args, plan))
    if sweep.after_all is not None:
        sweep.after_all(rows)
    code = publish(console, rows, env, args, sweep.table, sweep.plot)
    if code == 0 and sweep.summary is not None:
        for line in sweep.summary(rows):
            console.print(line)
    return code


def measure_points(console: Console, sweep: Sweep, points: Iterable[Point]) -> Rows:
    """The rows of every point, in order; Ctrl-C stops the sweep and keeps what was measured."""
    rows: Rows = []
    try:
        for point in points:
            with console.status(point.status):
                rows += point.measure()
            if sweep.after_point is not None:
                sweep.after_point(rows)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: keeping the results measured so far[/yellow]")
    return rows
