"""The operators that take the time: self time per operator name, per step.

An operator's *self* time is its duration minus the durations of the operators it
called on the same thread (``aten::linear`` calls ``aten::addmm``, which does the
work). Ranking by self time points at the code that actually ran; ranking by total
time would put the outermost wrappers first every time. On GPU traces the kernels
are ranked the same way (a kernel has no children).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ddtk.profiling.trace import DEVICE_CATS, Event, RankTrace, category

__all__ = ["OperatorTime", "self_times", "top_operators"]


@dataclass(frozen=True)
class OperatorTime:
    """One operator name's self time, averaged per profiled step."""

    name: str
    category: str
    calls_per_step: float
    self_ms_per_step: float
    share: float


def self_times(events: list[Event]) -> list[tuple[Event, float]]:
    """Each event of one thread with its self time in microseconds (events sorted by start)."""
    out: list[tuple[Event, float]] = []
    stack: list[list] = []  # [event, children's time]
    for e in sorted(events, key=lambda e: (e.ts, -e.dur)):
        while stack and stack[-1][0].end <= e.ts:
            done, child = stack.pop()
            out.append((done, done.dur - child))
        if stack:
            stack[-1][1] += min(e.dur, stack[-1][0].end - e.ts)
        stack.append([e, 0.0])
    out += [(ev, ev.dur - child) for ev, child in stack]
    return out


def top_operators(trace: RankTrace, n: int = 10) -> list[OperatorTime]:
    """The ``n`` operators with the most self time per step on the training thread or device."""
    steps = max(len(trace.steps), 1)
    lo, hi = trace.steps[0].ts, trace.steps[-1].end
    step_us = sum(s.dur for s in trace.steps) or 1.0
    device = trace.on_device
    by_thread: dict = defaultdict(list)
    for e in trace.events:
        cat = category(e)
        if cat is None or not lo <= e.ts < hi:
            continue
        if (e.cat in DEVICE_CATS) == device and (device or e.tid == trace.main_tid):
            by_thread[e.tid].append(e)
    total: dict[str, list] = defaultdict(lambda: [0, 0.0, ""])
    for events in by_thread.values():
        for e, self_us in self_times(events):
            t = total[e.name]
            t[0] += 1
            t[1] += self_us
            t[2] = category(e) or ""
    ranked = sorted(total.items(), key=lambda kv: -kv[1][1])[:n]
    return [
        OperatorTime(name, cat, calls / steps, us / 1e3 / steps, us / step_us)
        for name, (calls, us, cat) in ranked
    ]
