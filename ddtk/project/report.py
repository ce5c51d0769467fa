"""A checked project as JSON data and as a rich table (the conventions of ``ddtk quiz grade``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddtk.project.check import ProjectResult

STYLES = {"pass": "green", "fail": "bold red", "error": "bold yellow", "manual": "cyan"}


def result_to_dict(result: ProjectResult) -> dict[str, Any]:
    """Per-criterion JSON: id, kind, points, earned, status, message, measured values."""
    return {
        "project": str(result.root),
        "name": result.name,
        "earned": result.earned,
        "automatic_points": result.rubric.automatic_points,
        "total_points": result.rubric.total_points,
        "passed": result.exit_code == 0,
        "seconds": round(result.seconds, 2),
        "criteria": [
            {
                "id": r.criterion.id,
                "kind": r.criterion.kind,
                "points": r.criterion.points,
                "earned": r.earned,
                "status": r.status,
                "message": r.message,
                "measured": r.measured,
            }
            for r in result.results
        ],
    }


def write_json(result: ProjectResult, path: str | Path) -> Path:
    """Write :func:`result_to_dict` atomically to ``path``."""
    from ddtk.quiz.files import write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(result_to_dict(result), indent=2, default=str) + "\n")
    return path


def summary_table(result: ProjectResult) -> Any:
    """One row per criterion, automatic first as in the rubric, then the total and time."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        title=f"final project: {result.name or result.root.name}",
        caption=(
            f"automatic {result.earned}/{result.rubric.automatic_points} points; "
            f"{result.rubric.total_points - result.rubric.automatic_points} more graded by hand; "
            f"{result.seconds:.1f} s"
        ),
    )
    for name, justify in (
        ("criterion", "left"),
        ("kind", "left"),
        ("points", "right"),
        ("result", "left"),
        ("message", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in result.results:
        pts = (
            f"{r.earned}/{r.criterion.points}"
            if r.earned is not None
            else f"-/{r.criterion.points}"
        )
        table.add_row(
            escape(r.criterion.id),
            r.criterion.kind,
            pts,
            f"[{STYLES[r.status]}]{r.status}[/]",
            escape(r.message),
        )
    return table
