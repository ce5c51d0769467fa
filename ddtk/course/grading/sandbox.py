"""Run one restored lab notebook the way a grader must: confined, bounded, and cleaned up.

Each run gets

- a **fresh kernel** of this interpreter in a **jail** (:mod:`~ddtk.course.grading.jail`):
  its own namespaces (loopback-only network, its own process table, a private ``/tmp``),
  a read-only system with the grader's private paths (``hide``) hidden, and its own
  unprivileged user, as far as the machine allows. The kernel talks to the grader over
  Unix sockets in its folder (no TCP port another process could reach);
- **hard limits** (:class:`Limits`): set in the kernel by :mod:`~ddtk.course.grading.limits`
  (address space per process, tasks, file size, open files), and watched from outside:
  the resident memory of all the run's processes together, the bytes in its folder, and
  the output it sends (per cell and for the whole notebook). A run that goes over one is
  killed and says which limit it hit;
- a **fresh temporary folder** as working directory, holding only the notebook. The
  labs read nothing relative to their own folder (ddtk is imported from the installed
  package, deploy/ files are found through ``ddtk.__file__``) and write their hand-in to
  ``report_dir = "."``, that is here;
- a **wall-clock limit** for the whole notebook, kernel start included: each cell may
  take what is left of it.

Cells run in order and a failing cell does not stop the run (every check cell must get
its turn). When the time is up, a limit is hit, or the kernel dies, the run stops there.
The hand-in files the notebook wrote into its folder are kept with the result, and only
they: regular files (never a link) named as the lab's report (``labNN-report.md`` and
``.json``), each under ``HANDIN_MAX`` bytes. Afterwards every process of the run is
killed: in namespaces its PID namespace ends with its kernel; without them, the kernel,
its descendants, its session, every process of its uid, and any process carrying the
run's marker in its environment (``DDTK_GRADE_RUN``). Then the folder is deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddtk.course.grading.jail import Jail, kernel_env

if TYPE_CHECKING:
    from nbformat import NotebookNode

MARKER = "DDTK_GRADE_RUN"
HANDIN_MAX = 10 * 2**20  # bytes per hand-in file; a bigger one is left out, not read
_STARTUP_S = 60.0
_WATCH_S = 0.5  # how often the memory and disk of a run are measured
_MIB = 2**20
# nbclient logs a time-out or a dead kernel as an error; the run's result says so instead.
_LOG = logging.getLogger("ddtk.course.grading.nbclient")
_LOG.addHandler(logging.NullHandler())
_LOG.propagate = False


@dataclass(frozen=True)
class Limits:
    """What one graded run may use. ``0`` switches a limit off.

    ``memory_mb`` is the address space of each process (set in the kernel, hard);
    ``total_memory_mb`` the resident memory of all the run's processes together, and
    ``disk_mb`` the bytes in its folder, both watched from outside every half second;
    ``cell_output_mb`` and ``output_mb`` the output a cell and the notebook may send.
    """

    timeout: float = 900.0
    memory_mb: int = 8192
    total_memory_mb: int = 12288
    tasks: int = 4096
    file_mb: int = 0
    open_files: int = 4096
    disk_mb: int = 2048
    cell_output_mb: float = 4.0
    output_mb: float = 32.0

    def kernel_limits(self) -> dict[str, int]:
        """The limits the kernel sets on itself (:mod:`~ddtk.course.grading.limits` options)."""
        return {"memory_mb": self.memory_mb, "nproc": self.tasks, "fsize_mb": self.file_mb,
                "nofile": self.open_files}  # fmt: skip


@dataclass
class Execution:
    """How one run went.

    ``status`` is ``"completed"`` (every cell ran, failing or not), ``"timeout"``,
    ``"limit"`` (a resource limit was hit), ``"died"`` (the kernel process ended) or
    ``"no-kernel"`` (it never started); ``reason`` says so in one sentence. ``finished``
    holds the indices of the cells that ran to the end; ``notebook`` carries their outputs.
    """

    notebook: NotebookNode
    status: str
    seconds: float
    reason: str | None = None
    finished: set[int] = field(default_factory=set)
    handin: dict[str, bytes] = field(default_factory=dict)  # the lab's report files


class LimitExceeded(Exception):
    """A run went over one of its :class:`Limits`; the message names which."""


def handin_names(name: str) -> tuple[str, ...]:
    """The hand-in files of the lab notebook ``name``: ``lab03-fault.ipynb`` -> lab03-report.*"""
    stem = Path(name).stem.split("-")[0]
    return (f"{stem}-report.md", f"{stem}-report.json")


def _kernel_manager_class(jail: Jail, limits: Limits, namespaces: bool) -> type:
    """A kernel manager that starts its kernel in ``jail``; over Unix sockets in namespaces."""
    from jupyter_client.manager import AsyncKernelManager

    class JailedKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            cmd = super().format_kernel_cmd(extra_arguments)
            return jail.wrap(
                cmd, limits.kernel_limits(), chown=[self.connection_file], tmp_mb=limits.disk_mb
            )

    if namespaces:
        JailedKernelManager.transport = "ipc"  # type: ignore[assignment]
    return JailedKernelManager


def _client_class() -> type:
    """An nbclient that counts the output a cell and the notebook send, and stops at a cap."""
    from nbclient import NotebookClient

    class CappedClient(NotebookClient):
        cell_cap = 0
        total_cap = 0
        sent_total = 0
        sent_cell: dict[int, int] = {}  # noqa: RUF012 (set per instance in execute)

        def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
            if msg.get("msg_type") in ("stream", "display_data", "execute_result", "error",
                                       "update_display_data"):  # fmt: skip
                size = len(json.dumps(msg.get("content", {}), default=str))
                self.sent_total += size
                self.sent_cell[cell_index] = self.sent_cell.get(cell_index, 0) + size
                if self.cell_cap and self.sent_cell[cell_index] > self.cell_cap:
                    raise LimitExceeded(
                        f"cell[{cell_index}] sent more than {self.cell_cap / _MIB:g} MiB of output"
                    )
                if self.total_cap and self.sent_total > self.total_cap:
                    raise LimitExceeded(
                        f"the notebook sent more than {self.total_cap / _MIB:g} MiB of output"
                    )
            return super().process_message(msg, cell, cell_index)

        async def _async_poll_kernel_alive(self) -> None:
            # nbclient leaves this task running when a cell is stopped by an exception (a
            # limit, a time-out); once the kernel client is gone it fails an assertion, and
            # the unretrieved error is logged whenever the task is collected, from inside
            # whatever runs then (an ast.parse, which 3.11 cannot take).
            with contextlib.suppress(AssertionError):
                await super()._async_poll_kernel_alive()

    return CappedClient


def _marked(token: str) -> list[Any]:
    """Every process whose environment carries ``MARKER=token``."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid != os.getpid() and proc.environ().get(MARKER) == token:
                found.append(proc)
    return found


def _of_uid(uid: int | None) -> list[Any]:
    """Every process running as ``uid`` (a run's own uid holds only that run)."""
    import psutil

    if uid is None:
        return []
    found = []
    for proc in psutil.process_iter(["uids"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.info["uids"] and uid in (proc.info["uids"].real, proc.info["uids"].effective):
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


def _members(token: str, kernel_pid: int | None, uid: int | None) -> dict[int, Any]:
    return {p.pid: p for p in [*_family(kernel_pid), *_marked(token), *_of_uid(uid)]}


def kill_run(
    token: str, kernel_pid: int | None = None, grace: float = 5.0, uid: int | None = None
) -> int:
    """SIGKILL every process of one run and wait for them to go; return how many there were."""
    import psutil

    procs = _members(token, kernel_pid, uid)
    for proc in procs.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(list(procs.values()), timeout=grace)
    return len(procs)


def _folder_bytes(folder: Path) -> int:
    """Bytes of disk the files under ``folder`` take (links not followed)."""
    total = 0
    for root, dirs, files in os.walk(folder):
        for name in files + dirs:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


class _Watchdog(threading.Thread):
    """Measures a run from outside (all its processes' memory, its folder's size); kills it
    when one goes over its limit and remembers which."""

    def __init__(self, limits: Limits, folder: Path, token: str, uid: int | None) -> None:
        super().__init__(daemon=True, name="ddtk-grade-watchdog")
        self.limits, self.folder, self.token, self.uid = limits, folder, token, uid
        self.kernel_pid: int | None = None
        self.reason: str | None = None
        self.stopped = threading.Event()

    def _over(self) -> str | None:
        import psutil

        if self.limits.total_memory_mb:
            rss = 0
            for proc in _members(self.token, self.kernel_pid, self.uid).values():
                with contextlib.suppress(psutil.Error):
                    rss += proc.memory_info().rss
            if rss > self.limits.total_memory_mb * _MIB:
                return (
                    f"the run's processes used {rss / _MIB:.0f} MiB of memory together, over the "
                    f"limit of {self.limits.total_memory_mb} MiB"
                )
        if self.limits.disk_mb:
            used = _folder_bytes(self.folder)
            if used > self.limits.disk_mb * _MIB:
                return f"the run wrote {used / _MIB:.0f} MiB, over the disk limit of {self.limits.disk_mb} MiB"
        return None

    def run(self) -> None:
        while not self.stopped.wait(_WATCH_S):
            reason = self._over()
            if reason is not None:
                self.reason = reason
                kill_run(self.token, self.kernel_pid, uid=self.uid)
                return


def _read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not a link) of at most ``limit`` bytes."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def _collect(folder: Path, names: Iterable[str]) -> dict[str, bytes]:
    """The hand-in files ``names`` directly in ``folder``: regular files under the size cap."""
    found = {}
    for name in names:
        data = _read_regular(folder / name, HANDIN_MAX)
        if data is not None:
            found[name] = data
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


def _run_cells(
    client: Any, nb: NotebookNode, deadline: float, run: Execution, dog: _Watchdog
) -> None:
    """Execute the code cells of ``nb`` in order until the end, the deadline, a limit or a dead kernel."""
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
        except LimitExceeded as exc:
            cell.outputs = cell.outputs[:20]
            run.status, run.reason = "limit", f"{exc}; the run was stopped"
            return
        except CellTimeoutError:
            run.status = "timeout"
            run.reason = f"cell[{index}] was still running when the time limit was reached"
            return
        except DeadKernelError:
            if dog.reason is not None:
                run.status, run.reason = (
                    "limit",
                    f"{dog.reason} in cell[{index}]; the run was stopped",
                )
            else:
                run.status = "died"
                run.reason = f"the kernel died while running cell[{index}] ({_exit_status(client)})"
            return
        run.finished.add(index)
    if dog.reason is not None:
        run.status, run.reason = "limit", f"{dog.reason}; the run was stopped"


def _run_folder(namespaces: bool) -> Path:
    """A fresh folder for one run; in namespaces, short enough for its Unix sockets' paths."""
    outer = Path(tempfile.mkdtemp(prefix="ddtk-grade-"))
    if namespaces and len(str(outer)) > 60:  # sun_path holds 107 bytes
        shutil.rmtree(outer)
        outer = Path(tempfile.mkdtemp(prefix="ddtk-grade-", dir="/tmp"))
    work = outer / secrets.token_hex(4)
    work.mkdir()
    return work


def execute(
    nb: NotebookNode,
    *,
    name: str = "lab.ipynb",
    timeout: float = 900.0,
    memory_mb: int = 8192,
    kernel_name: str = "python3",
    keep: tuple[str, ...] | None = None,
    hide: Iterable[Path] = (),
    limits: Limits | None = None,
) -> Execution:
    """Run a copy of ``nb`` confined and bounded (module docstring); return how it went.

    ``keep`` names the hand-in files to bring back (default: the lab's report files);
    ``hide`` the grader's private paths the kernel must not see; ``limits`` everything it
    may use (``timeout`` and ``memory_mb`` override its first two).
    """
    import copy
    import dataclasses

    import nbformat
    from traitlets.config import Config

    from ddtk.course.grading.jail import confinement

    limits = dataclasses.replace(limits or Limits(), timeout=timeout, memory_mb=memory_mb)
    conf = confinement()
    nb = copy.deepcopy(nb)
    token = secrets.token_hex(8)
    started = time.monotonic()
    deadline = started + limits.timeout
    folder = _run_folder(conf.namespaces)
    jail = Jail(folder, hide, conf)
    uid = jail.uid if conf.own_user else None
    nbformat.write(nb, str(folder / name))
    if not conf.namespaces:
        (folder / "tmp").mkdir()
    env = kernel_env(os.environ, folder, {MARKER: token, "TMPDIR": str(jail.tmp)})
    run = Execution(nb, "completed", 0.0)
    config = Config()
    if conf.namespaces:
        config.KernelManager.ip = str(folder / "k")
    config.KernelManager.connection_file = str(folder / "kernel.json")
    client = _client_class()(
        nb, timeout=None, allow_errors=True, kernel_name=kernel_name, config=config,
        startup_timeout=math.ceil(min(_STARTUP_S, limits.timeout)),
        kernel_manager_class=_kernel_manager_class(jail, limits, conf.namespaces),
        extra_arguments=["--IPKernelApp.log_level=CRITICAL"], log=_LOG,
        resources={"metadata": {"path": str(folder)}},
    )  # fmt: skip
    client.cell_cap = int(limits.cell_output_mb * _MIB)
    client.total_cap = int(limits.output_mb * _MIB)
    client.sent_cell = {}
    dog = _Watchdog(limits, folder, token, uid)
    kernel_pid = None
    log_path = folder.parent / "kernel.log"  # outside the kernel's reach
    try:
        with (
            log_path.open("w") as log,
            client.setup_kernel(cwd=str(folder), env=env, stdout=log, stderr=log),
        ):
            kernel_pid = dog.kernel_pid = _kernel_pid(client)
            dog.start()
            try:
                _run_cells(client, nb, deadline, run, dog)
            finally:
                dog.stopped.set()
                # A hung kernel is still our unreaped child, so its id is safe to use;
                # a dead one's may be reused, so only the marker and the uid find what it left.
                if run.status != "completed":
                    kill_run(
                        token, kernel_pid if run.status in ("timeout", "limit") else None, uid=uid
                    )
    except Exception as exc:  # the kernel did not start, or could not be shut down
        if kernel_pid is None:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            run.status, run.reason = "no-kernel", f"the kernel did not start ({first[:160]})"
    finally:
        dog.stopped.set()
        kill_run(token, uid=uid)  # whatever outlived the kernel's shutdown
        run.handin = _collect(folder, handin_names(name) if keep is None else keep)
        shutil.rmtree(folder.parent, ignore_errors=True)
    run.seconds = time.monotonic() - started
    return run


__all__ = ["HANDIN_MAX", "MARKER", "Execution", "LimitExceeded", "Limits", "execute",
           "handin_names", "kill_run"]  # fmt: skip
