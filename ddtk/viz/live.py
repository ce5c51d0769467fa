"""Live training curves in a notebook, fed by reports from the ranks.

>>> import ddtk
>>> from ddtk.viz.live import LivePlot
>>> live = LivePlot(["loss", "accuracy"])            # one panel per metric
>>> results = ddtk.launch(train, 2, on_report=live)  # doctest: +SKIP
>>> figure = live.close()   # the final figure: redrawn in a notebook, returned elsewhere

The ranks send metrics with ``ctx.report({...})`` (or the
:class:`~ddtk.parallel.callbacks.Report` callback); :func:`ddtk.launch` calls
``live(rank, value)`` in this process as each report arrives. In Jupyter the
figure is redrawn in place at most every ``interval`` seconds; elsewhere (a
script, papermill, nbval) it is drawn once, by :meth:`LivePlot.close`, so an
executed notebook still shows a static plot.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

__all__ = ["LivePlot"]


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class LivePlot:
    """Plot reported metrics against the step (or epoch) as they arrive.

    Args:
        metrics: the keys to plot, one panel each.
        x: the key used as the x axis (``"step"``; ``"epoch"`` for epoch reports).
        interval: minimum seconds between redraws.
        kind: keep only reports whose ``"kind"`` equals this (``"step"`` or ``"epoch"``), or all if None.
    """

    def __init__(
        self,
        metrics: Sequence[str] = ("loss",),
        x: str = "step",
        interval: float = 0.5,
        kind: str | None = None,
    ):
        self.metrics, self.x, self.interval, self.kind = list(metrics), x, interval, kind
        self.data: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
        self._last = 0.0
        self._handle: Any = None
        self._fig: Any = None
        self.live = _in_notebook()

    def __call__(self, rank: int, value: Any) -> None:
        """The ``on_report`` callback: record ``value`` (a dict) from ``rank`` and maybe redraw."""
        if not isinstance(value, dict) or (
            self.kind is not None and value.get("kind") != self.kind
        ):
            return
        x = value.get(self.x, len(self.data[(rank, self.metrics[0])]))
        for m in self.metrics:
            if m in value:
                self.data[(rank, m)].append((float(x), float(value[m])))
        if self.live and time.monotonic() - self._last >= self.interval:
            self._draw()
            self._last = time.monotonic()

    def figure(self):
        """Draw the current data into a (new or reused) matplotlib figure and return it."""
        import matplotlib.pyplot as plt

        if self._fig is None:
            self._fig, axes = plt.subplots(
                1, len(self.metrics), figsize=(4.5 * len(self.metrics), 3.2), squeeze=False
            )
            self._axes = axes[0]
            plt.close(self._fig)  # drawn on demand, never by the inline backend on its own
        for ax, m in zip(self._axes, self.metrics, strict=True):
            ax.clear()
            for (rank, key), pts in sorted(self.data.items()):
                if key == m and pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, label=f"rank {rank}")
            ax.set(xlabel=self.x, title=m)
            if ax.lines:
                ax.legend(fontsize=8)
        self._fig.tight_layout()
        return self._fig

    def _draw(self) -> None:
        from IPython.display import display

        fig = self.figure()
        if self._handle is None:
            self._handle = display(fig, display_id=True)
        else:
            self._handle.update(fig)

    def close(self) -> Any:
        """Final draw. In a notebook it updates the live figure; elsewhere it returns the figure to display."""
        if self.live:
            self._draw()
            return None
        return self.figure()
