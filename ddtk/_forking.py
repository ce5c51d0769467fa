"""The launcher's side of the zygote (:mod:`ddtk._zygote`): ranks forked from a preloaded parent.

:func:`zygote` returns this process's zygote, started on first use and kept until this
process exits; :meth:`Zygote.spawn` starts one rank and returns a :class:`ForkedProcess`,
which answers ``pid``, ``poll()``, ``wait()`` and ``returncode`` as a
:class:`subprocess.Popen` does. Where no zygote can run (not Linux, or it failed to
start) :func:`zygote` returns None and :func:`ddtk.launch` starts each rank as a new
interpreter; ``DDTK_LAUNCH_ZYGOTE=0`` asks for that too.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO

from ddtk.comm.shm import pid_alive

START_TIMEOUT_S = 120.0
"""How long the zygote may take to import torch (a loaded laptop takes seconds)."""


class ZygoteError(RuntimeError):
    """The zygote could not start a rank (it died, or fork failed)."""


class ForkedProcess:
    """One rank the zygote forked: the part of :class:`subprocess.Popen` that launch uses."""

    def __init__(
        self, pid: int, zygote: Zygote, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]
    ):
        self.pid, self._zygote = pid, zygote
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code (negative: the signal), or None while the rank runs."""
        if self.returncode is None:
            self.returncode = self._zygote.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the rank to end; :class:`subprocess.TimeoutExpired` after ``timeout`` s."""
        if self.returncode is None:
            code = self._zygote.wait(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
            self.returncode = code
        return self.returncode


class Zygote:
    """A running ``python -m ddtk._zygote`` and the thread that reads its messages."""

    def __init__(self, env: Mapping[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._cond = threading.Condition()
        self._codes: dict[int, int] = {}
        self._replies: dict[int, tuple] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self.alive = True
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ddtk._zygote", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=dict(env), stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C in a terminal is the launcher's, not ours
            )  # fmt: skip
        finally:
            theirs.close()
        self._sock.settimeout(START_TIMEOUT_S)
        try:
            ready = pickle.loads(self._sock.recv(1 << 16) or pickle.dumps(None))
        except (OSError, pickle.UnpicklingError) as exc:
            ready = exc
        if not (isinstance(ready, tuple) and ready[0] == "ready"):
            self.close()
            raise ZygoteError(f"the zygote did not start: {ready!r}")
        self._sock.settimeout(None)
        threading.Thread(target=self._read, name="ddtk-zygote", daemon=True).start()

    def _read(self) -> None:
        """Deliver the zygote's answers; when it is gone, wake everyone who waits on it."""
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    self.alive = False
                    self._cond.notify_all()
                    return
                kind, key, value = pickle.loads(data)
                if kind == "exit":
                    self._codes[key] = value
                else:
                    self._replies[key] = (kind, value)
                self._cond.notify_all()

    def spawn(self, env: Mapping[str, str], cwd: str, fds: tuple[int, int, int, int]) -> int:
        """Fork a rank with ``env`` in ``cwd`` on (stdin, stdout, stderr, result) ``fds``; its pid."""
        request = {"id": next(self._ids), "env": dict(env), "cwd": cwd}
        with self._send_lock:
            try:
                socket.send_fds(self._sock, [pickle.dumps(request)], list(fds))
            except OSError as exc:
                raise ZygoteError(f"the zygote is gone: {exc}") from exc
        with self._cond:
            self._cond.wait_for(
                lambda: request["id"] in self._replies or not self.alive, START_TIMEOUT_S
            )
            kind, value = self._replies.pop(request["id"], ("failed", "the zygote did not answer"))
        if kind != "started":
            raise ZygoteError(str(value))
        return value

    def returncode(self, pid: int) -> int | None:
        """``pid``'s exit code if it has ended (a rank of a dead zygote was killed with it)."""
        with self._cond:
            if pid in self._codes:
                return self._codes[pid]
            if not self.alive and not pid_alive(pid):
                return -signal.SIGKILL
        return None

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """Wait for ``pid``'s exit code; None if ``timeout`` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.returncode(pid)
            if code is not None:
                return code
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            with self._cond:
                if pid not in self._codes:
                    self._cond.wait(0.5 if left is None else min(left, 0.5))

    def close(self) -> None:
        """Close our end: the zygote exits, and any rank still running dies with it."""
        with contextlib.suppress(OSError):
            # shutdown() first: a close() alone would wait for the reader thread's recv()
            # to return, and the zygote would see no end of file until then
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=10)


_lock = threading.Lock()
_zygote: Zygote | None = None
_owner = 0  # the pid that started _zygote: a forked child of this process must not share it
_failed = False


def zygote(make_env: Callable[[], Mapping[str, str]]) -> Zygote | None:
    """This process's zygote (started with ``make_env()`` the first time), or None where none can run."""
    global _zygote, _owner, _failed
    if os.environ.get("DDTK_LAUNCH_ZYGOTE", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    with _lock:
        if _zygote is not None and _owner == os.getpid() and _zygote.alive:
            return _zygote
        if _failed and _owner == os.getpid():
            return None
        _owner = os.getpid()
        try:
            _zygote = Zygote(make_env())
        except (OSError, ZygoteError):
            _zygote, _failed = None, True
        return _zygote


def close_zygote() -> bool:
    """Stop this process's zygote, if it started one; whether one was running.

    The zygote ends with this process anyway; a notebook calls this in its last cell so
    that the processes it leaves are none, not a helper that looks like a stray rank. The
    next launch starts a new zygote."""
    global _zygote, _failed
    with _lock:
        if _zygote is None or _owner != os.getpid():
            return False
        z, _zygote, _failed = _zygote, None, False
    running = z.alive
    z.close()
    return running


def is_zygote(proc: object) -> bool:
    """Whether a :mod:`psutil` process is a ddtk zygote (a helper that lives as long as its launcher)."""
    try:
        return "ddtk._zygote" in proc.cmdline()  # type: ignore[attr-defined]
    except Exception:  # gone, or not ours to read
        return False


__all__ = ["ForkedProcess", "Zygote", "ZygoteError", "close_zygote", "is_zygote", "zygote"]
