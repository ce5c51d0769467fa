"""Small plotting helpers shared by the lecture notebooks.

They take the plain ``list[dict]`` rows written by :func:`ddtk.bench.collectives.sweep`
(keys ``algorithm``, ``nbytes``, ``time_median_s``, ``time_p10_s``, ``time_p90_s``,
``busbw_gbps``, ...) so a notebook can plot a benchmark it just ran, or one loaded from
JSON, without reshaping it. Every function draws on an axis it is given and returns
nothing, so notebooks stay in control of layout.

The Amdahl helpers live here because the scaling plots are their only users; they are
pure arithmetic and have no Matplotlib dependency.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from matplotlib.axes import Axes

from ddtk.sizes import format_bytes

__all__ = [
    "algorithms_in", "amdahl_speedup", "fit_serial_fraction", "format_bytes", "plot_busbw",
    "plot_scaling", "plot_stacked_times", "plot_time_vs_size", "series",
]  # fmt: skip

Row = dict[str, Any]

_MARKERS = "osD^v<>p*h"


def series(rows: Iterable[Row], algorithm: str) -> list[Row]:
    """Rows for one algorithm, sorted by message size."""
    return sorted((r for r in rows if r["algorithm"] == algorithm), key=lambda r: r["nbytes"])


def algorithms_in(rows: Iterable[Row]) -> list[str]:
    """Algorithm names in first-seen order (so colours stay stable across plots)."""
    seen: dict[str, None] = {}
    for r in rows:
        seen.setdefault(r["algorithm"], None)
    return list(seen)


def _size_axis(ax: Axes) -> None:
    """Log2 x axis in bytes with readable tick labels."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(lambda x, _pos: format_bytes(x))
    ax.set_xlabel("message size per rank")
    ax.grid(True, which="major", alpha=0.3)


def plot_time_vs_size(
    ax: Axes,
    rows: Sequence[Row],
    algorithms: Sequence[str] | None = None,
    models: dict[str, Callable[[float], float]] | None = None,
) -> None:
    """Median time per call vs size, with a p10–p90 band; dashed lines for ``models``.

    ``models`` maps an algorithm name to a function ``nbytes -> seconds`` (for example
    a fitted alpha-beta prediction), drawn in the same colour as the measurement.
    """
    for i, algo in enumerate(algorithms or algorithms_in(rows)):
        pts = series(rows, algo)
        if not pts:
            continue
        x = [p["nbytes"] for p in pts]
        (line,) = ax.plot(
            x, [p["time_median_s"] * 1e3 for p in pts], marker=_MARKERS[i % 10], label=algo
        )
        ax.fill_between(
            x, [p["time_p10_s"] * 1e3 for p in pts], [p["time_p90_s"] * 1e3 for p in pts],
            color=line.get_color(), alpha=0.1, linewidth=0,
        )  # fmt: skip
        if models and algo in models:
            ax.plot(
                x, [models[algo](b) * 1e3 for b in x], linestyle="--", color=line.get_color(),
                label=f"{algo} (α-β model)",
            )  # fmt: skip
    _size_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel("time per call (ms, median)")
    ax.legend(fontsize=8)


def plot_busbw(
    ax: Axes,
    rows: Sequence[Row],
    algorithms: Sequence[str] | None = None,
    models: dict[str, Callable[[float], float]] | None = None,
) -> None:
    """Bus bandwidth (GB/s) vs size; ``models`` give predicted busbw as dashed lines."""
    for i, algo in enumerate(algorithms or algorithms_in(rows)):
        pts = series(rows, algo)
        if not pts:
            continue
        x = [p["nbytes"] for p in pts]
        (line,) = ax.plot(x, [p["busbw_gbps"] for p in pts], marker=_MARKERS[i % 10], label=algo)
        if models and algo in models:
            ax.plot(
                x, [models[algo](b) for b in x], linestyle="--", color=line.get_color(),
                label=f"{algo} (α-β model)",
            )  # fmt: skip
    _size_axis(ax)
    ax.set_ylabel("busbw (GB/s)")
    ax.legend(fontsize=8)


def amdahl_speedup(n: float, serial_fraction: float) -> float:
    """Amdahl's law: speedup on ``n`` workers when ``serial_fraction`` of T1 cannot shrink."""
    return 1.0 / (serial_fraction + (1.0 - serial_fraction) / n)


def fit_serial_fraction(world_sizes: Sequence[int], speedups: Sequence[float]) -> float:
    """Least-squares serial fraction ``s`` from measured speedups.

    Amdahl gives ``1/S - 1/n = s (1 - 1/n)``, a line through the origin in
    ``x = 1 - 1/n``, so ``s = Σxy / Σx²``. Points with ``n == 1`` carry no information
    and are skipped. The result is clipped to [0, 1].
    """
    xs = [1.0 - 1.0 / n for n in world_sizes if n > 1]
    ys = [1.0 / s - 1.0 / n for n, s in zip(world_sizes, speedups) if n > 1]
    if not xs:
        raise ValueError("need at least one world size above 1 to fit a serial fraction")
    s = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return min(max(s, 0.0), 1.0)


def plot_scaling(
    ax: Axes,
    world_sizes: Sequence[int],
    speedups: Sequence[float],
    serial_fraction: float | None = None,
    label: str = "measured",
) -> None:
    """Speedup vs world size against the ideal line and, if given, the Amdahl curve."""
    top = max(world_sizes)
    grid = [1 + (top - 1) * k / 50 for k in range(51)]
    ax.plot(grid, grid, color="0.6", linestyle=":", label="ideal (linear)")
    ax.plot(world_sizes, speedups, marker="o", label=label)
    if serial_fraction is not None:
        ax.plot(
            grid, [amdahl_speedup(n, serial_fraction) for n in grid], linestyle="--",
            label=f"Amdahl fit, serial fraction {serial_fraction:.2f}",
        )  # fmt: skip
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("speedup over 1 rank")
    ax.set_xticks(list(world_sizes))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def plot_stacked_times(
    ax: Axes, labels: Sequence[str], parts: dict[str, Sequence[float]], unit: str = "ms"
) -> None:
    """Stacked bars, one per label, e.g. compute vs communication time per world size."""
    bottom = [0.0] * len(labels)
    for name, values in parts.items():
        ax.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel(f"time per step ({unit})")
    ax.legend(fontsize=8)
