"""The judge's side: learner code in worker processes, answers read back as data only.

A :class:`Worker` is one confined process (:mod:`~ddtk.course.grading.jail`) running
:mod:`~ddtk.course.judging.worker`: the judge sends it notebook cells to run and
probes to call, and reads back what they produced, with ``torch.load(weights_only=True)``
(tensors, numbers, strings, lists, tuples, dicts). The verdict is computed here, in a
process that never runs learner code, from data the judge checks itself: a worker can
lie, but only with data, and data that passes is an answer.

A check that needs two processes (capture in one, restore in another) starts two
workers; a worker's folder is its own, and it is deleted with the worker.

:class:`LocalWorker` gives a notebook's own check cell the same interface over the
kernel's namespace, so a learner sees exactly the verdict the grader will give (minus
the isolation, which only a grader needs).
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import pickle
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ddtk.course.judging.worker import _HEADER

ANSWER_MAX = 256 * 2**20  # bytes of one answer; a bigger one is an error, not read


class LearnerError(Exception):
    """The learner's code raised (or the worker broke) while the judge asked something."""


class StillStub(LearnerError):
    """The learner's code still raises the stub's NotImplementedError; the message is its text."""


class WorkerEnded(LearnerError):
    """A forked worker ended (its zygote said so) instead of answering."""


class WorkerBroke(LearnerError):
    """No answer came (time out, the process ended, the pipe closed) or it was not data."""


def _decode(data: bytes) -> Any:
    import torch

    try:
        answer = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:
        raise WorkerBroke(
            f"the worker's answer could not be read as data ({type(exc).__name__})"
        ) from None
    if not isinstance(answer, dict) or answer.get("status") not in ("ok", "error", "stub", "ended"):
        raise WorkerBroke("the worker's answer is not one the judge sent for")
    if answer["status"] == "ended":  # a zygote's word that its forked worker ended
        code = int(answer.get("value", 0))
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        raise WorkerEnded(f"the worker process ended ({how}) before it answered")
    if answer["status"] == "stub":
        raise StillStub(str(answer.get("value")))
    if answer["status"] == "error":
        raise LearnerError(str(answer.get("value")))
    return answer["value"]


class Worker:
    """One confined worker process; ``cells`` (label, source) run first, in order."""

    def __init__(self, cells: Iterable[tuple[str, str]] = (), *, timeout: float = 120.0,
                 hide: Iterable[Path] = (), memory_mb: int = 8192, trace: bool = False,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        from ddtk.course.grading.jail import Jail, confinement, kernel_env
        from ddtk.course.grading.sandbox import Limits

        conf = confinement()
        self.timeout = timeout
        self.cells = list(cells)
        self.outer = Path(tempfile.mkdtemp(prefix="ddtk-judge-"))
        folder = self.outer / secrets.token_hex(4)
        folder.mkdir()
        self.folder = folder
        self.jail = Jail(folder, hide, conf)
        if not conf.namespaces:
            (folder / "tmp").mkdir()
        limits = Limits(memory_mb=memory_mb).kernel_limits()
        cmd = self.jail.wrap([sys.executable, "-m", "ddtk.course.judging.worker"], limits,
                             tmp_mb=Limits().disk_mb)  # fmt: skip
        self.trace_log: Path | None = None
        if trace:  # strace from outside the jail: the learner's code cannot reach its log
            self.trace_log = self.outer / "strace.log"
            cmd = [*trace_command(self.trace_log), *cmd]
        self.cmd = cmd
        self.env = kernel_env(
            os.environ, folder, {"TMPDIR": str(self.jail.tmp), "MPLBACKEND": "Agg", **(env or {})}
        )
        self.log = (self.outer / "worker.log").open("wb")
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            self.cmd, cwd=self.folder, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, start_new_session=True,
        )  # fmt: skip
        for label, source in self.cells:
            self.exec(label, source)

    def _stop(self) -> None:
        from ddtk.course.grading.sandbox import kill_run

        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, 9)
        self.proc.kill()
        self.proc.wait()
        kill_run("-", None, grace=5.0, uid=self.jail.uid if self.jail.conf.own_user else None)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]

    def restart(self) -> None:
        """A new process in the same folder, as the same user: what the last one wrote stays,
        what it held in memory is gone (a crash and a restart, for a check)."""
        self._stop()
        self._start()

    def _read_exactly(self, size: int, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        chunks, left = [], size
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                self.close()
                raise WorkerBroke(f"no answer within {self.timeout:.0f} s (stopped)")
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                code = self.proc.wait()
                how = f"signal {-code}" if code < 0 else f"exit status {code}"
                raise WorkerBroke(f"the worker process ended ({how}) before it answered")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _ask(self, message: tuple[Any, ...]) -> Any:
        assert self.proc.stdin is not None
        data = pickle.dumps(message)
        try:
            self.proc.stdin.write(_HEADER.pack(len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerBroke("the worker process ended before it was asked") from None
        deadline = time.monotonic() + self.timeout
        size = _HEADER.unpack(self._read_exactly(_HEADER.size, deadline))[0]
        if size > ANSWER_MAX:
            self.close()
            raise WorkerBroke(f"the worker's answer is {size} bytes, over {ANSWER_MAX}")
        return _decode(self._read_exactly(size, deadline))

    def exec(self, label: str, source: str) -> None:
        """Run one cell's ``source`` in the worker's namespace."""
        self._ask(("exec", label, source))

    def probe(self, function: str, **kwargs: Any) -> Any:
        """Call the instructor probe ``module:function`` in the worker; return its data."""
        return self._ask(("probe", function, kwargs))

    def close(self) -> None:
        """Stop the worker and everything it started; delete its folder."""
        self._stop()
        with contextlib.suppress(OSError):
            self.log.close()
        shutil.rmtree(self.outer, ignore_errors=True)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class ForkedWorker:
    """A :class:`Worker` forked from a zygote that already ran the set-up: same interface,
    milliseconds to start instead of an interpreter and its imports. Its folder is a new
    one inside the zygote's; a restart forks again into the same folder."""

    trace_log = None

    def __init__(self, zygote: Zygote, cells: list[tuple[str, str]], folder: Path) -> None:
        self.zygote, self.cells, self.folder = zygote, cells, folder
        self.timeout = zygote.worker.timeout
        self.alive = False
        self._start()

    def _start(self) -> None:
        self._ask(("fork", str(self.folder)), forking=True)
        self.alive = True
        self.zygote.child = self
        for label, source in self.cells:
            self.exec(label, source)

    def _ask(self, message: tuple[Any, ...], *, forking: bool = False) -> Any:
        if not (self.alive or forking) or self.zygote.broken:
            raise LearnerError("the worker process ended before it was asked")
        try:
            return self.zygote.worker._ask(message)
        except WorkerEnded:
            self.alive = False
            raise
        except WorkerBroke:  # no answer in time, or one that is not data: start afresh
            self.alive = False
            self.zygote.close()
            raise

    def exec(self, label: str, source: str) -> None:
        """Run one cell's ``source`` in the worker's namespace."""
        self._ask(("exec", label, source))

    def probe(self, function: str, **kwargs: Any) -> Any:
        """Call the instructor probe ``module:function`` in the worker; return its data."""
        return self._ask(("probe", function, kwargs))

    def _end(self) -> None:
        if self.alive and not self.zygote.broken:
            ended = False
            try:
                self._ask(("exit",))
            except (WorkerEnded, WorkerBroke):
                ended = True  # as asked, or no word from the zygote (_ask has closed it)
            except LearnerError:
                pass
            if not ended:  # the child answered instead of ending: trust none of it
                self.zygote.close()
        self.alive = False

    def restart(self) -> None:
        """A new child in the same folder: what the last one wrote stays, its memory is gone."""
        self._end()
        self._start()

    def close(self) -> None:
        """End the child and everything it started; delete its folder."""
        self._end()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ForkedWorker:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class Zygote:
    """A confined :class:`Worker` that ran the set-up ``cells`` once, single-threaded so
    that forking it is safe, and forks a :class:`ForkedWorker` on request: one at a time,
    since the child serves on the zygote's own pipes while the zygote waits for it."""

    def __init__(
        self, cells: list[tuple[str, str]], *, timeout: float, hide: Iterable[Path]
    ) -> None:
        env = {"DDTK_JUDGE_ZYGOTE": "1", "OMP_NUM_THREADS": "1",
               "DDTK_JUDGE_THREADS": os.environ.get("OMP_NUM_THREADS")
               or str(len(os.sched_getaffinity(0)))}  # fmt: skip
        self.worker = Worker(cells, timeout=timeout, hide=hide, env=env)
        self.forks = 0
        self.broken = False
        self.child: ForkedWorker | None = None

    @property
    def free(self) -> bool:
        """Whether it can fork now: alive, and its last child has ended."""
        return not self.broken and (self.child is None or not self.child.alive)

    def fork(self, cells: list[tuple[str, str]]) -> ForkedWorker:
        """A worker with the set-up done, that then runs ``cells`` (the answer)."""
        self.forks += 1
        return ForkedWorker(self, cells, self.worker.folder / f"fork-{self.forks}")

    def close(self) -> None:
        self.broken = True
        self.worker.close()


class WorkerPool:
    """Zygotes by set-up, for judging many answers against one solution: the set-up runs
    once per zygote, and each answer in a child forked from it, in a folder of its own.

    Only for answers the grader trusts not to attack one another: the instructor's own
    mutants (:func:`~ddtk.course.judging.mutants.mutant_matrix`). A child runs as the same
    user as its zygote and its siblings, so hostile code could reach them; a graded
    learner's answers each get a fresh :class:`Worker`. Workers that strace their calls
    are always fresh (strace must see the process from its start)."""

    def __init__(self) -> None:
        self.zygotes: dict[tuple[Any, ...], list[Zygote]] = {}

    def worker(self, base: list[tuple[str, str]], answer: list[tuple[str, str]], *,
               timeout: float, hide: Iterable[Path], trace: bool = False) -> Worker | ForkedWorker:  # fmt: skip
        """A worker that ran ``base`` (the set-up) and then ``answer``: forked from a free
        zygote of that set-up, or from a new one (a check that holds two workers at once
        gets two zygotes)."""
        if trace:
            return Worker(base + answer, timeout=timeout, hide=hide, trace=True)
        key = (tuple(base), tuple(hide), timeout)
        zygotes = self.zygotes.setdefault(key, [])
        zygotes[:] = [z for z in zygotes if not z.broken]
        zygote = next((z for z in zygotes if z.free), None)
        if zygote is None:
            zygote = Zygote(base, timeout=timeout, hide=hide)
            zygotes.append(zygote)
        return zygote.fork(answer)

    def close(self) -> None:
        for zygotes in self.zygotes.values():
            for zygote in zygotes:
                zygote.close()
        self.zygotes.clear()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def trace_command(log: Path) -> list[str]:
    """``strace`` recording the file system calls that make a write durable, into ``log``."""
    strace = shutil.which("strace")
    if strace is None:
        raise LearnerError(
            "strace is not installed on the grading machine (apt-get install strace)"
        )
    calls = "openat,open,creat,rename,renameat,renameat2,fsync,fdatasync"
    return [strace, "-f", "-qq", "--seccomp-bpf", "-y", "-e", f"trace={calls}", "-o", str(log)]


class LocalWorker:
    """The :class:`Worker` interface over a namespace in this process (a notebook's own)."""

    trace_log = None

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.folder = Path(tempfile.mkdtemp(prefix="ddtk-check-"))

    def restart(self) -> None:
        return None

    def exec(self, label: str, source: str) -> None:
        raise LearnerError("a local worker runs no cells")  # pragma: no cover

    def probe(self, function: str, **kwargs: Any) -> Any:
        import importlib

        import torch

        from ddtk.course.judging.worker import _failure

        module, _, name = function.partition(":")
        # A worker receives its arguments pickled: a copy here too, so an answer that edits
        # its input in place is seen changing it, in the notebook's check as by the grader.
        kwargs = copy.deepcopy(kwargs)
        before = dict(
            self.namespace
        )  # a probe sets globals (seed, ...): the notebook keeps its own
        try:
            with torch.random.fork_rng(devices=[]):
                value = getattr(importlib.import_module(module), name)(self.namespace, **kwargs)
        except Exception as exc:
            status, text = _failure(exc)
            raise (StillStub if status == "stub" else LearnerError)(text) from exc
        finally:
            self.namespace.clear()  # type: ignore[attr-defined]
            self.namespace.update(before)  # type: ignore[attr-defined]
        buf = io.BytesIO()
        torch.save({"status": "ok", "value": value}, buf)
        return _decode(buf.getvalue())

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> LocalWorker:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None


__all__ = [
    "ANSWER_MAX", "ForkedWorker", "LearnerError", "LocalWorker", "StillStub", "Worker",
    "WorkerBroke", "WorkerEnded", "WorkerPool", "Zygote", "trace_command",
]  # fmt: skip
