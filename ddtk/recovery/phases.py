"""When each recovery phase happened, read from what the launchers log.

No public API reports *when* a launcher noticed a failure: torchrun's agent and
Horovod's driver only log it, and Ray Train's controller logs its failure-policy
decision and the start of the new worker group to JSON lines in the session's
``logs/train/ray-train-sys-controller-*.log`` (``ray.train.Result`` holds the
outcome and checkpoints, not these times; ``ray.util.state`` has actor lifetimes
but needs the dashboard, which the lecture does not start). So these functions parse
log text. The formats are pinned by ``tests/test_recovery_phases.py`` against the
installed torch and Ray sources, so an upgrade that changes them fails a test
instead of silently giving zeros. The Ray session directory comes from the public
``ray.init(...).address_info["session_dir"]``, not from ``ray._private``.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = [
    "RAY_CONTROLLER_LOG_GLOB",
    "RAY_RETRY_PREFIX",
    "RAY_STARTED_PREFIX",
    "horovod_error_time",
    "ray_controller_events",
    "ray_phases",
    "torchrun_failure_time",
]

# torch/distributed/elastic/multiprocessing/api.py logs "failed (exitcode: -9) local_rank: ..."
# through torch's glog-style formatter: "E1127 13:56:38.985000 8858 torch/...:1002] failed ..."
_TORCHRUN_FAILED = re.compile(r"^E(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*failed \(exitcode: -9\)", re.M)
# Horovod's C++ logger: "[2026-11-27 13:56:38.985: E /path/to/file.cc:123] message"
_HOROVOD_ERROR = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+): E ")
RAY_CONTROLLER_LOG_GLOB = "ray-train-sys-controller-*.log"
RAY_RETRY_PREFIX = "[FailurePolicy] RETRY"
RAY_STARTED_PREFIX = "Started training worker group"
_RAY_ASCTIME = "%Y-%m-%d %H:%M:%S,%f"


def _stamp(text: str, fmt: str) -> float:
    """Seconds since the epoch of a local-time log stamp (launchers log local time)."""
    return datetime.strptime(text, fmt).timestamp()


def torchrun_failure_time(output: str, year: int | None = None) -> float | None:
    """When torchrun's agent logged a worker killed by SIGKILL (its glog line has no year).

    >>> t = torchrun_failure_time("E1127 13:56:38.985000 88 torch/x.py:1] failed (exitcode: -9) local_rank: 1", 2026)
    >>> time.strftime("%m-%d %H:%M:%S", time.localtime(t))
    '11-27 13:56:38'
    """
    m = _TORCHRUN_FAILED.search(output)
    if m is None:
        return None
    year = year or time.localtime().tm_year
    return _stamp(f"{year}{m[1]} {m[2]}", "%Y%m%d %H:%M:%S.%f")


def horovod_error_time(output: str) -> float | None:
    """When a Horovod worker first logged an error (a survivor's broken connection).

    >>> horovod_error_time("no errors") is None
    True
    """
    m = _HOROVOD_ERROR.search(output)
    return None if m is None else _stamp(m[1], "%Y-%m-%d %H:%M:%S.%f")


def ray_controller_events(
    session_dir: str | os.PathLike[str], after: float
) -> dict[str, float | None]:
    """First RETRY decision and first worker-group start logged by the Ray Train controller after ``after``."""
    events: dict[str, float | None] = {"retry": None, "started": None}
    for log in (Path(session_dir) / "logs" / "train").glob(RAY_CONTROLLER_LOG_GLOB):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            t = _stamp(record["asctime"], _RAY_ASCTIME)
            if t < after:
                continue
            message = record["message"]
            if message.startswith(RAY_RETRY_PREFIX) and (
                events["retry"] is None or t < events["retry"]
            ):
                events["retry"] = t
            if message.startswith(RAY_STARTED_PREFIX) and (
                events["started"] is None or t < events["started"]
            ):
                events["started"] = t
    return events


def ray_phases(
    session_dir: str | os.PathLike[str] | None, work: str | os.PathLike[str]
) -> dict[str, Any]:
    """Detection, restart, reload and first step of a :mod:`ddtk.recovery.ray_train` run.

    ``work`` is the run's work directory (``crash.json``, ``resume.json``, ``starts.log``).
    Without the controller's log (no ``session_dir``, or the format changed), detection
    and restart are reported together as restart, and ``from_controller_log`` is False.
    """
    work = Path(work)
    crash = json.loads((work / "crash.json").read_text())["time"]
    resume = json.loads((work / "resume.json").read_text())["time"]
    group_up = [json.loads(line) for line in (work / "starts.log").read_text().splitlines()][-1][
        "time"
    ]
    events = {"retry": None, "started": None}
    if session_dir is not None:
        events = ray_controller_events(session_dir, crash)
    if events["retry"] and events["started"]:
        phases = {"detection": events["retry"] - crash, "restart": events["started"] - events["retry"],
                  "reload": group_up - events["started"]}  # fmt: skip
    else:
        phases = {"detection": 0.0, "restart": group_up - crash, "reload": 0.0}
    return dict(phases, **{"first step": resume - group_up, "total": resume - crash,
                           "from_controller_log": bool(events["retry"] and events["started"])})  # fmt: skip
