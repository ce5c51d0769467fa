"""Run one restored lab notebook the way a grader must: isolated, bounded, and cleaned up.

Each run gets

- a **fresh kernel** of this interpreter, started through
  :mod:`~ddtk.course.grading.limits` so it and every process it starts have an
  address-space limit (``memory_mb`` MiB per process; see that module for what it counts);
- a **fresh temporary folder** as working directory, holding only the notebook. The
  labs read nothing relative to their own folder (ddtk is imported from the installed
  package, deploy/ files are found through ``ddtk.__file__``) and write their hand-in to
  ``report_dir = "."``, that is here. ``TMPDIR`` points inside it too, so the scratch
  folders a lab makes with :mod:`tempfile` are removed with it;
- a **wall-clock limit** for the whole notebook, kernel start included: each cell may
  take what is left of it.

Cells run in order and a failing cell does not stop the run (every check cell must get
its turn). When the time is up, or the kernel dies, the run stops there. The hand-in
files the notebook wrote into its folder (``HANDIN``: ``labNN-report.md`` and ``.json``)
are kept with the result. Afterwards
every process of the run is killed: the kernel, its descendants, its session, and any
process carrying the run's marker in its environment (``DDTK_GRADE_RUN``, inherited
even by daemons that detach, such as Ray's), and the folder is deleted. It runs as the
grader's own user: it contains mistakes (hangs, crashes, memory blowups, stray
processes), it is not a jail for hostile code.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbformat import NotebookNode

MARKER = "DDTK_GRADE_RUN"
# What a lab hands in (its last cell writes them next to the notebook): kept from the run.
HANDIN = ("*-report.md", "*-report.json")
_HANDIN_MAX = 10 * 2**20  # bytes per file; a bigger one is left out, not read
_LIMITS = Path(__file__).with_name("limits.py")
_STARTUP_S = 60.0
# nbclient logs a time-out or a dead kernel as an error; the run's result says so instead.
_LOG = logging.getLogger("ddtk.course.grading.nbclient")
_LOG.addHandler(logging.NullHandler())
_LOG.propagate = False


@dataclass
class Execution:
    """How one run went.

    ``status`` is ``"completed"`` (every cell ran, failing or not), ``"timeout"``,
    ``"died"`` (the kernel process ended) or ``"no-kernel"`` (it never started);
    ``reason`` says so in one sentence. ``finished`` holds the indices of the cells
    that ran to the end; ``notebook`` carries their outputs.
    """

    notebook: NotebookNode
    status: str
    seconds: float
    reason: str | None = None
    finished: set[int] = field(default_factory=set)
    handin: dict[str, bytes] = field(default_factory=dict)  # files matching ``keep``


def _kernel_manager_class(memory_mb: int) -> type:
    """A kernel manager that starts its kernel through the limits wrapper."""
    from jupyter_client.manager import AsyncKernelManager

    class LimitedKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            cmd = super().format_kernel_cmd(extra_arguments)
            return [sys.executable, str(_LIMITS), str(memory_mb), "--", *cmd]

    return LimitedKernelManager


def _marked(token: str) -> list[Any]:
    """Every process (of this user) whose environment carries ``MARKER=token``."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid != os.getpid() and proc.environ().get(MARKER) == token:
                found.append(proc)
    return found


def _family(pid: int | None) -> list[Any]:
    """The process ``pid``, its descendants and the other members of its session."""
    import psutil

    if pid is None:
        return []
    procs = []
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid != os.getpid() and os.getsid(proc.pid) == pid:
                procs.append(proc)
    return procs


def kill_run(token: str, kernel_pid: int | None = None, grace: float = 5.0) -> int:
    """SIGKILL every process of one run and wait for them to go; return how many there were."""
    import psutil

    procs = {p.pid: p for p in [*_family(kernel_pid), *_marked(token)]}
    for proc in procs.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(list(procs.values()), timeout=grace)
    return len(procs)


def _collect(folder: Path, patterns: tuple[str, ...]) -> dict[str, bytes]:
    """The files directly in ``folder`` that match ``patterns`` (name -> bytes), up to a size."""
    found: dict[str, bytes] = {}
    for pattern in patterns:
        for path in sorted(folder.glob(pattern)):
            with contextlib.suppress(OSError):
                if path.is_file() and path.stat().st_size <= _HANDIN_MAX:
                    found[path.name] = path.read_bytes()
    return found


def _kernel_pid(client: Any) -> int | None:
    process = getattr(getattr(client.km, "provisioner", None), "process", None)
    return getattr(process, "pid", None)


def _exit_status(client: Any) -> str:
    process = getattr(getattr(client.km, "provisioner", None), "process", None)
    code = process.poll() if process is not None else None
    if code is None:
        return "it stopped answering"
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def _run_cells(client: Any, nb: NotebookNode, deadline: float, run: Execution) -> None:
    """Execute the code cells of ``nb`` in order until the end, the deadline or a dead kernel."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            run.status, run.reason = "timeout", f"time limit reached before cell[{index}]"
            return
        client.timeout = max(1, math.ceil(left))
        try:
            client.execute_cell(cell, index)
        except CellTimeoutError:
            run.status = "timeout"
            run.reason = f"cell[{index}] was still running when the time limit was reached"
            return
        except DeadKernelError:
            run.status = "died"
            run.reason = f"the kernel died while running cell[{index}] ({_exit_status(client)})"
            return
        run.finished.add(index)


def execute(
    nb: NotebookNode,
    *,
    name: str = "lab.ipynb",
    timeout: float = 900.0,
    memory_mb: int = 8192,
    kernel_name: str = "python3",
    keep: tuple[str, ...] = HANDIN,
) -> Execution:
    """Run a copy of ``nb`` in a sandbox (see the module docstring) and return how it went."""
    import copy

    import nbformat
    from nbclient import NotebookClient

    nb = copy.deepcopy(nb)
    token = secrets.token_hex(8)
    started = time.monotonic()
    deadline = started + timeout
    folder = Path(tempfile.mkdtemp(prefix="ddtk-grade-"))
    (folder / "tmp").mkdir()
    nbformat.write(nb, str(folder / name))
    env = {**os.environ, MARKER: token, "TMPDIR": str(folder / "tmp")}
    run = Execution(nb, "completed", 0.0)
    client = NotebookClient(
        nb, timeout=None, allow_errors=True, kernel_name=kernel_name,
        startup_timeout=math.ceil(min(_STARTUP_S, timeout)),
        kernel_manager_class=_kernel_manager_class(memory_mb),
        extra_arguments=["--IPKernelApp.log_level=CRITICAL"], log=_LOG,
        resources={"metadata": {"path": str(folder)}},
    )  # fmt: skip
    kernel_pid = None
    try:
        with (
            (folder / "kernel.log").open("w") as log,
            client.setup_kernel(cwd=str(folder), env=env, stdout=log, stderr=log),
        ):
            kernel_pid = _kernel_pid(client)
            try:
                _run_cells(client, nb, deadline, run)
            finally:
                # A hung kernel is still our unreaped child, so its id is safe to use;
                # a dead one's may be reused, so only the marker finds what it left.
                if run.status != "completed":
                    kill_run(token, kernel_pid if run.status == "timeout" else None)
    except Exception as exc:  # the kernel did not start, or could not be shut down
        if kernel_pid is None:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            run.status, run.reason = "no-kernel", f"the kernel did not start ({first[:160]})"
    finally:
        kill_run(token)  # whatever outlived the kernel's shutdown
        run.handin = _collect(folder, keep)
        shutil.rmtree(folder, ignore_errors=True)
    run.seconds = time.monotonic() - started
    return run


__all__ = ["HANDIN", "MARKER", "Execution", "execute", "kill_run"]
