"""Targets for a preemption notice, run by ``NoticeTarget`` in a fresh interpreter.

A module of their own, with nothing heavy imported: the child process imports it to
unpickle the function, and starts in a fraction of a second instead of the seconds
that importing torch (through ``ddtk``) costs.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def commit_on_notice(folder: str) -> None:
    """A flag-only SIGUSR1 handler, then a commit (a rename) once the flag is set."""
    notice: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, _frame: notice.append(signum))
    while not notice:
        time.sleep(0.005)
    (Path(folder) / "commit.tmp").write_text("state")
    os.replace(Path(folder) / "commit.tmp", Path(folder) / "commit")


def no_handler(_folder: str) -> None:
    """No handler: SIGTERM's default action ends the process."""
    time.sleep(60)
