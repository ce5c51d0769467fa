"""Load the Chrome traces ``torch.profiler`` writes, one per rank, and sort their events.

A trace is a JSON object whose ``traceEvents`` are complete events (``"ph": "X"``)
with a name, a category (``cpu_op``, ``user_annotation``, ``kernel`` ...), a thread
(``tid``) and a start and a duration in microseconds. What this module adds:

* **which rank**: ``distributedInfo`` (written when a process group exists) gives the
  rank and the world size; a file named ``rank<r>.json`` is the fallback;
* **one clock**: ``ts`` counts from a per-process origin and ``baseTimeNanoseconds``
  places that origin in Unix time, so ``ts + base`` puts every rank of a host on the
  same clock (ranks on other hosts agree as well as their clocks do);
* **the training thread**: the thread that holds the ``ProfilerStep#N`` events
  ``prof.step()`` writes, one per step;
* **a category for every event** (:func:`category`): data loading, optimizer,
  communication or compute, from names PyTorch itself gives them.

The names come from PyTorch, not from ddtk: ``enumerate(DataLoader)#...__next__``
around every batch fetch, ``Optimizer.step#SGD.step`` and ``Optimizer.zero_grad#...``,
``c10d::allreduce_`` where the training thread issues a collective, ``gloo:all_reduce``
on gloo's own threads while it runs, ``nccl:all_reduce`` and ``ncclDevKernel_*``
kernels on GPUs. Code that is none of these can say what it is with
:func:`ddtk.profiling.region` (``ddtk:data``, ``ddtk:optimizer``, ``ddtk:comm``).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CATEGORIES",
    "Event",
    "RankTrace",
    "TraceError",
    "category",
    "load_trace",
    "load_traces",
]

CATEGORIES = ("compute", "communication", "data", "optimizer", "idle")
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_COMM_PREFIXES = (
    "c10d::", "gloo:", "nccl:", "ncclKernel", "ncclDevKernel", "record_param_comms",
    "ddtk:comm",
)  # fmt: skip
_RANK_FILE = re.compile(r"rank[_-]?(\d+)")


class TraceError(ValueError):
    """A trace file that cannot be analysed; the message says which file and why."""


@dataclass(frozen=True)
class Event:
    """One complete event: start ``ts`` and duration ``dur`` in microseconds on the rank's clock."""

    name: str
    cat: str
    ts: float
    dur: float
    tid: Any
    args: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def end(self) -> float:
        return self.ts + self.dur


def category(event: Event) -> str | None:
    """``"data"``, ``"optimizer"``, ``"communication"``, ``"compute"`` or None (not work).

    None is for the step markers themselves and for events without a duration.
    """
    name = event.name
    if _STEP.match(name) or event.dur <= 0:
        return None
    if name.startswith(("enumerate(DataLoader)", "ddtk:data")):
        return "data"
    if name.startswith(("Optimizer.step", "Optimizer.zero_grad", "ddtk:optimizer")):
        return "optimizer"
    if name.startswith(_COMM_PREFIXES) or (event.cat == "kernel" and "nccl" in name.lower()):
        return "communication"
    return "compute"


@dataclass
class RankTrace:
    """The events of one rank's trace, on a clock shared by every rank of the host."""

    path: Path
    rank: int
    world_size: int | None
    backend: str | None
    events: list[Event]
    main_tid: Any
    steps: list[Event]

    @property
    def on_device(self) -> bool:
        """True when the trace holds GPU kernels (compute then comes from the device)."""
        return any(e.cat in DEVICE_CATS for e in self.events)

    def step_numbers(self) -> list[int]:
        """The ``N`` of every ``ProfilerStep#N`` the trace recorded, in order."""
        return [int(_STEP.match(s.name).group(1)) for s in self.steps]

    def thread(self, tid: Any) -> list[Event]:
        return [e for e in self.events if e.tid == tid]


def _read_json(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError, EOFError) as exc:
        raise TraceError(f"{path}: not a readable Chrome trace ({exc})") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: no 'traceEvents' list; is this a torch.profiler trace?")
    return data


def _rank_of(path: Path, info: dict) -> int:
    if isinstance(info.get("rank"), int):
        return info["rank"]
    m = _RANK_FILE.search(path.name)
    return int(m.group(1)) if m else 0


def load_trace(path: str | Path) -> RankTrace:
    """Read one trace (``.json`` or ``.json.gz``) and find its steps and training thread.

    Raises:
        TraceError: the file is not a trace, or it has no ``ProfilerStep#`` events
            (the loop never called ``prof.step()`` inside the active window).
    """
    path = Path(path)
    data = _read_json(path)
    base_us = float(data.get("baseTimeNanoseconds") or 0) / 1000.0
    events = [
        Event(str(e.get("name", "")), str(e.get("cat", "")), float(e["ts"]) + base_us,
              float(e.get("dur", 0.0)), e.get("tid"), e.get("args") or {})
        for e in data["traceEvents"]
        if e.get("ph") == "X" and "ts" in e
    ]  # fmt: skip
    events.sort(key=lambda e: (e.ts, -e.dur))
    steps = [e for e in events if _STEP.match(e.name) and e.cat != "gpu_user_annotation"]
    if not steps:
        raise TraceError(
            f"{path}: no ProfilerStep#N events. Call prof.step() once per training step "
            "inside the profiled window (ddtk.profiling.StepProfiler.step does)."
        )
    info = data.get("distributedInfo") or {}
    return RankTrace(
        path=path,
        rank=_rank_of(path, info),
        world_size=info.get("world_size"),
        backend=info.get("backend"),
        events=events,
        main_tid=steps[0].tid,
        steps=steps,
    )


def load_traces(folder: str | Path) -> list[RankTrace]:
    """Every ``*.json`` / ``*.json.gz`` trace in ``folder``, sorted by rank.

    Raises:
        TraceError: no trace in the folder, or two files claim the same rank.
    """
    folder = Path(folder)
    files = sorted(p for p in folder.glob("*.json*") if p.name.endswith((".json", ".json.gz")))
    if not folder.is_dir() or not files:
        raise TraceError(f"{folder}: no *.json traces there (StepProfiler writes rank<r>.json)")
    traces = sorted((load_trace(p) for p in files), key=lambda t: t.rank)
    ranks = [t.rank for t in traces]
    if len(set(ranks)) != len(ranks):
        raise TraceError(
            f"{folder}: two traces claim the same rank ({ranks}); keep one run per folder"
        )
    return traces
