"""Pipeline schedules and timelines: which micro-batch each stage runs when, and what it cost.

A schedule is, per stage, an ordered list of actions ``F i`` (forward of
micro-batch ``i``) and ``B i`` (its backward). Three are provided:

* ``naive``: the whole batch is one micro-batch: ``F0`` through every stage, then
  ``B0`` back. Only one stage works at a time.
* ``gpipe``: all ``m`` forwards, then all ``m`` backwards. Every stage holds the
  activations of all ``m`` micro-batches at the end of the forward phase.
* ``1f1b``: stage ``s`` of ``p`` runs ``min(p - 1 - s, m)`` warm-up forwards, then
  alternates one forward and one backward, then drains the remaining backwards.
  Stage ``s`` never holds more than ``min(p - s, m)`` micro-batches of activations.

Both gpipe and 1f1b take ``(m + p - 1)(t_f + t_b)`` for a step when every stage's
forward takes ``t_f`` and backward ``t_b``; each stage computes for ``m (t_f + t_b)``
of it, so the idle share, the *bubble*, is :func:`theoretical_bubble` ``(p - 1)/(m + p - 1)``.

A :class:`Timeline` records what one rank did in one step: its :class:`Event`
list (times in seconds from a common start) and how many micro-batches it held
over time. :func:`simulate` builds the timelines of a schedule with fixed
times, the textbook picture; :func:`bubble_fraction` measures either kind.

>>> [str(a) for a in schedule_order("1f1b", stage=0, num_stages=3, num_microbatches=4)]
['F0', 'F1', 'F2', 'B0', 'F3', 'B1', 'B2', 'B3']
>>> timelines = simulate("gpipe", num_stages=3, num_microbatches=4)
>>> round(bubble_fraction(timelines), 6), round(theoretical_bubble(3, 4), 6)
(0.333333, 0.333333)
>>> [t.peak_in_flight for t in simulate("1f1b", 3, 4)]
[3, 2, 1]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "SCHEDULES", "Action", "Event", "Timeline", "bubble_fraction", "check_schedule",
    "schedule_order", "simulate", "theoretical_bubble",
]  # fmt: skip

SCHEDULES = ("naive", "gpipe", "1f1b")


class Action(NamedTuple):
    """One unit of work of a stage: ``kind`` is ``"F"`` (forward) or ``"B"`` (backward)."""

    kind: str
    micro: int

    def __str__(self) -> str:
        return f"{self.kind}{self.micro}"


@dataclass
class Event:
    """An action as it ran: ``start`` and ``end`` in seconds from the step's common start."""

    kind: str
    micro: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    """What one rank (stage) did during one step.

    ``in_flight`` lists ``(time, count)`` after every change of the number of
    micro-batches whose activations the stage holds (forwarded, not yet backwarded).
    """

    rank: int
    events: list[Event] = field(default_factory=list)
    in_flight: list[tuple[float, int]] = field(default_factory=list)

    def record(self, kind: str, micro: int, start: float, end: float) -> None:
        """Append an event and update the in-flight count (+1 after F, -1 after B)."""
        self.events.append(Event(kind, micro, start, end))
        held = self.in_flight[-1][1] if self.in_flight else 0
        self.in_flight.append((end, held + (1 if kind == "F" else -1)))

    @property
    def order(self) -> list[str]:
        """The actions in the order they ran, e.g. ``['F0', 'F1', 'B0', 'B1']``."""
        return [f"{e.kind}{e.micro}" for e in self.events]

    @property
    def peak_in_flight(self) -> int:
        """The most micro-batches whose activations this stage held at once."""
        return max((n for _, n in self.in_flight), default=0)

    @property
    def busy(self) -> float:
        """Seconds spent in forward and backward computation."""
        return sum(e.duration for e in self.events)


def check_schedule(schedule: str, num_microbatches: int) -> None:
    """Raise ValueError for an unknown schedule or a micro-batch count it cannot run."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int):
        raise TypeError(f"num_microbatches must be an int, got {type(num_microbatches).__name__}")
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    if schedule == "naive" and num_microbatches != 1:
        raise ValueError(
            f"schedule 'naive' runs the whole batch as one micro-batch; got num_microbatches="
            f"{num_microbatches}. Use num_microbatches=1, or schedule 'gpipe' or '1f1b'."
        )


def schedule_order(
    schedule: str, stage: int, num_stages: int, num_microbatches: int
) -> list[Action]:
    """The actions of ``stage`` (0-based, of ``num_stages``) in the order the schedule runs them."""
    check_schedule(schedule, num_microbatches)
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage must be in [0, {num_stages}), got {stage}")
    m = num_microbatches
    forwards = [Action("F", i) for i in range(m)]
    backwards = [Action("B", i) for i in range(m)]
    if schedule in ("naive", "gpipe"):
        return forwards + backwards
    warmup = min(num_stages - 1 - stage, m)
    order = forwards[:warmup]
    for i in range(m - warmup):  # steady state: one forward, one backward
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[m - warmup :]  # cool-down


def theoretical_bubble(num_stages: int, num_microbatches: int) -> float:
    """``(p - 1) / (m + p - 1)``: the idle share of a step with uniform stage times."""
    if num_stages < 1 or num_microbatches < 1:
        raise ValueError("num_stages and num_microbatches must be >= 1")
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def bubble_fraction(timelines: Sequence[Timeline]) -> float:
    """Measured idle share of a step: ``1 - sum of busy time / (p * T)``.

    ``T`` runs from the earliest event start to the latest event end over all
    ``p`` timelines; busy time is the time inside forward and backward events.
    Everything else (waiting for a neighbour's activation or gradient, message
    handling, the ramp-up and drain of the pipeline) is idle. With uniform
    stage times this equals :func:`theoretical_bubble`.
    """
    events = [e for t in timelines for e in t.events]
    if not events:
        raise ValueError("bubble_fraction needs timelines with at least one event")
    span = max(e.end for e in events) - min(e.start for e in events)
    if span <= 0:
        return 0.0
    return 1.0 - sum(e.duration for e in events) / (len(timelines) * span)


def simulate(
    schedule: str,
    num_stages: int,
    num_microbatches: int,
    forward_time: float = 1.0,
    backward_time: float = 1.0,
) -> list[Timeline]:
    """The timelines a schedule gives with fixed times and free communication.

    Each stage runs its :func:`schedule_order` in turn; ``F i`` on stage ``s`` waits
    for ``F i`` on stage ``s - 1``, and ``B i`` waits for ``B i`` on stage ``s + 1``.
    """
    orders = [schedule_order(schedule, s, num_stages, num_microbatches) for s in range(num_stages)]
    done: dict[tuple[int, str, int], float] = {}
    clock = [0.0] * num_stages
    nxt = [0] * num_stages
    timelines = [Timeline(rank=s) for s in range(num_stages)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(num_stages):
            if nxt[s] == len(orders[s]):
                continue
            kind, i = orders[s][nxt[s]]
            dep = (s - 1, "F", i) if kind == "F" else (s + 1, "B", i)
            first = (kind == "F" and s == 0) or (kind == "B" and s == num_stages - 1)
            if not first and dep not in done:
                continue
            start = max(clock[s], 0.0 if first else done[dep])
            end = start + (forward_time if kind == "F" else backward_time)
            timelines[s].record(kind, i, start, end)
            done[(s, kind, i)] = clock[s] = end
            nxt[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:  # pragma: no cover - the schedules above never deadlock
            raise RuntimeError(f"schedule {schedule!r} deadlocks")
    return timelines
