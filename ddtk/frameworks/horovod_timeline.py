"""Read a Horovod timeline: which tensor spent how long in which phase, and what got fused.

``HOROVOD_TIMELINE=/path/timeline.json`` (or ``hvd.start_timeline(path)``) makes
rank 0 write a Chrome-trace file: one trace "process" (``pid``) per tensor name,
``B``/``E`` events that open and close a phase, ``X`` markers, ``M`` metadata
naming each pid. The phases of one all-reduce, in order:

* ``NEGOTIATE_ALLREDUCE``: from the first rank saying "ready" to the coordinator
  deciding that every rank is ready (the ``X`` markers inside are the ranks);
* ``ALLREDUCE``: the operation itself, with nested activities such as
  ``MEMCPY_IN_FUSION_BUFFER``, ``GLOO_ALLREDUCE`` (``NCCL_ALLREDUCE`` on GPUs,
  ``MPI_ALLREDUCE`` with MPI) and ``MEMCPY_OUT_FUSION_BUFFER``.

Horovod writes the JSON array incrementally and often leaves it unterminated
(a trailing comma, no closing bracket, phases still open at shutdown);
:func:`load_timeline` tolerates that and drops phases that never closed.
Tensors whose ``ALLREDUCE`` intervals overlap were executed as one fused
response (Horovod's background thread runs responses one at a time), which is
what :func:`fused_groups` reports.

>>> text = '''[
... {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.w"}},
... {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "allreduce.b"}},
... {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 0, "pid": 1},{"ph": "E", "ts": 40, "pid": 1},
... {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 5, "pid": 2},{"ph": "E", "ts": 40, "pid": 2},
... {"ph": "B", "name": "ALLREDUCE", "ts": 41, "pid": 1},{"ph": "B", "name": "ALLREDUCE", "ts": 41, "pid": 2},
... {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 45, "pid": 1},{"ph": "E", "ts": 90, "pid": 1},
... {"ph": "E", "ts": 95, "pid": 1},{"ph": "E", "ts": 95, "pid": 2},
... {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 99, "pid": 1},'''
>>> tl = parse_timeline(text)
>>> [(i.tensor, i.phase, i.duration_us) for i in tl.intervals if i.depth == 0]
[('allreduce.w', 'NEGOTIATE_ALLREDUCE', 40.0), ('allreduce.b', 'NEGOTIATE_ALLREDUCE', 35.0), ('allreduce.b', 'ALLREDUCE', 54.0), ('allreduce.w', 'ALLREDUCE', 54.0)]
>>> [sorted(g.tensors) for g in fused_groups(tl)]
[['allreduce.b', 'allreduce.w']]
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FusedGroup",
    "Interval",
    "Timeline",
    "fused_groups",
    "load_timeline",
    "parse_timeline",
    "phase_summary",
    "plot_timeline",
]

SYNC_PREFIX = "sync."  # tensors the knob sweep uses to line ranks up, not gradients


@dataclass(frozen=True)
class Interval:
    """One closed phase of one tensor: ``[start_us, end_us]``, nested ``depth`` levels deep."""

    tensor: str
    phase: str
    start_us: float
    end_us: float
    depth: int = 0

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass
class Timeline:
    """The parsed file: closed intervals, per-tensor marker events and what never closed."""

    intervals: list[Interval]
    markers: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    unclosed: int = 0

    @property
    def tensors(self) -> list[str]:
        return sorted({i.tensor for i in self.intervals})

    def of(self, phase: str) -> list[Interval]:
        return [i for i in self.intervals if i.phase == phase]


@dataclass
class FusedGroup:
    """Tensors reduced by one response: their top-level operation intervals overlap."""

    start_us: float
    end_us: float
    tensors: list[str]

    @property
    def is_sync(self) -> bool:
        return all(t.split("allreduce.", 1)[-1].startswith(SYNC_PREFIX) for t in self.tensors)


def _events(text: str) -> list[dict[str, Any]]:
    """The event list of a possibly unterminated JSON array (trailing comma, no ``]``)."""
    body = text.strip()
    if not body:
        return []
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        pass
    body = body.rstrip().rstrip(",")
    if not body.endswith("]"):
        body += "]"
    try:
        return json.loads(body)
    except json.JSONDecodeError:  # cut in the middle of an event: drop the partial last one
        cut = body.rfind("}")
        while cut > 0:
            try:
                return json.loads(body[: cut + 1].rstrip().rstrip(",") + "]")
            except json.JSONDecodeError:
                cut = body.rfind("}", 0, cut)
        raise


def parse_timeline(text: str) -> Timeline:
    """Turn a timeline's text into closed :class:`Interval` objects, pairing B/E per tensor."""
    names: dict[int, str] = {}
    stacks: dict[int, list[tuple[str, float]]] = defaultdict(list)
    intervals: list[Interval] = []
    markers: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for ev in _events(text):
        pid, ph = ev.get("pid"), ev.get("ph")
        if ph == "M":
            if ev.get("name") == "process_name" and "name" in ev.get("args", {}):
                names[pid] = ev["args"]["name"]
        elif ph == "B":
            stacks[pid].append((ev.get("name", "?"), float(ev["ts"])))
        elif ph == "E" and stacks[pid]:
            phase, start = stacks[pid].pop()
            tensor = names.get(pid, f"pid{pid}")
            intervals.append(Interval(tensor, phase, start, float(ev["ts"]), len(stacks[pid])))
        elif ph == "X":
            markers[names.get(pid, f"pid{pid}")].append((str(ev.get("name")), float(ev["ts"])))
    intervals.sort(key=lambda i: (i.start_us, i.depth, i.tensor))
    unclosed = sum(len(s) for s in stacks.values())
    return Timeline(intervals, dict(markers), unclosed)


def load_timeline(path: str | Path) -> Timeline:
    """:func:`parse_timeline` of a file."""
    return parse_timeline(Path(path).read_text(errors="replace"))


def phase_summary(tl: Timeline) -> dict[str, dict[str, float]]:
    """Per phase: number of intervals, total and mean microseconds (summed over tensors)."""
    out: dict[str, dict[str, float]] = {}
    for i in tl.intervals:
        s = out.setdefault(i.phase, {"count": 0, "total_us": 0.0, "depth": i.depth})
        s["count"] += 1
        s["total_us"] += i.duration_us
    for s in out.values():
        s["mean_us"] = s["total_us"] / s["count"]
    return out


def fused_groups(tl: Timeline, operation: str = "ALLREDUCE") -> list[FusedGroup]:
    """Group the top-level ``operation`` intervals that overlap in time: one group per response."""
    groups: list[FusedGroup] = []
    for i in sorted(tl.of(operation), key=lambda i: i.start_us):
        if i.depth:
            continue
        if groups and i.start_us < groups[-1].end_us:
            g = groups[-1]
            g.tensors.append(i.tensor)
            g.end_us = max(g.end_us, i.end_us)
        else:
            groups.append(FusedGroup(i.start_us, i.end_us, [i.tensor]))
    return groups


PHASE_COLORS = {
    "NEGOTIATE_ALLREDUCE": "#bbbbbb",
    "ALLREDUCE": "#4c72b0",
    "MEMCPY_IN_FUSION_BUFFER": "#dd8452",
    "GLOO_ALLREDUCE": "#55a868",
    "NCCL_ALLREDUCE": "#55a868",
    "MPI_ALLREDUCE": "#55a868",
    "MEMCPY_OUT_FUSION_BUFFER": "#c44e52",
}


def plot_timeline(
    tl: Timeline,
    title: str = "Horovod timeline",
    ax: Any = None,
    max_tensors: int = 40,
    window_us: tuple[float, float] | None = None,
) -> Any:
    """Gantt chart: one row per tensor, phases as bars (nested ones thinner), time in ms.

    ``window_us`` limits the x range (microseconds since the timeline started).
    Returns the matplotlib figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tensors = [t for t in tl.tensors if SYNC_PREFIX not in t][:max_tensors]
    if ax is None:
        _, ax = plt.subplots(figsize=(11, max(2.5, 0.22 * len(tensors) + 1.2)))
    row = {t: k for k, t in enumerate(tensors)}
    lo, hi = window_us or (float("-inf"), float("inf"))
    seen = set()
    for i in tl.intervals:
        if i.tensor not in row or i.end_us < lo or i.start_us > hi:
            continue
        height = 0.8 if i.depth == 0 else 0.45
        ax.barh(row[i.tensor], i.duration_us / 1e3, left=i.start_us / 1e3, height=height,
                color=PHASE_COLORS.get(i.phase, "#8172b2"), edgecolor="none")  # fmt: skip
        seen.add(i.phase)
    ax.set_yticks(range(len(tensors)), [t.replace("allreduce.", "") for t in tensors], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time since the timeline started (ms)")
    ax.set_ylabel("tensor")
    if window_us:
        ax.set_xlim(window_us[0] / 1e3, window_us[1] / 1e3)
    ax.set_title(title)
    handles = [Patch(color=PHASE_COLORS.get(p, "#8172b2"), label=p) for p in PHASE_COLORS if p in seen]
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    ax.figure.tight_layout()
    return ax.figure
