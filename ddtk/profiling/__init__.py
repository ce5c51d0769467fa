"""Distributed profiling that works on a CPU laptop and on GPUs.

Collect one Chrome trace per rank with :class:`StepProfiler` (inside ``ddtk.launch``,
``torchrun`` or Ray Train), then :func:`analyse` the folder: per rank and per step,
compute, communication, data loading, optimizer and idle time, how much communication
overlapped compute, stragglers, the top operators, and a diagnosis in plain words.
:func:`plot_timeline` draws the ranks on one clock; :func:`py_spy_record` profiles the
Python of a whole launched job; :mod:`ddtk.profiling.jobs` is a training job with
bottlenecks to plant, which ``ddtk profile`` runs. :mod:`ddtk.profiling.mfu` turns a
throughput into model FLOPs utilisation, and a model size into GPU-hours, days and cost.

Every public name is importable from the package itself. Those of the modules that
share a function's name (``breakdown``, ``diagnose``) are imported here, so that the
name means the function; the rest load on first use. Neither imports torch, so
``import ddtk.profiling`` (and the ``ddtk`` command, whose parser imports
:mod:`ddtk.profiling.cli`) costs no torch import.
"""

from ddtk._lazy import lazy_exports
from ddtk.profiling.breakdown import Breakdown, StepBreakdown, breakdown, stragglers
from ddtk.profiling.diagnose import Finding, diagnose, explain

# public name -> the submodule that defines it
_EXPORTS = {
    "StepProfiler": "collect",
    "current_rank": "collect",
    "region": "collect",
    "JOBS": "jobs",
    "JobConfig": "jobs",
    "JobResult": "jobs",
    "run_job": "jobs",
    "CHINCHILLA_TOKENS_PER_PARAM": "mfu",
    "FLOPS_PER_PARAM_TOKEN": "mfu",
    "H100_SXM_BF16_DENSE_TFLOPS": "mfu",
    "RunSize": "mfu",
    "model_flops_utilization": "mfu",
    "size_run": "mfu",
    "training_flops": "mfu",
    "top_operators": "operators",
    "hot_functions": "pyspy",
    "py_spy_record": "pyspy",
    "Analysis": "report",
    "analyse": "report",
    "plot_timeline": "timeline",
    "RankTrace": "trace",
    "TraceError": "trace",
    "load_trace": "trace",
    "load_traces": "trace",
}

__getattr__, __dir__, _ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "CHINCHILLA_TOKENS_PER_PARAM",
    "FLOPS_PER_PARAM_TOKEN",
    "H100_SXM_BF16_DENSE_TFLOPS",
    "JOBS",
    "Analysis",
    "Breakdown",
    "Finding",
    "JobConfig",
    "JobResult",
    "RankTrace",
    "RunSize",
    "StepBreakdown",
    "StepProfiler",
    "TraceError",
    "analyse",
    "breakdown",
    "current_rank",
    "diagnose",
    "explain",
    "hot_functions",
    "load_trace",
    "load_traces",
    "model_flops_utilization",
    "plot_timeline",
    "py_spy_record",
    "region",
    "run_job",
    "size_run",
    "stragglers",
    "top_operators",
    "training_flops",
]
