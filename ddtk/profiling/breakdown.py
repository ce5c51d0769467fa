"""Where each step's time went, per rank: compute, communication, data, optimizer, idle.

For every ``ProfilerStep#N`` window of every rank the step is cut into five parts that
add up to the step time, in this order of precedence:

1. **data**: the training thread is inside a batch fetch;
2. **optimizer**: it is inside ``optimizer.step`` / ``zero_grad``;
3. **compute**: it runs any other operator (on a GPU trace: a non-NCCL kernel runs);
4. **communication**: a collective is in flight (on any thread or stream) and none of
   the above is happening, i.e. the communication nothing hides: *exposed* communication;
5. **idle**: nothing at all (a ``time.sleep``, a Python loop between operators, a GPU
   waiting for the host).

Separately, ``comm_total`` is all the time a collective was in flight and ``overlap``
the fraction of it during which the rank did useful work anyway: DDP's bucketed
all-reduces run on gloo's thread while autograd computes the next gradients.

Stragglers: in synchronous data parallelism every rank's step takes as long as the
slowest rank's, so step times barely differ. What differs is how long each rank
*waits*: the others wait in the all-reduce for the straggler. ``busy`` = step time
minus exposed communication; a rank whose busy time is well above the others' is
named a straggler.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass

from ddtk.profiling.intervals import Span, clip, intersect, length, subtract, union
from ddtk.profiling.trace import DEVICE_CATS, RankTrace, category

__all__ = ["Breakdown", "StepBreakdown", "breakdown", "lanes", "step_parts", "stragglers"]


@dataclass(frozen=True)
class StepBreakdown:
    """One step of one rank; every time in milliseconds."""

    rank: int
    step: int
    start_ms: float
    step_ms: float
    compute_ms: float
    communication_ms: float
    data_ms: float
    optimizer_ms: float
    idle_ms: float
    comm_total_ms: float
    overlap: float
    collectives: int
    comm_bytes: int
    forwards: int = 0
    synced_forwards: int = 0
    fp32_matmul: float = 0.0

    @property
    def busy_ms(self) -> float:
        """Step time not spent waiting for communication."""
        return self.step_ms - self.communication_ms

    def share(self, part: str) -> float:
        """``part``'s fraction of the step (0 for an empty step)."""
        return getattr(self, f"{part}_ms") / self.step_ms if self.step_ms > 0 else 0.0


_DTYPE_BYTES = {
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "double": 8,
    "long int": 8,
    "int": 4,
}


def _message_bytes(args: dict) -> int:
    """Bytes of a gloo/NCCL collective from the shapes the profiler recorded (0 if unknown)."""
    if "In msg nelems" in args:
        return int(args["In msg nelems"]) * _DTYPE_BYTES.get(str(args.get("dtype", "float")), 4)
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    if len(dims) >= 1 and dims[0] and all(isinstance(d, int) for d in dims[0]):
        return math.prod(dims[0]) * _DTYPE_BYTES.get(types[0] if types else "float", 4)
    return 0


@dataclass
class _Lanes:
    """A rank's events reduced to disjoint interval sets, one per category."""

    data: list[Span]
    optimizer: list[Span]
    host_comm: list[Span]
    compute: list[Span]
    comm: list[Span]
    comm_events: list  # events that carry a message (gloo thread, NCCL kernel or annotation)
    issues: list[float]  # start times of the collectives the training thread issued
    forwards: list[float]  # start times of DDP forward passes
    matmuls: list  # matrix-multiply events with their input dtypes
    on_device: bool = False  # compute comes from GPU kernels


def lanes(trace: RankTrace) -> _Lanes:
    """A rank's events as disjoint interval sets per category, for :func:`step_parts`."""
    main: dict[str, list[Span]] = defaultdict(list)
    device_compute: list[Span] = []
    comm: list[Span] = []
    messages = []
    on_device = trace.on_device
    issues, forwards, matmuls = [], [], []
    for e in trace.events:
        if e.tid == trace.main_tid:
            if e.name.startswith(("c10d::", "record_param_comms", "nccl:")):
                issues.append(e.ts)
            elif e.name == "DistributedDataParallel.forward":
                forwards.append(e.ts)
            elif e.name in _MATMULS:
                matmuls.append(e)
        cat = category(e)
        if cat is None:
            continue
        span = (e.ts, e.end)
        if e.cat in DEVICE_CATS:
            (comm if cat == "communication" else device_compute).append(span)
            if cat == "communication":
                messages.append(e)
        elif e.tid == trace.main_tid:
            main[cat].append(span)
            if cat == "communication" and not on_device:
                comm.append(span)
        elif cat == "communication" and not on_device:
            comm.append(span)  # gloo:all_reduce on gloo's own threads
            messages.append(e)
    data = union(main["data"])
    optimizer = subtract(union(main["optimizer"]), data)
    host_comm = subtract(subtract(union(main["communication"]), data), optimizer)
    busy_host = union(data + optimizer + host_comm)
    compute = union(device_compute) if on_device else subtract(union(main["compute"]), busy_host)
    return _Lanes(
        data,
        optimizer,
        host_comm,
        compute,
        union(comm),
        messages,
        issues,
        forwards,
        matmuls,
        on_device,
    )


_MATMULS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::baddbmm"})


def _synced_forwards(forwards: list[float], issues: list[float], hi: float) -> int:
    """How many forward passes (micro-batches) of the step were followed by a collective."""
    bounds = [*forwards, hi]
    return sum(any(a <= t < b for t in issues) for a, b in itertools.pairwise(bounds))


def _fp32_share(matmuls: list) -> float:
    """Fraction of matrix-multiply time whose first input was float32 (needs record_shapes)."""
    total = sum(e.dur for e in matmuls)
    fp32 = sum(e.dur for e in matmuls if (e.args.get("Input type") or [""])[0] == "float")
    return fp32 / total if total else 0.0


def step_parts(lanes: _Lanes, lo: float, hi: float) -> tuple[dict[str, list[Span]], list[Span]]:
    """The window ``[lo, hi]`` cut into exclusive parts, and every span a collective was in flight.

    The parts are ``compute``, ``data``, ``optimizer`` and ``communication`` (exposed);
    what none of them covers is idle. On a CPU trace the training thread's own work
    decides (data, then optimizer, then compute, then waiting). On a GPU trace the
    device decides: kernels are compute, NCCL kernels that nothing hides are
    communication, and only while the GPU has nothing to run does what the host is
    doing (fetching a batch, stepping the optimizer) count as data or optimizer.
    """
    data, opt = clip(lanes.data, lo, hi), clip(lanes.optimizer, lo, hi)
    compute, comm = clip(lanes.compute, lo, hi), clip(lanes.comm, lo, hi)
    if lanes.on_device:
        exposed = subtract(comm, compute)
        data = subtract(data, union(compute + exposed))
        opt = subtract(opt, union(compute + exposed + data))
    else:
        compute = subtract(compute, union(data + opt))
        exposed = subtract(comm, union(data + opt + compute))
    return {"compute": compute, "data": data, "optimizer": opt, "communication": exposed}, comm


def _step_row(trace: RankTrace, lanes: _Lanes, step: int, lo: float, hi: float) -> StepBreakdown:
    parts, comm = step_parts(lanes, lo, hi)
    data, opt, compute, exposed = (
        parts["data"],
        parts["optimizer"],
        parts["compute"],
        parts["communication"],
    )
    useful = union(data + opt + compute)
    window = hi - lo
    busy = length(useful) + length(exposed)
    msgs = [e for e in lanes.comm_events if lo <= e.ts < hi]
    comm_total = length(comm)
    forwards = [t for t in lanes.forwards if lo <= t < hi]
    issues = [t for t in lanes.issues if lo <= t < hi]
    return StepBreakdown(
        rank=trace.rank, step=step, start_ms=lo / 1e3, step_ms=window / 1e3,
        compute_ms=length(compute) / 1e3, communication_ms=length(exposed) / 1e3,
        data_ms=length(data) / 1e3, optimizer_ms=length(opt) / 1e3,
        idle_ms=max(window - busy, 0.0) / 1e3, comm_total_ms=comm_total / 1e3,
        overlap=length(intersect(comm, useful)) / comm_total if comm_total > 0 else 0.0,
        collectives=len(msgs), comm_bytes=sum(_message_bytes(e.args) for e in msgs),
        forwards=len(forwards), synced_forwards=_synced_forwards(forwards, issues, hi),
        fp32_matmul=_fp32_share([e for e in lanes.matmuls if lo <= e.ts < hi]),
    )  # fmt: skip


@dataclass
class Breakdown:
    """Per-rank, per-step breakdown of a profiled job (:func:`breakdown` builds it)."""

    rows: list[StepBreakdown]
    world_size: int

    @property
    def ranks(self) -> list[int]:
        return sorted({r.rank for r in self.rows})

    def of_rank(self, rank: int) -> list[StepBreakdown]:
        return [r for r in self.rows if r.rank == rank]

    def mean(self, rank: int, field_name: str) -> float:
        """Mean of ``field_name`` over the rank's steps."""
        values = [getattr(r, field_name) for r in self.of_rank(rank)]
        return statistics.fmean(values) if values else 0.0

    def share(self, rank: int, part: str) -> float:
        """``part``'s share of the rank's total step time (time-weighted over its steps)."""
        rows = self.of_rank(rank)
        total = sum(r.step_ms for r in rows)
        return sum(getattr(r, f"{part}_ms") for r in rows) / total if total else 0.0

    def per_rank(self) -> list[dict]:
        """One summary row per rank: mean milliseconds per step and the overlap fraction."""
        out = []
        for rank in self.ranks:
            rows = self.of_rank(rank)
            comm_total = sum(r.comm_total_ms for r in rows)
            hidden = sum(r.comm_total_ms * r.overlap for r in rows)
            out.append({
                "rank": rank, "steps": len(rows),
                **{f"{k}_ms": self.mean(rank, f"{k}_ms") for k in
                   ("step", "compute", "communication", "data", "optimizer", "idle", "comm_total", "busy")},
                "overlap": hidden / comm_total if comm_total else 0.0,
                "busy_median_ms": statistics.median(r.busy_ms for r in rows),
                "collectives": self.mean(rank, "collectives"),
                "comm_bytes": self.mean(rank, "comm_bytes"),
                "forwards": self.mean(rank, "forwards"),
                "synced_forwards": self.mean(rank, "synced_forwards"),
                "fp32_matmul": self.mean(rank, "fp32_matmul"),
            })  # fmt: skip
        return out

    def spread(self) -> dict[str, float]:
        """Step-time spread across ranks: mean over steps of (slowest - fastest) rank, in ms."""
        by_step: dict[int, list[float]] = defaultdict(list)
        for r in self.rows:
            by_step[r.step].append(r.step_ms)
        gaps = [max(v) - min(v) for v in by_step.values() if len(v) > 1]
        return {
            "mean_ms": statistics.fmean(gaps) if gaps else 0.0,
            "max_ms": max(gaps, default=0.0),
        }

    def to_dicts(self) -> list[dict]:
        return [asdict(r) for r in self.rows]


def breakdown(traces: list[RankTrace], skip_first: int = 0) -> Breakdown:
    """Cut every step of every rank's trace into compute, communication, data, optimizer, idle.

    Args:
        traces: one :class:`~ddtk.profiling.trace.RankTrace` per rank (:func:`load_traces`).
        skip_first: steps to drop from the start of each trace (e.g. a step that
            paid a one-off cost inside the window).
    """
    if not traces:
        raise ValueError("breakdown needs at least one trace")
    rows: list[StepBreakdown] = []
    for trace in traces:
        rank_lanes = lanes(trace)
        for number, step in list(zip(trace.step_numbers(), trace.steps))[skip_first:]:
            rows.append(_step_row(trace, rank_lanes, number, step.ts, step.end))
    world = max([t.world_size or 0 for t in traces] + [len(traces)])
    return Breakdown(rows=rows, world_size=world)


def stragglers(bd: Breakdown, threshold: float = 0.25, min_share: float = 0.05) -> list[dict]:
    """Ranks whose median busy time per step exceeds the median of the other ranks' by ``threshold``.

    Medians over steps, so one step that the operating system stretched (two ranks
    sharing a core) does not make a straggler; a node that is slower every step does.

    The excess must also be at least ``min_share`` of the rank's step time.
    Returns one dict per straggler: rank, its busy ms, the others' median, and the
    ratio. A single rank, or ranks that all take the same time, give none.
    """
    rows = bd.per_rank()
    busy = {r["rank"]: r["busy_median_ms"] for r in rows}
    step = {r["rank"]: r["step_ms"] for r in rows}
    out = []
    for rank, mine in busy.items():
        others = [v for k, v in busy.items() if k != rank]
        if not others:
            continue
        median = statistics.median(others)
        if mine > median * (1 + threshold) and mine - median > min_share * step[rank]:
            out.append(
                {
                    "rank": rank,
                    "busy_ms": mine,
                    "others_ms": median,
                    "ratio": mine / median if median else float("inf"),
                }
            )
    return sorted(out, key=lambda s: -s["ratio"])
