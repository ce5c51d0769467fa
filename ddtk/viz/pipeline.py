"""The pipeline diagram: ranks as rows, time to the right, a block per forward and backward.

Forward blocks (F) and backward blocks (B) are coloured and labelled with their
micro-batch number; white space is idle time, the *bubble*.
:func:`plot_timeline` draws timelines measured by
:class:`~ddtk.parallel.pipeline.PipelineParallel`; :func:`plot_schedule` draws
the schedule's textbook picture from its order alone, with fixed unit times, so
the shape shows without machine noise. :func:`plot_in_flight` shows how many
micro-batches of activations each stage holds over time (memory).

>>> import matplotlib
>>> matplotlib.use("Agg")
>>> ax = plot_schedule("1f1b", num_stages=3, num_microbatches=4)
>>> [t.get_text() for t in ax.texts][:8]  # rank 0, in order: F0 F1 F2 B0 F3 B1 B2 B3
['0', '1', '2', '0', '3', '1', '2', '3']
>>> ax.get_title()
'1f1b, p=3, m=4 (unit times): bubble 33% (theory 33%)'
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.patches import Patch

from ddtk.parallel.pipeline_schedules import (
    Timeline,
    bubble_fraction,
    simulate,
    theoretical_bubble,
)

__all__ = ["COLORS", "plot_in_flight", "plot_schedule", "plot_timeline"]

COLORS = {"F": "#4c72b0", "B": "#dd8452"}


def _axis(ax: Axes | None, width: float, rows: int) -> Axes:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(width, 0.6 * rows + 1.2))
    return ax


def plot_timeline(
    timelines: Sequence[Timeline],
    ax: Axes | None = None,
    title: str | None = None,
    scale: float = 1e3,
    unit: str = "ms",
) -> Axes:
    """Draw one row per rank (rank 0 on top) with a block per event; return the axis.

    Times are multiplied by ``scale`` and labelled ``unit`` (milliseconds by default).
    The default title gives the measured :func:`bubble_fraction`.
    """
    if not timelines:
        raise ValueError("plot_timeline needs at least one timeline")
    ax = _axis(ax, 10, len(timelines))
    span = max((e.end for t in timelines for e in t.events), default=0.0) * scale
    for row, tl in enumerate(timelines):
        for e in tl.events:
            left, width = e.start * scale, e.duration * scale
            ax.barh(row, width, left=left, height=0.8, color=COLORS[e.kind], edgecolor="black",
                    linewidth=0.5)  # fmt: skip
            if width > 0.012 * span:
                ax.text(left + width / 2, row, str(e.micro), ha="center", va="center",
                        color="white", fontsize=8, fontweight="bold")  # fmt: skip
    ax.set_yticks(range(len(timelines)), [f"rank {t.rank}" for t in timelines])
    ax.set_ylim(len(timelines) - 0.5, -0.5)
    ax.set_xlim(0, span * 1.01 if span > 0 else 1)
    ax.set_xlabel(f"time ({unit})" if unit else "time")
    ax.set_facecolor("white")
    ax.legend(handles=[Patch(color=COLORS["F"], label="forward"),
                       Patch(color=COLORS["B"], label="backward")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)  # fmt: skip
    if title is None:
        title = f"bubble {bubble_fraction(timelines):.0%}"
    ax.set_title(title)
    return ax


def plot_schedule(
    schedule: str,
    num_stages: int,
    num_microbatches: int,
    ax: Axes | None = None,
    backward_time: float = 1.0,
) -> Axes:
    """The textbook diagram of a schedule: :func:`~ddtk.parallel.pipeline_schedules.simulate` with unit forward times."""
    timelines = simulate(schedule, num_stages, num_microbatches, 1.0, backward_time)
    bubble = bubble_fraction(timelines)
    theory = theoretical_bubble(num_stages, num_microbatches)
    title = (
        f"{schedule}, p={num_stages}, m={num_microbatches} (unit times): "
        f"bubble {bubble:.0%} (theory {theory:.0%})"
    )
    return plot_timeline(timelines, ax=ax, title=title, scale=1.0, unit="forward times")


def plot_in_flight(timelines: Sequence[Timeline], ax: Axes | None = None, scale: float = 1e3,
                   unit: str = "ms") -> Axes:  # fmt: skip
    """Micro-batches of activations held by each rank over time (a step line per rank)."""
    ax = _axis(ax, 6, 4)
    for tl in timelines:
        pts = [(0.0, 0), *tl.in_flight]
        ax.step([t * scale for t, _ in pts], [n for _, n in pts], where="post",
                label=f"rank {tl.rank} (peak {tl.peak_in_flight})")  # fmt: skip
    ax.set_xlabel(f"time ({unit})" if unit else "time")
    ax.set_ylabel("micro-batches held")
    ax.legend(fontsize=7)
    return ax
