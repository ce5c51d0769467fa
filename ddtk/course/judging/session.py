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


def _decode(data: bytes) -> Any:
    import torch

    try:
        answer = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:
        raise LearnerError(
            f"the worker's answer could not be read as data ({type(exc).__name__})"
        ) from None
    if not isinstance(answer, dict) or answer.get("status") not in ("ok", "error", "stub"):
        raise LearnerError("the worker's answer is not one the judge sent for")
    if answer["status"] == "stub":
        raise StillStub(str(answer.get("value")))
    if answer["status"] == "error":
        raise LearnerError(str(answer.get("value")))
    return answer["value"]


class Worker:
    """One confined worker process; ``cells`` (label, source) run first, in order."""

    def __init__(self, cells: Iterable[tuple[str, str]] = (), *, timeout: float = 120.0,
                 hide: Iterable[Path] = (), memory_mb: int = 8192, trace: bool = False) -> None:  # fmt: skip
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
            os.environ, folder, {"TMPDIR": str(self.jail.tmp), "MPLBACKEND": "Agg"}
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
                raise LearnerError(f"no answer within {self.timeout:.0f} s (stopped)")
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                code = self.proc.wait()
                how = f"signal {-code}" if code < 0 else f"exit status {code}"
                raise LearnerError(f"the worker process ended ({how}) before it answered")
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
            raise LearnerError("the worker process ended before it was asked") from None
        deadline = time.monotonic() + self.timeout
        size = _HEADER.unpack(self._read_exactly(_HEADER.size, deadline))[0]
        if size > ANSWER_MAX:
            self.close()
            raise LearnerError(f"the worker's answer is {size} bytes, over {ANSWER_MAX}")
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
    "ANSWER_MAX", "LearnerError", "LocalWorker", "StillStub", "Worker", "trace_command",
]  # fmt: skip
