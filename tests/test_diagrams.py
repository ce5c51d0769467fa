"""Every diagram of :mod:`ddtk.viz.diagrams` draws at its defaults: a figure with content.

The diagrams are discovered, not listed: a new ``draw_*`` function is tested on arrival.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

import ddtk.viz.diagrams as diagrams


def _draw_functions() -> list[tuple[str, object]]:
    found = []
    for info in pkgutil.iter_modules(diagrams.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{diagrams.__name__}.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("draw_") and fn.__module__ == module.__name__:
                found.append((f"{info.name}.{name}", fn))
    return found


DRAWS = _draw_functions()


def test_there_are_diagrams() -> None:
    assert len(DRAWS) >= 7, [name for name, _ in DRAWS]


@pytest.mark.parametrize(("name", "draw"), DRAWS, ids=[name for name, _ in DRAWS])
def test_diagram_draws_at_its_defaults(name: str, draw) -> None:
    fig = draw()
    try:
        assert isinstance(fig, Figure), f"{name} returned {type(fig).__name__}, not a Figure"
        drawn = sum(len(ax.patches) + len(ax.lines) + len(ax.texts) + len(ax.collections)
                    for ax in fig.axes)  # fmt: skip
        assert fig.axes and drawn >= 3, f"{name} drew {drawn} elements"
        assert fig.axes[0].get_title() or fig._suptitle is not None, f"{name} has no title"
    finally:
        plt.close(fig)
