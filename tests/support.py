"""Helpers shared by test modules (importable by name: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import psutil
import pytest


def require_or_skip(name: str, reason: str) -> None:
    """Skip for ``reason``, unless DDTK_REQUIRE (comma-separated) names ``name``: then fail.

    ``make test`` sets DDTK_REQUIRE=horovod so CI can never pass by skipping them.
    """
    required = {s.strip() for s in os.environ.get("DDTK_REQUIRE", "").split(",") if s.strip()}
    if name in required:
        pytest.fail(
            f"{name} is required here (DDTK_REQUIRE={os.environ['DDTK_REQUIRE']}) but {reason}"
        )
    pytest.skip(reason)


def default_sigint() -> None:
    """``preexec_fn`` for a child that a test interrupts: SIGINT back to its default action.

    A test run started with SIGINT ignored (nohup, ``cmd &`` in a script) passes SIG_IGN
    through exec, and Python then installs no KeyboardInterrupt handler in the child;
    with SIG_DFL at exec, Python installs it, so the child reacts to Ctrl-C as in a terminal.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def import_or_require(module: str, name: str) -> ModuleType:
    """Import ``module``; if it cannot be imported, skip, or fail when DDTK_REQUIRE names ``name``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        require_or_skip(name, f"{module} is not importable ({exc})")
        raise  # not reached: require_or_skip raises


def executed_text(notebook: str | os.PathLike[str]) -> str:
    """Every text output (streams and ``text/plain`` results) of an executed notebook, joined."""
    executed = json.loads(Path(notebook).read_text())
    return "".join(
        "".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
        for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
    )  # fmt: skip


def outliving(procs: list[psutil.Process], grace: float = 5.0) -> list[psutil.Process]:
    """The processes of ``procs`` still running ``grace`` seconds from now.

    A helper that exits by itself just after its parent (Python's multiprocessing
    resource tracker closing down with the worker that started it) is not left
    behind; one still running after the grace period is.
    """
    _gone, alive = psutil.wait_procs(procs, timeout=grace)
    running = []
    for proc in alive:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                running.append(proc)
        except psutil.NoSuchProcess:
            continue
    return running


RAY_DAEMONS = ("raylet", "gcs_server")


def _ours(proc: psutil.Process, mine: set[int]) -> bool:
    """A descendant of this process, or an orphan (its parent gone, so adopted by init)."""
    return proc.pid in mine or proc.ppid() == 1


def ray_daemons(since: float) -> list[psutil.Process]:
    """Live ``raylet`` and ``gcs_server`` processes of this test run, started since ``since``.

    Counts this process's descendants and orphans: a notebook kernel that dies or is
    killed leaves its Ray cluster to init, where a child scan would not see it. A Ray
    cluster that another program on the machine runs (its parent alive) is not ours.
    """
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    found = []
    for proc in psutil.process_iter(["name", "create_time"]):
        try:
            if (
                proc.info["name"] in RAY_DAEMONS
                and proc.info["create_time"] >= since - 1.0
                and proc.status() != psutil.STATUS_ZOMBIE
                and _ours(proc, mine)
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_none_left(find: Callable[[float], list], since: float, grace: float, what: str) -> None:
    """Fail, and kill them, if the processes ``find(since)`` returns outlive ``grace`` seconds."""
    import time

    deadline = time.monotonic() + grace
    left = find(since)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = find(since)
    if left:
        names = ", ".join(
            f"{p.pid} ({' '.join((p.info.get('cmdline') or [p.info.get('name') or '?'])[:4])})"
            for p in left
        )
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        pytest.fail(f"{what} processes left running: {names}")


def assert_no_ray_daemons_left(since: float, grace: float = 30.0) -> None:
    """Fail, and kill them, if raylets or GCS servers started since ``since`` outlive ``grace``."""
    assert_none_left(ray_daemons, since, grace, "Ray")


def machine_state(sample_s: float = 0.5) -> str:
    """What else this machine is doing, for the message of a failed timing check.

    The load average, this process's scheduling (CPUs it may use, nice, threads, live
    children) and the processes that used the most CPU over ``sample_s`` seconds: a
    timing that fails only beside other tests names its neighbour here.
    """
    import time

    me = psutil.Process()
    procs = list(psutil.process_iter(["name", "cmdline"]))
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.cpu_percent(None)
    time.sleep(sample_s)
    busy = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            busy.append(
                (
                    proc.cpu_percent(None),
                    proc.pid,
                    " ".join((proc.info["cmdline"] or [proc.info["name"] or "?"])[:3])[:80],
                )
            )
    top = ", ".join(f"{pid} {cmd!r} {cpu:.0f}%" for cpu, pid, cmd in sorted(busy, reverse=True)[:5])
    children = [c for c in me.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    return (
        f"load {os.getloadavg()}; this process: CPUs {sorted(os.sched_getaffinity(0))}, "
        f"nice {os.nice(0)}, {me.num_threads()} threads, {len(children)} live children; "
        f"busiest over {sample_s} s: {top}"
    )


def nothing_listens_on(port: int, host: str = "127.0.0.1") -> bool:
    """True when no socket is bound to ``port`` and it could be bound now (a connection left
    in TIME_WAIT by a closed client does not count: SO_REUSEADDR lets the bind through)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
