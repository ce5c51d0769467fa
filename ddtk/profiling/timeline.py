"""One picture of a distributed step: ranks as rows, on one clock.

Each rank gets a row of the exclusive breakdown (what the training thread was doing:
compute, data, optimizer, waiting for communication, idle) and, just under it, a
thin row with every interval a collective was in flight. Where the thin row runs
under compute, communication was hidden; where it runs under the waiting colour, it
was exposed. Ranks are merged on the clock the traces share (see
:mod:`ddtk.profiling.trace`), so a straggler shows as a rank whose compute ends late
while the others wait.
"""

from __future__ import annotations

from typing import Any

from ddtk.profiling.breakdown import lanes, step_parts
from ddtk.profiling.trace import RankTrace

__all__ = ["COLOURS", "plot_timeline"]

COLOURS = {
    "compute": "#4C72B0",
    "communication": "#DD8452",
    "data": "#55A868",
    "optimizer": "#8172B3",
    "idle": "#DDDDDD",
}


def plot_timeline(
    traces: list[RankTrace], steps: int | None = None, ax: Any = None, title: str | None = None
) -> Any:
    """Draw the ranks' steps on one clock; returns the matplotlib Axes.

    Args:
        traces: one trace per rank (:func:`ddtk.profiling.load_traces`).
        steps: how many profiled steps to show (default: all).
        ax: an Axes to draw into; a new figure otherwise.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not traces:
        raise ValueError("plot_timeline needs at least one trace")
    n = min(len(t.steps) for t in traces) if steps is None else steps
    lo = min(t.steps[0].ts for t in traces)
    hi = max(t.steps[min(n, len(t.steps)) - 1].end for t in traces)
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.9 + 0.75 * len(traces)))
    for row, trace in enumerate(traces):
        y = len(traces) - 1 - row
        first, last = trace.steps[0].ts, trace.steps[min(n, len(trace.steps)) - 1].end
        ax.broken_barh(
            [((first - lo) / 1e3, (last - first) / 1e3)], (y + 0.25, 0.6), color=COLOURS["idle"]
        )
        parts, comm = step_parts(lanes(trace), first, last)
        for kind, spans in parts.items():
            ax.broken_barh(
                [((a - lo) / 1e3, (b - a) / 1e3) for a, b in spans],
                (y + 0.25, 0.6),
                color=COLOURS[kind],
            )
        ax.broken_barh(
            [((a - lo) / 1e3, (b - a) / 1e3) for a, b in comm],
            (y + 0.05, 0.15),
            color=COLOURS["communication"],
        )
        for s in trace.steps[:n]:
            ax.axvline((s.ts - lo) / 1e3, ymin=0, ymax=1, color="black", lw=0.3, alpha=0.3)
    ax.set_yticks([len(traces) - 1 - i + 0.5 for i in range(len(traces))])
    ax.set_yticklabels([f"rank {t.rank}" for t in traces])
    ax.set_xlim(0, (hi - lo) / 1e3)
    ax.set_xlabel("ms (one clock for every rank; thin bar: a collective in flight)")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], ncol=5, loc="upper center",
              bbox_to_anchor=(0.5, -0.35 if len(traces) < 3 else -0.2), frameon=False)  # fmt: skip
    ax.set_title(title or f"{len(traces)} rank(s), {n} profiled step(s)")
    return ax
