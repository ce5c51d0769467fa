"""One call from a folder of traces to the answer: breakdown, stragglers, top operators, diagnosis.

>>> # analysis = analyse("build/profile/slow")      # one rank<r>.json per rank
>>> # print(analysis.text())                         # the table and the diagnosis
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtk.profiling.breakdown import Breakdown, breakdown
from ddtk.profiling.diagnose import Finding, diagnose, explain
from ddtk.profiling.operators import OperatorTime, top_operators
from ddtk.profiling.trace import RankTrace, load_traces

__all__ = ["Analysis", "analyse"]

_COLUMNS = ("step", "compute", "communication", "data", "optimizer", "idle")


@dataclass
class Analysis:
    """Everything :func:`analyse` found in one profiled run."""

    traces: list[RankTrace]
    breakdown: Breakdown
    findings: list[Finding]
    top: dict[int, list[OperatorTime]]

    @property
    def bottleneck(self) -> Finding | None:
        """The finding with the largest share of the step, or None."""
        return self.findings[0] if self.findings else None

    def table(self) -> Any:
        """A rich Table: one row per rank, mean ms per step and shares."""
        from rich.table import Table

        t = Table(title=f"step-time breakdown, {len(self.traces)} rank(s), ms per step (share)")
        t.add_column("rank", justify="right")
        for c in _COLUMNS:
            t.add_column(c, justify="right")
        t.add_column("comm hidden", justify="right")
        t.add_column("collectives", justify="right")
        for row in self.breakdown.per_rank():
            r, step = row["rank"], row["step_ms"]
            cells = [f"{step:.1f}"] + [
                f"{row[f'{c}_ms']:.1f} ({row[f'{c}_ms'] / step:.0%})" if step else "0"
                for c in _COLUMNS[1:]
            ]
            t.add_row(str(r), *cells, f"{row['overlap']:.0%}", f"{row['collectives']:.0f}")
        return t

    def top_table(self, rank: int = 0, n: int = 8) -> Any:
        from rich.table import Table

        t = Table(title=f"top operators by self time, rank {rank}")
        for c in ("operator", "category", "calls/step", "ms/step", "share"):
            t.add_column(c, justify="left" if c == "operator" else "right")
        for op in self.top.get(rank, [])[:n]:
            t.add_row(
                op.name[:60],
                op.category,
                f"{op.calls_per_step:.1f}",
                f"{op.self_ms_per_step:.2f}",
                f"{op.share:.0%}",
            )
        return t

    def text(self) -> str:
        """The tables and the diagnosis as plain text (what ``ddtk profile`` prints)."""
        from rich.console import Console

        console = Console(width=140, record=True, file=io.StringIO(), force_jupyter=False)
        console.print(self.table())
        console.print(self.top_table())
        spread = self.breakdown.spread()
        console.print(
            f"step-time spread across ranks: mean {spread['mean_ms']:.1f} ms, max {spread['max_ms']:.1f} ms"
        )
        console.print("diagnosis:\n" + explain(self.findings))
        return console.export_text()

    def as_dict(self) -> dict:
        """JSON-ready: per-rank and per-step rows, findings, top operators."""
        return {
            "world_size": self.breakdown.world_size,
            "per_rank": self.breakdown.per_rank(),
            "steps": self.breakdown.to_dicts(),
            "spread": self.breakdown.spread(),
            "findings": [
                {"kind": f.kind, "share": f.share, "ranks": list(f.ranks), "message": f.message}
                for f in self.findings
            ],
            "top_operators": {str(r): [op.__dict__ for op in ops] for r, ops in self.top.items()},
        }


def analyse(trace_dir: str | Path, skip_first: int = 0, top: int = 10) -> Analysis:
    """Load every rank's trace in ``trace_dir``, break the steps down and diagnose them."""
    traces = load_traces(trace_dir)
    bd = breakdown(traces, skip_first=skip_first)
    return Analysis(traces, bd, diagnose(bd), {t.rank: top_operators(t, top) for t in traces})
