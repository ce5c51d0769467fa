"""Session-wide guard: no Ray cluster may outlive the test run, notebooks under nbval included.

Each notebook shuts down the Ray cluster it started, and the lab tests check that
themselves (tests/support.py). Notebooks that ``pytest --nbval-lax course`` runs
cell by cell have no test of their own after their last cell, so this hook checks
once at the end: a ``raylet`` or ``gcs_server`` started during the session and still
alive 30 s after the last test fails the run, and is killed.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))
from support import ray_daemons

_STARTED = time.time()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
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
