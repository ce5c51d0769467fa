"""Distributed profiling that works on a CPU laptop and on GPUs.

Collect one Chrome trace per rank with :class:`StepProfiler` (inside ``ddtk.launch``,
``torchrun`` or Ray Train), then :func:`analyse` the folder: per rank and per step,
compute, communication, data loading, optimizer and idle time, how much communication
overlapped compute, stragglers, the top operators, and a diagnosis in plain words.
:func:`plot_timeline` draws the ranks on one clock; :func:`py_spy_record` profiles the
Python of a whole launched job; :mod:`ddtk.profiling.jobs` is a training job with
bottlenecks to plant, which ``ddtk profile`` runs.
"""

from ddtk.profiling.breakdown import Breakdown, StepBreakdown, breakdown, stragglers
from ddtk.profiling.collect import StepProfiler, current_rank, region
from ddtk.profiling.diagnose import Finding, diagnose, explain
from ddtk.profiling.jobs import JOBS, JobConfig, JobResult, run_job
from ddtk.profiling.operators import top_operators
from ddtk.profiling.pyspy import hot_functions, py_spy_record
from ddtk.profiling.report import Analysis, analyse
from ddtk.profiling.timeline import plot_timeline
from ddtk.profiling.trace import RankTrace, TraceError, load_trace, load_traces

__all__ = [
    "JOBS",
    "Analysis",
    "Breakdown",
    "Finding",
    "JobConfig",
    "JobResult",
    "RankTrace",
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
    "plot_timeline",
    "py_spy_record",
    "region",
    "run_job",
    "stragglers",
    "top_operators",
]
