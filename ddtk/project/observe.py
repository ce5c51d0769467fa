"""What the checker sees of a run itself: optimizer steps on its own clock, bytes on the wire.

Every number a submission writes into its metrics is its own claim. The checker
therefore watches each run from outside the program's reports:

- **steps, timed by the checker**: the probe (``ddtk/project/probe/sitecustomize.py``,
  first on the ranks' ``PYTHONPATH``) appends a line per optimizer step; :class:`Probe`
  reads the new lines at every poll of the run (50 ms) and stamps each with the
  checker's clock. The lines of one process are one *attempt* of that rank (a restart
  under torchrun is a new process).
- **what each rank holds**: the bytes of the parameters its optimizer updates and of
  the optimizer's state, and a digest of those parameters after the last step.
- **traffic between the ranks**: the bytes each rank hands to communication (counted
  by the probe in ``torch.distributed``'s calls and ddtk's transports, shared memory
  included), and, when the run has its own network namespace, the kernel's counter of
  bytes sent over loopback in that namespace (``/proc/PID/net/dev``), which no code in
  the run can change and which also sees what bypasses Python (DDP's C++ reducer).

A program that trains nothing, trains alone, or restarts from scratch shows it here,
whatever it writes into its metrics.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

PROBE_PATH = Path(__file__).with_name("probe")
MAX_PROBE_BYTES = 64 * 2**20  # a probe file past this is not read further


@dataclass
class Attempt:
    """One process of one rank: its optimizer steps as the checker saw them arrive."""

    rank: int
    pid: int
    counts: dict[int, int] = field(default_factory=dict)  # steps, by optimizer
    first_s: float | None = None  # the checker's clock when the first step arrived
    last_s: float | None = None
    param_bytes: dict[int, int] = field(default_factory=dict)  # by optimizer
    state_bytes: dict[int, int] = field(default_factory=dict)
    digests: dict[int, str] = field(default_factory=dict)
    sent_bytes: int = 0  # bytes handed to communication (Python calls, ddtk transports)

    @property
    def steps(self) -> int:
        """Optimizer steps of this attempt (of its most-stepped optimizer)."""
        return max(self.counts.values(), default=0)

    @property
    def digest(self) -> str:
        """The parameters of every optimizer after its last step, in one string."""
        return "/".join(self.digests[k] for k in sorted(self.digests))

    @property
    def held_param_bytes(self) -> int:
        return sum(self.param_bytes.values())

    @property
    def held_state_bytes(self) -> int:
        return sum(self.state_bytes.values())


def _event(line: str) -> dict | None:
    """One probe line, or None when it is not one the probe writes."""
    try:
        e = json.loads(line)
    except ValueError:
        return None
    ints = ("rank", "pid", "optimizer", "step", "param_bytes", "state_bytes")
    if not isinstance(e, dict) or not all(
        isinstance(e.get(k), int) and not isinstance(e.get(k), bool) for k in ints
    ):
        return None
    return e if isinstance(e.get("digest"), str) else None


class Probe:
    """Reads the probe's files of one run as they grow, stamping lines with this clock."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.attempts: dict[tuple[int, int], Attempt] = {}
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, str] = {}
        self.lo_bytes: int | None = None  # loopback bytes sent in the run's namespace

    def poll(self) -> None:
        """Read what was appended since the last poll; stamp it now."""
        now = time.monotonic()
        for path in sorted(self.folder.glob("rank-*.jsonl")):
            with contextlib.suppress(OSError):
                self._read(path, now)

    def _read(self, path: Path, now: float) -> None:
        offset = self._offsets.get(path, 0)
        if offset >= MAX_PROBE_BYTES or path.is_symlink():
            return
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read(MAX_PROBE_BYTES - offset)
        self._offsets[path] = offset + len(chunk)
        text = self._partial.pop(path, "") + chunk.decode("utf-8", "replace")
        *lines, rest = text.split("\n")
        if rest:
            self._partial[path] = rest
        for line in lines:
            e = _event(line)
            if e is not None:
                self._add(e, now)

    def _add(self, e: dict, now: float) -> None:
        a = self.attempts.setdefault((e["rank"], e["pid"]), Attempt(e["rank"], e["pid"]))
        k = e["optimizer"]
        a.counts[k] = max(a.counts.get(k, 0), e["step"])
        if a.first_s is None:
            a.first_s = now
        a.last_s = now
        a.param_bytes[k], a.state_bytes[k], a.digests[k] = (
            e["param_bytes"], e["state_bytes"], e["digest"])  # fmt: skip
        sent = e.get("sent_bytes")
        if isinstance(sent, int) and not isinstance(sent, bool):
            a.sent_bytes = max(a.sent_bytes, sent)

    def watch_network(self, pid: int) -> bool:
        """Note the loopback bytes sent in the network namespace of process ``pid``;
        False when that process is gone."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
                name, _, counters = line.partition(":")
                if name.strip() == "lo":
                    sent = int(counters.split()[8])
                    self.lo_bytes = max(self.lo_bytes or 0, sent)
                    return True
        return False

    def by_rank(self) -> dict[int, list[Attempt]]:
        """Each rank's attempts, in the order their first step arrived."""
        out: dict[int, list[Attempt]] = {}
        for a in sorted(self.attempts.values(), key=lambda a: (a.first_s or 0.0, a.pid)):
            out.setdefault(a.rank, []).append(a)
        return out

    def final(self) -> dict[int, Attempt]:
        """Each rank's last attempt."""
        return {rank: tries[-1] for rank, tries in self.by_rank().items()}


def samples_per_s(attempt: Attempt, global_batch: int) -> float | None:
    """Global samples per second over ``attempt``'s steps after its first (a warm-up),
    timed by the checker's clock; None when there are too few steps to time."""
    if attempt.steps < 3 or attempt.first_s is None or attempt.last_s is None:
        return None
    elapsed = attempt.last_s - attempt.first_s
    return (attempt.steps - 1) * global_batch / elapsed if elapsed > 0 else None


__all__ = ["PROBE_PATH", "Attempt", "Probe", "samples_per_s"]
