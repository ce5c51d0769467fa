"""The process tree of a run: find torchrun's workers by rank, kill everything, leave nothing.

torchrun starts each worker in a session of its own, so killing the launcher's
process group does not reach them: :func:`kill_tree` snapshots every descendant
first, then SIGKILLs the launcher's group and each descendant, and reaps them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import psutil


def descendants(pid: int) -> list[psutil.Process]:
    """Every live descendant of ``pid`` (children, grandchildren, ...)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def worker_pid(launcher_pid: int, rank: int) -> int | None:
    """The pid of the worker process of global rank ``rank`` under a torchrun launcher.

    A worker is the top-most descendant whose environment has ``RANK=<rank>`` and
    ``LOCAL_RANK`` (processes it starts itself inherit both and are skipped).
    """
    found: dict[int, psutil.Process] = {}
    for proc in descendants(launcher_pid):
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if env.get("RANK") == str(rank) and "LOCAL_RANK" in env:
                found[proc.pid] = proc
    for pid, proc in found.items():
        with contextlib.suppress(psutil.Error):
            if proc.ppid() not in found:
                return pid
    return None


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` (started with ``start_new_session=True``), its group and every descendant."""
    tree = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(psutil.Error):
            child.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    psutil.wait_procs(tree, timeout=10)
