"""Plots and widgets the notebooks use: measured results drawn the same way everywhere.

- :mod:`~ddtk.viz.plots`: bus bandwidth and time against message size, scaling and Amdahl fits;
- :mod:`~ddtk.viz.pipeline`: the pipeline diagram (ranks as rows, a block per forward and backward);
- :mod:`~ddtk.viz.ring_stepper`: step-by-step pictures of ring all-reduce, from its own schedule;
- :mod:`~ddtk.viz.live`: live training curves in a notebook, fed by reports from the ranks.

Every public name of these modules is importable from the package itself, loaded on
first use (so ``import ddtk.viz`` imports neither matplotlib nor torch).
"""

from ddtk._lazy import lazy_exports

# public name -> the submodule that defines it
_EXPORTS = {
    "LivePlot": "live",
    "COLORS": "pipeline",
    "plot_in_flight": "pipeline",
    "plot_schedule": "pipeline",
    "plot_timeline": "pipeline",
    "algorithms_in": "plots",
    "amdahl_speedup": "plots",
    "fit_serial_fraction": "plots",
    "format_bytes": "plots",
    "plot_busbw": "plots",
    "plot_scaling": "plots",
    "plot_stacked_times": "plots",
    "plot_time_vs_size": "plots",
    "series": "plots",
    "apply_step": "ring_stepper",
    "describe_step": "ring_stepper",
    "draw_ring_step": "ring_stepper",
    "initial_state": "ring_stepper",
    "load_schedule": "ring_stepper",
    "ring_states": "ring_stepper",
    "ring_steps_figure": "ring_stepper",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
