"""Step-by-step pictures of ring all-reduce, drawn from the implementation's own schedule.

The ring all-reduce in :mod:`ddtk.comm.ring` splits each rank's tensor into ``n`` chunks
and runs ``2(n-1)`` steps: ``n-1`` reduce-scatter steps, where each rank adds the chunk
it receives to its own copy, then ``n-1`` all-gather steps, where it overwrites its copy
with the fully reduced chunk it receives. :func:`ring_states` replays
:func:`ddtk.comm.ring.ring_schedule` symbolically, tracking *which ranks' contributions*
each chunk on each rank contains, so the picture shows exactly what the code does.

Three entry points:

- :func:`draw_ring_step` draws one step on a Matplotlib axis;
- :func:`ring_steps_figure` draws every step as small multiples (works headless);
- :func:`ring_stepper` returns an ipywidgets slider/Play stepper, or the static figure
  when ipywidgets is not installed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

# state[rank][chunk] = the set of ranks whose contribution that chunk currently includes.
RingState = list[list[frozenset[int]]]

_PARTIAL_COLOR = "#4c72b0"
_FULL_COLOR = "#2ca02c"
_SEND_COLOR = "#d62728"
_PHASE_LABEL = {"reduce_scatter": "reduce-scatter", "all_gather": "all-gather"}


def load_schedule(world_size: int) -> list[list[Any]]:
    """Return ``ddtk.comm.ring.ring_schedule(world_size)``, imported lazily.

    The import is deferred so that this module (and its static figures) can be imported
    by tools that do not need the communication package loaded.
    """
    from ddtk.comm.ring import ring_schedule

    return ring_schedule(world_size)


def initial_state(world_size: int) -> RingState:
    """Before any step, every chunk on rank ``r`` holds only rank ``r``'s contribution."""
    return [[frozenset({r}) for _ in range(world_size)] for r in range(world_size)]


def apply_step(state: RingState, step: Sequence[Any], world_size: int) -> RingState:
    """Apply one schedule step to ``state`` and return the new state.

    All sends in a step happen simultaneously, so the receiver combines what the sender
    held *before* the step: a union (add) in reduce-scatter, a copy (overwrite) in
    all-gather. Raises ``ValueError`` if a rank's ``recv_chunk`` is not the chunk its
    left neighbour sends, which would mean the schedule is inconsistent.
    """
    new = [list(row) for row in state]
    by_rank = {s.rank: s for s in step}
    for s in step:
        src = (s.rank - 1) % world_size
        sent = by_rank[src].send_chunk
        if sent != s.recv_chunk:
            raise ValueError(
                f"step {s.step}: rank {s.rank} expects chunk {s.recv_chunk} "
                f"but rank {src} sends chunk {sent}"
            )
        incoming = state[src][sent]
        if s.phase == "reduce_scatter":
            new[s.rank][s.recv_chunk] = state[s.rank][s.recv_chunk] | incoming
        else:
            new[s.rank][s.recv_chunk] = incoming
    return new


def ring_states(schedule: Sequence[Sequence[Any]], world_size: int) -> list[RingState]:
    """Replay ``schedule``: element ``k`` is the state *before* step ``k``.

    The list has ``len(schedule) + 1`` entries; the last is the final state, in which
    every rank should hold every chunk with all ``world_size`` contributions.
    """
    states = [initial_state(world_size)]
    for step in schedule:
        states.append(apply_step(states[-1], step, world_size))
    return states


def _rank_xy(rank: float, world_size: int, radius: float = 1.0) -> tuple[float, float]:
    """Place rank 0 at the top and the others clockwise, as the ring sends."""
    angle = math.pi / 2 - 2 * math.pi * rank / world_size
    return radius * math.cos(angle), radius * math.sin(angle)


def _chunk_color(count: int, world_size: int) -> tuple[float, float, float, float]:
    """Green when fully reduced, otherwise blue whose opacity grows with contributions."""
    if count == world_size:
        return to_rgba(_FULL_COLOR, 0.9)
    return to_rgba(_PARTIAL_COLOR, 0.15 + 0.6 * (count - 1) / max(world_size - 1, 1))


def _draw_rank(
    ax: Axes, rank: int, row: list[frozenset[int]], world_size: int, send_chunk: int | None
) -> None:
    """Draw rank ``rank`` as a row of chunk squares; the chunk being sent gets a red edge."""
    x0, y0 = _rank_xy(rank, world_size)
    size = min(0.2, 0.95 / world_size)
    left = x0 - size * world_size / 2
    for c, contrib in enumerate(row):
        sending = c == send_chunk
        ax.add_patch(
            Rectangle(
                (left + c * size, y0 - size / 2),
                size,
                size,
                facecolor=_chunk_color(len(contrib), world_size),
                edgecolor=_SEND_COLOR if sending else "0.3",
                linewidth=2.2 if sending else 0.6,
                zorder=3,
            )
        )
        ax.text(
            left + (c + 0.5) * size, y0, str(len(contrib)), ha="center", va="center",
            fontsize=7, zorder=4,
        )  # fmt: skip
        ax.text(
            left + (c + 0.5) * size, y0 - size / 2 - 0.015, f"c{c}", ha="center", va="top",
            fontsize=5.5, color="0.45",
        )  # fmt: skip
    ax.text(x0, y0 + 0.75 * size + 0.02, f"rank {rank}", ha="center", va="bottom", fontsize=8)


def _draw_send(ax: Axes, rank: int, world_size: int, chunk: int) -> None:
    """Arrow from ``rank`` to its right neighbour, labelled with the chunk it carries."""
    (x0, y0), (x1, y1) = _rank_xy(rank, world_size, 0.78), _rank_xy((rank + 1) % world_size, world_size, 0.78)  # fmt: skip
    ax.add_patch(
        FancyArrowPatch(
            (x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=10, color=_SEND_COLOR,
            connectionstyle="arc3,rad=-0.25", shrinkA=14, shrinkB=14, linewidth=1.2, zorder=2,
        )
    )  # fmt: skip
    mx, my = _rank_xy(rank + 0.5, world_size, 0.5 if world_size > 2 else 0.3)
    if world_size == 2:
        mx += 0.18 if rank == 0 else -0.18
    ax.text(mx, my, f"c{chunk}", color=_SEND_COLOR, fontsize=7, ha="center", va="center")


def draw_ring_step(ax: Axes, schedule: Sequence[Sequence[Any]], step: int, world_size: int) -> None:
    """Draw the state before ``step`` and the sends made in it.

    ``step`` runs from 0 to ``len(schedule)``; ``step == len(schedule)`` draws the final
    state with no arrows. Each rank is a row of ``world_size`` squares (chunks 0..n-1);
    the number in a square counts the ranks whose contribution it already includes.
    """
    if not 0 <= step <= len(schedule):
        raise ValueError(f"step must be in [0, {len(schedule)}], got {step}")
    state = ring_states(schedule[:step], world_size)[-1]
    sends = {s.rank: s.send_chunk for s in schedule[step]} if step < len(schedule) else {}
    for r in range(world_size):
        _draw_rank(ax, r, state[r], world_size, sends.get(r))
        if r in sends:
            _draw_send(ax, r, world_size, sends[r])
    if step < len(schedule):
        phase = schedule[step][0].phase
        title = f"step {step + 1}/{len(schedule)}: {_PHASE_LABEL.get(phase, phase)}"
    else:
        title = "done: every chunk reduced everywhere"
    ax.set_title(title, fontsize=9)
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.45, 1.4)
    ax.set_aspect("equal")
    ax.axis("off")


def ring_steps_figure(world_size: int, schedule: Sequence[Sequence[Any]] | None = None) -> Figure:
    """Small multiples: one panel per step plus the final state (``2(n-1)+1`` axes)."""
    schedule = load_schedule(world_size) if schedule is None else schedule
    panels = len(schedule) + 1
    cols = min(panels, 4)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.1 * cols, 3.0 * rows), squeeze=False)
    flat = axes.ravel()
    for k in range(panels):
        draw_ring_step(flat[k], schedule, k, world_size)
    for ax in flat[panels:]:
        fig.delaxes(ax)
    fig.suptitle(
        f"Ring all-reduce, {world_size} ranks: number = contributions in the chunk "
        "(green = complete), red = chunk sent this step",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def describe_step(schedule: Sequence[Sequence[Any]], step: int, world_size: int) -> str:
    """One line per rank saying what it sends and what it does with what it receives."""
    if step >= len(schedule):
        return "Finished: every rank holds the full sum of every chunk."
    lines = []
    for s in schedule[step]:
        verb = "adds it to" if s.phase == "reduce_scatter" else "overwrites"
        lines.append(
            f"rank {s.rank}: sends chunk {s.send_chunk} to rank {(s.rank + 1) % world_size}, "
            f"receives chunk {s.recv_chunk} from rank {(s.rank - 1) % world_size} and {verb} its copy"
        )
    return "\n".join(lines)


def ring_stepper(world_size: int = 4) -> Any:
    """Interactive stepper (Play button + slider + picture + per-rank text).

    Returns an ``ipywidgets.VBox``; when ipywidgets is not importable it returns the
    static :func:`ring_steps_figure` instead, so callers always get something to show.
    """
    schedule = load_schedule(world_size)
    try:
        import ipywidgets as widgets
        from IPython.display import display
    except ImportError:
        return ring_steps_figure(world_size, schedule)

    last = len(schedule)
    play = widgets.Play(value=0, min=0, max=last, step=1, interval=1200, description="play")
    slider = widgets.IntSlider(value=0, min=0, max=last, description="step")
    widgets.jslink((play, "value"), (slider, "value"))
    out = widgets.Output()

    def render(change: dict[str, Any] | None = None) -> None:
        step = slider.value
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(4.2, 4.0))
            draw_ring_step(ax, schedule, step, world_size)
            display(fig)
            plt.close(fig)
            print(describe_step(schedule, step, world_size))

    slider.observe(render, names="value")
    render()
    return widgets.VBox([widgets.HBox([play, slider]), out])
