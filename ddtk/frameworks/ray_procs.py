"""Ray's processes on this machine, read from the process table (lecture 02's plumbing).

Ray has no public API that maps a raylet to its operating-system process or lists the
worker processes a raylet started: ``ray.nodes()`` gives node ids and ports, and the state
API (``ray.util.state.list_workers``) needs the dashboard, which the lecture's laptop
cluster leaves out. So these helpers read what every Ray process shows on its command
line. That is a convention of Ray's launcher, not an API; ``tests/test_ray_procs.py``
pins the flags and process titles this module relies on, so an upgrade that changes them
fails a test instead of printing an empty table.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

import psutil

T = TypeVar("T")
STARTUP_TIMEOUT = "timed out during startup"  # Ray's message when a node misses its 30 s wait

# A substring of the command line -> what the process is to Ray. Order matters: the first
# match wins, and worker processes retitle themselves "ray::<task or actor>" once started.
ROLES: dict[str, str] = {
    "gcs_server": "GCS server",
    "raylet/raylet": "raylet",
    "ray::DashboardAgent": "dashboard agent",
    "ray::RuntimeEnvAgent": "runtime-env agent",
    "log_monitor.py": "log monitor",
    "autoscaler/_private/monitor.py": "autoscaler monitor",
    "dashboard/dashboard.py": "dashboard head",
    "ray::": "worker process",
    "default_worker.py": "worker process",
    "setup_worker.py": "worker process",
}
NODE_ID_FLAG = "--node_id="  # the raylet's flag naming the node it serves (ray._private.services)


def _cmdline(proc: psutil.Process) -> str | None:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:  # exited, or not ours to read
        return None


def ray_role(proc: psutil.Process) -> str | None:
    """What ``proc`` is to Ray (``"raylet"``, ``"worker process"``...), or None if not Ray's."""
    cmd = _cmdline(proc)
    if cmd is None:
        return None
    return next((role for key, role in ROLES.items() if key in cmd), None)


def ray_processes(root: psutil.Process) -> dict[str, list[psutil.Process]]:
    """Ray processes among ``root``'s descendants, grouped by role."""
    found: dict[str, list[psutil.Process]] = {}
    for proc in root.children(recursive=True):
        if (role := ray_role(proc)) is not None:
            found.setdefault(role, []).append(proc)
    return found


def raylet_node_id(proc: psutil.Process) -> str | None:
    """The node id a raylet process serves (hex, as ``ray.nodes()`` gives it), from its flags."""
    cmd = _cmdline(proc)
    if cmd is None:
        return None
    for arg in cmd.split():
        if arg.startswith(NODE_ID_FLAG):
            return arg[len(NODE_ID_FLAG) :]
    return None


def raylet_children(root: psutil.Process) -> dict[str, tuple[int, list[str]]]:
    """For each raylet under ``root``: node id -> (its pid, the sorted roles of its children)."""
    out = {}
    for raylet in ray_processes(root).get("raylet", []):
        node_id = raylet_node_id(raylet)
        if node_id is None:
            continue
        try:
            kids = sorted(filter(None, (ray_role(c) for c in raylet.children())))
        except psutil.Error:
            kids = []
        out[node_id] = (raylet.pid, kids)
    return out


def start_with_retry(
    start: Callable[[], T],
    attempts: int = 3,
    say: Callable[[str], object] = print,
) -> T:
    """``start()`` (a local Ray cluster or session), retried when a node misses Ray's startup wait.

    Ray waits a fixed 30 s for each raylet to register, which a loaded laptop can miss
    (on a 2-core machine running other jobs, two attempts in a row have).
    A failed attempt leaves behind what it had started (a GCS server, a raylet), and a
    retry would start a second set beside it. So after any failure this kills the
    processes under this one that the attempt started, then retries when the failure
    was that timeout and attempts are left, and raises otherwise.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    me = psutil.Process()
    for attempt in range(1, attempts + 1):
        before = {p.pid for p in me.children(recursive=True)}
        try:
            return start()
        except Exception as exc:  # Ray raises a bare Exception for the startup timeout
            new = [p for p in me.children(recursive=True) if p.pid not in before]
            for proc in new:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(new, timeout=10)
            if attempt == attempts or STARTUP_TIMEOUT not in str(exc):
                raise
            say(f"attempt {attempt}: {exc} Killed the {len(new)} processes it started; retrying.")
    raise AssertionError("unreachable")


def init_local(**kwargs: object) -> object:
    """``ray.init(address="local", **kwargs)``: a new local session, retried as by
    :func:`start_with_retry`; a failed attempt's half-started session is shut down first.

    ``address="local"`` always starts a session of its own, never attaching to a cluster
    that happens to run on this machine. Returns ``ray.init``'s ``RayContext``.
    """
    import ray

    def start() -> object:
        try:
            return ray.init(address="local", **kwargs)
        except Exception:
            ray.shutdown()  # forget the half-started session before the next attempt
            raise

    return start_with_retry(start)
