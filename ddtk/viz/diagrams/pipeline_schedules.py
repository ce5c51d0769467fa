"""Pipeline schedules side by side: GPipe, 1F1B and interleaved 1F1B, with their bubbles.

GPipe and 1F1B come from :mod:`ddtk.parallel.pipeline_schedules` itself
(:func:`~ddtk.parallel.pipeline_schedules.simulate`), so the picture is the
schedule that ddtk's pipeline runs. ddtk's pipeline has no interleaved schedule;
:func:`interleaved_order` writes down the one of Megatron-LM (Narayanan et al.,
SC 2021, section 2.2.2): each rank holds ``v`` model chunks (virtual stages
``c * p + s``), runs ``(p - s - 1) * 2 + (v - 1) * p`` warm-up forwards, then
alternates, and :func:`simulate_interleaved` times it with the same dependency
rule as ddtk's simulator. Its bubble is ``(p - 1) / (v * m + p - 1)``, ``v``
times smaller in time than 1F1B's, paid for with ``v`` times more point-to-point
messages.

>>> tl, _ = simulate_interleaved(num_stages=4, num_microbatches=8, chunks=2)
>>> round(bubble_fraction(tl), 4) == round(interleaved_bubble(4, 8, 2), 4)
True
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ddtk.parallel.pipeline_schedules import (
    Timeline,
    bubble_fraction,
    simulate,
    theoretical_bubble,
)

__all__ = [
    "draw_pipeline_schedules",
    "interleaved_bubble",
    "interleaved_order",
    "simulate_interleaved",
]

_F, _B = ("#4c72b0", "#9fb7dc"), ("#dd8452", "#f0c1a0")  # chunk 0, chunk 1 (lighter)


def interleaved_order(
    stage: int, num_stages: int, num_microbatches: int, chunks: int
) -> list[tuple[str, int, int]]:
    """Megatron-LM's interleaved 1F1B order for one rank: ``(kind, chunk, micro)`` tuples."""
    p, m, v = num_stages, num_microbatches, chunks
    if m % p:
        raise ValueError(
            f"the interleaved schedule needs num_microbatches divisible by num_stages, got {m} and {p}"
        )
    total = m * v

    def micro(k: int) -> int:
        return (k // (p * v)) * p + k % p

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    order = [("F", chunk(k, True), micro(k)) for k in range(warmup)]
    for i in range(total - warmup):
        k = warmup + i
        order += [("F", chunk(k, True), micro(k)), ("B", chunk(i, False), micro(i))]
    order += [("B", chunk(i, False), micro(i)) for i in range(total - warmup, total)]
    return order


def simulate_interleaved(
    num_stages: int = 4,
    num_microbatches: int = 8,
    chunks: int = 2,
    forward_time: float = 1.0,
    backward_time: float = 2.0,
) -> tuple[list[Timeline], list[list[int]]]:
    """Timelines of the interleaved schedule (a chunk's F takes ``forward_time / chunks``), and each event's chunk.

    ``F`` of virtual stage ``V`` waits for ``F`` of ``V - 1`` (on rank ``(V - 1) mod p``),
    ``B`` of ``V`` for ``B`` of ``V + 1``: the rule of :func:`ddtk.parallel.pipeline_schedules.simulate`.
    """
    p, v = num_stages, chunks
    orders = [interleaved_order(s, p, num_microbatches, v) for s in range(p)]
    done: dict[tuple[int, str, int], float] = {}  # (virtual stage, kind, micro) -> end time
    clock, nxt = [0.0] * p, [0] * p
    timelines, chunk_of = [Timeline(rank=s) for s in range(p)], [[] for _ in range(p)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            if nxt[s] == len(orders[s]):
                continue
            kind, c, i = orders[s][nxt[s]]
            vs = c * p + s
            dep = (vs - 1, "F", i) if kind == "F" else (vs + 1, "B", i)
            first = (kind == "F" and vs == 0) or (kind == "B" and vs == p * v - 1)
            if not first and dep not in done:
                continue
            start = max(clock[s], 0.0 if first else done[dep])
            end = start + (forward_time if kind == "F" else backward_time) / v
            timelines[s].record(kind, i, start, end)
            chunk_of[s].append(c)
            done[(vs, kind, i)] = clock[s] = end
            nxt[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:  # pragma: no cover - Megatron's order never deadlocks
            raise RuntimeError("interleaved schedule deadlocks")
    return timelines, chunk_of


def interleaved_bubble(num_stages: int, num_microbatches: int, chunks: int) -> float:
    """``(p - 1) / (v m + p - 1)``: the idle share of the interleaved schedule with uniform times."""
    return (num_stages - 1) / (chunks * num_microbatches + num_stages - 1)


def _draw(ax, timelines: list[Timeline], chunk_of: list[list[int]] | None, title: str) -> None:
    for row, tl in enumerate(timelines):
        for j, e in enumerate(tl.events):
            c = chunk_of[row][j] if chunk_of else 0
            colour = (_F if e.kind == "F" else _B)[min(c, 1)]
            ax.barh(
                row,
                e.duration,
                left=e.start,
                height=0.8,
                color=colour,
                edgecolor="black",
                linewidth=0.4,
            )
            ax.text(
                e.start + e.duration / 2, row, str(e.micro), ha="center", va="center", fontsize=6
            )
    ax.set_yticks(range(len(timelines)), [f"stage {t.rank}" for t in timelines])
    ax.set_ylim(len(timelines) - 0.5, -0.5)
    ax.set_xlabel("time (forward-pass units)")
    ax.set_title(title, fontsize=9, loc="left")


def draw_pipeline_schedules(
    num_stages: int = 4, num_microbatches: int = 8, chunks: int = 2, backward_time: float = 2.0
) -> Figure:
    """GPipe, 1F1B and interleaved 1F1B on one time axis, each titled with its bubble (simulated and formula)."""
    import matplotlib.pyplot as plt

    p, m, v = num_stages, num_microbatches, chunks
    fig, axes = plt.subplots(3, 1, figsize=(11, 1.1 * 3 * p / 2 + 2.4), sharex=True)
    for ax, name in zip(axes[:2], ("gpipe", "1f1b")):
        tl = simulate(name, p, m, 1.0, backward_time)
        peak = max(t.peak_in_flight for t in tl)
        label = "GPipe" if name == "gpipe" else "1F1B"
        _draw(ax, tl, None, f"{label}: bubble {bubble_fraction(tl):.0%} (formula (p-1)/(m+p-1) = "
              f"{theoretical_bubble(p, m):.0%}); stage 0 holds up to {peak} micro-batches of activations")  # fmt: skip
    tl, chunk_of = simulate_interleaved(p, m, v, 1.0, backward_time)
    peak_units = max(t.peak_in_flight for t in tl) / v
    _draw(axes[2], tl, chunk_of, f"interleaved 1F1B, {v} chunks per stage: bubble {bubble_fraction(tl):.0%} "
          f"(formula (p-1)/(vm+p-1) = {interleaved_bubble(p, m, v):.0%}); stage 0 holds up to "
          f"{peak_units:g} micro-batches' worth")  # fmt: skip
    handles = [Patch(color=_F[0], label="forward"), Patch(color=_B[0], label="backward"),
               Patch(color=_F[1], label="forward, chunk 2"), Patch(color=_B[1], label="backward, chunk 2")]  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"Pipeline schedules, p={p} stages, m={m} micro-batches, backward = {backward_time:g} x forward "
                 "(simulated with ddtk.parallel.pipeline_schedules)")  # fmt: skip
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig
