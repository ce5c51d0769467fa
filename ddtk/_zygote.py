"""A preloaded parent for the ranks of :func:`ddtk.launch` (``python -m ddtk._zygote``).

Every rank used to be a new interpreter that imported torch: about 0.85 s of CPU per
rank, which on a laptop's 2 cores is most of a short launch. The zygote is one fresh
interpreter per launching process that imports torch once and then forks a rank for
each request, so a rank starts in milliseconds. It keeps what the spawn start method
promised:

* it is a **fresh interpreter**, not a fork of the notebook kernel or of the caller:
  no state of the caller reaches a rank except what the job carries;
* it imports torch but never initialises CUDA or starts a thread before it forks, so
  a rank starts as clean as a new interpreter would (CUDA and OpenMP are not fork-safe
  once initialised; a rank initialises them itself);
* each rank gets the caller's environment, working directory and ``PYTHONPATH`` of the
  moment of the launch, its own session (process group), and the pipes the launcher
  made for its stdin, stdout, stderr and results.

The protocol, on a ``SOCK_SEQPACKET`` Unix socket shared with the launcher
(:mod:`ddtk._forking`): a request is a pickled ``{"id", "env", "cwd", "args"}`` with four
file descriptors (stdin, stdout, stderr, result pipe); the zygote answers
``("started", id, pid)`` or ``("failed", id, text)``, and ``("exit", pid, returncode)``
when a rank ends (it is the ranks' parent and reaps them; ``returncode`` follows
:mod:`subprocess`: negative for a signal). When the launcher's end closes, the zygote
exits, and its ranks with it (each rank asks Linux for SIGKILL when its parent dies).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import signal
import socket
import sys
import traceback

_MAX_REQUEST = 4 << 20
_BASE_PATH: list[str] = []
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "cloudpickle", "numpy")
"""Imported once here, inherited by every rank. Only modules that read no per-launch state:
``torch._dynamo`` is what DDP's constructor imports first (about 0.9 s of CPU in each
rank otherwise); importing it starts no thread and compiles nothing.
ddtk itself is imported by each rank, after it has taken the launch's environment. The
launcher starts the zygote with one BLAS and OpenMP thread, so that numpy's OpenBLAS
starts no thread pool before a fork (a rank sets torch's own thread count)."""


def _child(request: dict, fds: list[int], sock: socket.socket, wakeup: int) -> None:
    """In the forked rank: take the launcher's pipes, environment and folder, then run the rank."""
    code = 1
    try:
        sock.close()
        signal.set_wakeup_fd(-1)
        os.close(wakeup)
        # The dispositions a new interpreter starts with (it ignores SIGPIPE too).
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds[:3]:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # The path a new interpreter started with ``-m`` in this folder would have.
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = list(dict.fromkeys([request["cwd"], *extra, *_BASE_PATH]))
        sys.argv = ["ddtk._rank", str(fds[3]), str(os.getppid())]
        from ddtk import _rank

        _rank.main()  # ends with os._exit
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # a rank that cannot start says why, on its stderr
        with open(2, "w", closefd=False) as err:
            err.write(traceback.format_exc())
    os._exit(code)


def _reap(sock: socket.socket) -> None:
    """Report every rank that has ended: ``("exit", pid, returncode)``."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, ("exit", pid, os.waitstatus_to_exitcode(status)))


def _send(sock: socket.socket, message: tuple) -> None:
    with contextlib.suppress(OSError):  # the launcher is gone: the loop sees it next
        sock.send(pickle.dumps(message))


def _serve(sock: socket.socket) -> None:
    """Fork a rank per request until the launcher closes its end."""
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "request")
    sel.register(wakeup_r, selectors.EVENT_READ, "child")
    while True:
        for key, _ in sel.select():
            if key.data == "child":
                os.read(wakeup_r, 4096)
                _reap(sock)
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_REQUEST, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                return
            request = pickle.loads(data)
            try:
                pid = os.fork()
            except OSError as exc:
                _send(sock, ("failed", request["id"], f"fork failed: {exc}"))
                pid = -1
            if pid == 0:
                _child(request, fds, sock, wakeup_r)
            for fd in fds:
                os.close(fd)
            if pid > 0:
                _send(sock, ("started", request["id"], pid))
        _reap(sock)


def main() -> None:
    global _BASE_PATH
    sock = socket.socket(fileno=int(sys.argv[1]))
    own = set(os.environ.get("PYTHONPATH", "").split(os.pathsep))
    _BASE_PATH = [p for p in sys.path[1:] if p not in own]  # the interpreter's own: stdlib, site
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    for name in PRELOAD:
        __import__(name)
    _send(sock, ("ready", os.getpid()))
    _serve(sock)


if __name__ == "__main__":
    main()
