"""HolisticTraceAnalysis (HTA), the GPU peer of :mod:`ddtk.profiling`, where it applies to CPU traces.

HTA (``pip install HolisticTraceAnalysis``) reads the same per-rank traces. Its
temporal breakdown, idle-time and overlap analyses are built on GPU kernels and
streams: on a CPU-only trace they find no kernels and fail or return NaN, which is
why ddtk computes the CPU breakdown itself. Two parts of HTA do work on CPU traces
and are used here: loading a folder of traces into pandas frames, and ``TraceDiff``,
which compares the operators of two runs (counts and total time), the quickest way
to see what a change removed. On a GPU cluster, use ``TraceAnalysis`` directly:
``get_temporal_breakdown()``, ``get_comm_comp_overlap()``, ``get_idle_time_breakdown()``.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any

__all__ = ["compare", "load"]


@contextlib.contextmanager
def _quiet():
    """HTA logs a line per file parsed and prints to stdout; keep notebooks readable."""
    logger = logging.getLogger("hta")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _parse_in_process():
    """Make HTA parse the rank files one after another, in this process.

    HTA parses several ranks in a pool of processes made with ``fork``. Forking a
    process that runs other threads (a Jupyter kernel, a Ray driver, torch's thread
    pools, a test runner) copies locks those threads hold, and a child can then block
    forever: the parse, or the pool's shutdown, hangs. A course trace has a few
    ranks of a few MB each, where parsing them in turn costs a second or two.
    """
    from hta.common.trace import Trace

    parse = Trace.parse_multiple_ranks

    def sequential(self, ranks, use_multiprocessing=True, use_memory_profiling=True):
        return parse(self, ranks, False, use_memory_profiling)

    Trace.parse_multiple_ranks = sequential
    try:
        yield
    finally:
        Trace.parse_multiple_ranks = parse


def _import() -> Any:
    try:
        import hta  # noqa: F401
    except ImportError:
        raise ImportError(
            "HolisticTraceAnalysis is not installed: pip install HolisticTraceAnalysis "
            "(or ddtk[profiling])"
        ) from None


def load(trace_dir: str | Path) -> Any:
    """An ``hta.trace_analysis.TraceAnalysis`` over the folder (one ``rank<r>.json`` per rank)."""
    _import()
    from hta.trace_analysis import TraceAnalysis

    with _quiet(), _parse_in_process():
        return TraceAnalysis(trace_dir=str(trace_dir))


def compare(before: str | Path, after: str | Path, rank: int = 0, n: int | None = 10) -> Any:
    """HTA's ``TraceDiff`` of the CPU operators of two runs, biggest time saved first.

    Returns a pandas DataFrame indexed by operator name with the counts and total
    microseconds in ``before`` (HTA's *control*) and ``after`` (*test*) and their
    differences, for the first profiled step of ``rank`` in each.
    """
    _import()
    from hta.trace_diff import DeviceType, TraceDiff

    with _quiet(), _parse_in_process():
        df = TraceDiff.compare_traces(
            str(before), str(after), control_rank=rank, test_rank=rank, device_type=DeviceType.CPU
        )
    df = df.sort_values("diff_duration")
    return df.head(n) if n else df
