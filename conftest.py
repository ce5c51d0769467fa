"""Session-wide hooks: no Ray cluster may outlive the test run, and the run's timings are kept.

Each notebook shuts down the Ray cluster it started, and the lab tests check that
themselves (tests/support.py). Notebooks that ``pytest --nbval-lax course`` runs
cell by cell have no test of their own after their last cell, so this hook checks
once at the end: a ``raylet`` or ``gcs_server`` started during the session and still
alive 30 s after the last test fails the run, and is killed.

Each notebook nbval runs is also kept as executed, outputs and all, in
``build/executed/notebooks/`` (:mod:`ddtk.course.executed`): the course site is built
from those, so no notebook runs twice.

Every run also writes ``build/test-times.json``: the suite's wall-clock total, the
outcome counts and the 25 slowest tests (setup, call and teardown together), so that a
slower suite shows in the next comparison (``DDTK_TEST_TIMES`` names another file).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))
from support import ray_daemons

_STARTED = time.time()
_ROOT = Path(__file__).resolve().parent
_SLOWEST = 25
_durations: defaultdict[str, float] = defaultdict(float)
_outcomes: dict[str, str] = {}
_spans: dict[str, list] = {}  # test -> [worker, first start, last stop] (epoch seconds)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up each test's phases; count each test once: failed, else skipped, else passed."""
    _durations[report.nodeid] += report.duration
    worker = getattr(getattr(report, "node", None), "gateway", None)
    span = _spans.setdefault(report.nodeid, [getattr(worker, "id", "main"), report.start, 0.0])
    span[1], span[2] = min(span[1], report.start), max(span[2], report.stop)
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped and _outcomes.get(report.nodeid) != "failed":
        _outcomes[report.nodeid] = "skipped"
    elif report.when == "call":
        _outcomes.setdefault(report.nodeid, "passed")


_capture: Any = None  # ddtk.course.executed.Capture, made at the first notebook cell


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Keep each nbval cell's outputs; the notebook is written when its last cell has run."""
    yield
    notebook = getattr(getattr(item, "parent", None), "nb", None)
    if call.when != "call" or notebook is None or not hasattr(item, "cell_num"):
        return
    global _capture
    if _capture is None:
        from ddtk.course.executed import Capture

        _capture = Capture(_ROOT)
    outputs = getattr(item, "test_outputs", None)
    _capture.add(Path(str(item.path)), notebook, item.cell_num, outputs, call.duration)


def write_test_times(path: Path, total_s: float, exitstatus: int) -> dict:
    """Write the timing report of this run to ``path`` and return it."""
    counts = Counter(_outcomes.values())
    slowest = sorted(_durations.items(), key=lambda kv: kv[1], reverse=True)[:_SLOWEST]
    report = {
        "total_s": round(total_s, 1),
        "exit_status": int(exitstatus),
        "tests": len(_durations),
        "outcomes": dict(sorted(counts.items())),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
        },
        "slowest": [{"test": t, "seconds": round(s, 1)} for t, s in slowest],
        "workers": _by_worker(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    return report


def _by_worker() -> dict:
    """Each worker's busy seconds and its groups in the order it ran them (tests/scheduling.py).

    A group's ``start`` and ``end`` are seconds since the session began; ``seconds`` adds
    up its tests' phases.

    With ``-n 2`` the longest worker is the suite's wall clock: this shows which groups
    made it so.
    """
    from scheduling import group_of

    workers: dict[str, dict] = {}
    for test, (worker, start, stop) in sorted(_spans.items(), key=lambda kv: kv[1][1]):
        entry = workers.setdefault(worker, {"busy_s": 0.0, "groups": []})
        entry["busy_s"] += _durations[test]
        group = group_of(test)
        if not entry["groups"] or entry["groups"][-1]["group"] != group:
            entry["groups"].append({"group": group, "start": start, "end": stop, "seconds": 0.0})
        entry["groups"][-1]["seconds"] += _durations[test]
        entry["groups"][-1]["end"] = max(entry["groups"][-1]["end"], stop)
    for entry in workers.values():
        entry["busy_s"] = round(entry["busy_s"], 1)
        for g in entry["groups"]:
            g["start"], g["end"] = round(g["start"] - _STARTED, 1), round(g["end"] - _STARTED, 1)
            g["seconds"] = round(g["seconds"], 1)
    return workers


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Workers take whole groups of tests: see tests/scheduling.py."""
    from scheduling import scheduler

    return scheduler(config, log)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller reports and checks once, after all of them
    target = Path(os.environ.get("DDTK_TEST_TIMES") or _ROOT / "build" / "test-times.json")
    write_test_times(target, time.time() - _STARTED, exitstatus)
    deadline = time.monotonic() + 30.0
    left = ray_daemons(_STARTED)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = ray_daemons(_STARTED)
    if not left:
        return
    names = ", ".join(f"{p.pid} ({p.info['name']})" for p in left)
    for proc in left:
        with contextlib.suppress(Exception):
            proc.kill()
    print(f"\nERROR: Ray processes left running after the test session: {names}", file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
