"""``ddtk.launch``: run a function on N local ranks, each a real process, and collect the results.

>>> import ddtk, torch
>>> def work(ctx, scale):
...     return ctx.all_reduce(torch.full((5,), float(ctx.rank) * scale))
>>> results = ddtk.launch(work, world_size=4, args=(2.0,))   # results[r] from rank r

How it works, and why:

* No rank inherits the caller's state: ranks are forked from the **zygote**
  (:mod:`ddtk._zygote`), a fresh interpreter that this process starts on its first
  launch and keeps until it exits. It has imported torch, and nothing else of
  yours, so a rank starts in milliseconds instead of paying torch's import (about
  0.85 s of CPU per rank: a 4-rank launch took 1.9 s on 2 cores, 0.5 s with the zygote). Each
  rank takes this process's environment, folder and ``PYTHONPATH`` of the moment of
  the launch; CUDA is never initialised before a fork, and scripts need no
  ``if __name__ == "__main__"`` guard. ``DDTK_LAUNCH_ZYGOTE=0`` (or a platform
  without one) starts each rank as a new interpreter, ``python -m ddtk._rank``.
  :func:`close_zygote` stops it early (a notebook's last cell, which shows what
  processes it leaves: none, not a helper that looks like a stray rank).
* The function and its arguments travel by cloudpickle, so functions defined in
  a notebook cell or in ``__main__`` work.
* Rendezvous uses a TCPStore owned by this process on a free port chosen by the
  OS, so two launches never race for a port.
* Each rank runs on ``threads`` threads (1 by default) so N ranks do not fight
  over the cores, and its output is echoed here prefixed with ``[rank r]``.
* Failures are loud and clean: the first rank that raises becomes a
  :class:`RankError` carrying its traceback, the other ranks are stopped within
  seconds, a timeout names the ranks still running, Ctrl-C stops everything,
  and no process outlives the call (ranks also die if this process dies).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import cloudpickle

_GRACE_SECONDS = 3.0
# Let glibc back large allocations with transparent huge pages where the kernel allows
# it ("madvise" mode): a fresh 64 MiB tensor then costs 32 page faults instead of 16384.
_MALLOC_TUNABLES = "glibc.malloc.hugetlb=1"
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


class RankError(RuntimeError):
    """A rank failed. ``rank`` is its number and ``traceback`` the original traceback text."""

    def __init__(self, rank: int, traceback: str, exitcode: int | None = None):
        self.rank = rank
        self.traceback = traceback
        self.exitcode = exitcode
        super().__init__(f"rank {rank} failed:\n{traceback.rstrip()}")


@dataclass
class _Rank:
    """Book-keeping for one child process."""

    rank: int
    proc: Any  # subprocess.Popen, or ddtk._forking.ForkedProcess (the same calls)
    result_fd: int
    data: bytearray = field(default_factory=bytearray)
    done: bool = False
    record: tuple[str, Any] | None = None
    stderr_tail: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)


def _validate(fn: Callable, world_size: Any, backend: str, timeout: Any, threads: Any) -> str:
    """Check every argument before anything is spawned; return the concrete backend."""
    from ddtk.comm.context import resolve_backend

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    return resolve_backend(backend, world_size)


def child_python_env() -> dict[str, str]:
    """This environment, with a PYTHONPATH under which a child imports what this process can.

    Functions pickled by reference (defined in a test module, or in a module next
    to a notebook) are found again in the child that unpickles them.
    """
    env = dict(os.environ)
    path = [_PACKAGE_PARENT, *[p for p in sys.path if p and os.path.isdir(p)]]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    return env


def _child_env(rank: int, world_size: int, port: int, threads: int) -> dict[str, str]:
    env = child_python_env()
    env.update(
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    env.setdefault("GLOO_SOCKET_IFNAME", "lo0" if sys.platform == "darwin" else "lo")
    env.setdefault("GLIBC_TUNABLES", _MALLOC_TUNABLES)
    return env


class _Sink:
    """What the echo threads of one sink share: a lock, and whose line is left unfinished.

    Two ranks print to one terminal. When rank A's last write left its line open (a
    progress bar waiting for its next redraw) and rank B writes, B's text would be glued
    to A's line; instead a newline closes A's line first, and A's next text starts a new
    prefixed line.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: str | None = None  # prefix of the rank whose line is unfinished
        self.broken: set[str] = set()  # ranks whose open line another rank closed


_SINKS: dict[int, _Sink] = {}
_SINKS_LOCK = threading.Lock()


def _shared(sink: Any) -> _Sink:
    with _SINKS_LOCK:
        return _SINKS.setdefault(id(sink), _Sink())


def _echo(stream: IO[bytes], sink: Any, prefix: str, tail: list[str] | None) -> None:
    """Copy a child's output to ``sink`` as it comes, with a rank prefix at the start of each line.

    Carriage returns count as line starts too, so a progress bar that redraws its
    line with ``\\r`` (tqdm) stays live and prefixed here; lines of different ranks
    are never glued together (see :class:`_Sink`).
    """
    at_line_start = True
    shared = _shared(sink)
    decoder = codecs.getincrementaldecoder("utf-8")(
        errors="replace"
    )  # a chunk may split a character
    for raw in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
        text = decoder.decode(raw)
        if tail is not None:
            tail.append(text)
            del tail[:-20]
        with shared.lock:
            out = []
            if prefix in shared.broken:  # another rank ended our line for us
                shared.broken.discard(prefix)
                at_line_start = True
                text = text[1:] if text.startswith("\n") else text
            elif shared.open not in (None, prefix) and text:
                out.append("\n")
                shared.broken.add(shared.open)
            for piece in re.split(r"(?<=[\r\n])", text):
                if piece:
                    out.append(prefix + piece if at_line_start and piece not in "\r\n" else piece)
                    at_line_start = piece[-1] in "\r\n"
            if text:
                shared.open = None if at_line_start else prefix
            try:
                sink.write("".join(out))
                sink.flush()
            except (ValueError, OSError):  # the sink was closed (interpreter shutting down)
                pass
    stream.close()


def _zygote_env() -> dict[str, str]:
    """The zygote's environment: this one, one BLAS/OpenMP thread (no pool before a fork)."""
    env = child_python_env()
    env.update(
        PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"
    )
    env.setdefault("GLIBC_TUNABLES", _MALLOC_TUNABLES)
    return env


def close_zygote() -> bool:
    """Stop the zygote that forks this process's ranks; whether one was running.

    It would end with this process. The next :func:`launch` starts a new one."""
    from ddtk._forking import close_zygote as close

    return close()


def _start(env: dict[str, str], write_fd: int) -> Any:
    """A rank process: forked by this process's zygote, else a new interpreter."""
    from ddtk._forking import ForkedProcess, ZygoteError, zygote

    z = zygote(_zygote_env)  # the environment is built only when a zygote starts
    if z is not None:
        pipes = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr
        child = (pipes[0][0], pipes[1][1], pipes[2][1], write_fd)
        try:
            pid = z.spawn(env, os.getcwd(), child)
        except ZygoteError:
            for a, b in pipes:
                os.close(a)
                os.close(b)
        else:
            for fd in child[:3]:
                os.close(fd)
            stdin = os.fdopen(pipes[0][1], "wb")
            return ForkedProcess(
                pid, z, stdin, os.fdopen(pipes[1][0], "rb"), os.fdopen(pipes[2][0], "rb")
            )
    return subprocess.Popen(
        [sys.executable, "-m", "ddtk._rank", str(write_fd), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(write_fd,),
        env=env,
        start_new_session=True,  # own process group: we can stop a rank and anything it started
    )


def _spawn(rank: int, job: dict, env: dict[str, str], echo: bool) -> _Rank:
    read_fd, write_fd = os.pipe()
    try:
        proc = _start(env, write_fd)
    finally:
        os.close(write_fd)
    r = _Rank(rank, proc, read_fd)
    prefix = f"[rank {rank}] "
    for stream, sink, tail in (
        (proc.stdout, sys.stdout, None),
        (proc.stderr, sys.stderr, r.stderr_tail),
    ):
        t = threading.Thread(
            target=_echo, args=(stream, sink if echo else _Null(), prefix, tail), daemon=True
        )
        t.start()
        r.threads.append(t)
    try:
        proc.stdin.write(cloudpickle.dumps({**job, "rank": rank}))  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
    except BrokenPipeError:
        pass  # the child died at start; its exit is reported by the wait loop
    return r


class _Null:
    def write(self, _: str) -> None: ...
    def flush(self) -> None: ...


def _stop(ranks: Sequence[_Rank]) -> None:
    """Stop every rank that is still alive: SIGTERM its process group, then SIGKILL after a grace period."""
    alive = [r for r in ranks if r.proc.poll() is None]
    for r in alive:
        _signal_group(r.proc, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_SECONDS
    for r in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for r in ranks:
        _signal_group(r.proc, signal.SIGKILL)  # also reaps anything a rank started
        r.proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _read_ready(
    sel: selectors.BaseSelector, wait: float, on_report: Callable[[int, Any], None] | None
) -> list[_Rank]:
    """Read whatever result bytes are available; return the ranks whose result pipe closed.

    Complete ``("report", ...)`` frames are handed to ``on_report`` as they arrive;
    the final ``("ok" | "error", ...)`` frame is kept as the rank's record.
    """
    closed = []
    for key, _ in sel.select(timeout=wait):
        r: _Rank = key.data
        chunk = os.read(r.result_fd, 1 << 20)
        if not chunk:
            sel.unregister(r.result_fd)
            closed.append(r)
            continue
        r.data += chunk
        while len(r.data) >= 8 and len(r.data) >= 8 + struct.unpack("<Q", r.data[:8])[0]:
            (n,) = struct.unpack("<Q", r.data[:8])
            kind, value = cloudpickle.loads(bytes(r.data[8 : 8 + n]))
            del r.data[: 8 + n]
            if kind == "report":
                if on_report is not None:
                    on_report(r.rank, value)
            else:
                r.record = (kind, value)
    return closed


def _finish(r: _Rank) -> None:
    """Take the rank's final record, or describe how it died without sending one."""
    r.done = True
    if r.record is not None:
        return
    code = r.proc.wait()
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    tail = "".join(r.stderr_tail[-10:])
    r.record = ("died", f"rank {r.rank} died without reporting a result ({how}).\n{tail}")


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    backend: str = "auto",
    timeout: float | None = 300.0,
    threads: int = 1,
    validate: bool = True,
    echo: bool = True,
    on_report: Callable[[int, Any], None] | None = None,
    op_timeout: float | None = None,
    transport: str = "auto",
    network: Any = None,
) -> list[Any]:
    """Run ``fn(ctx, *args, **kwargs)`` on ``world_size`` local ranks; return the per-rank results.

    Args:
        fn: the function each rank runs; its first argument is a :class:`ddtk.DistributedContext`.
        world_size: number of ranks (processes) to start.
        args, kwargs: further arguments for ``fn`` (sent by cloudpickle).
        backend: ``"gloo"``, ``"nccl"`` (rank r uses ``cuda:r``) or ``"auto"`` (nccl when there
            is a GPU per rank, gloo otherwise).
        timeout: seconds for the whole run, also used as the collective timeout inside the ranks.
        threads: intra-op threads per rank.
        validate: check that ranks agree on every collective's arguments (off for benchmarks).
        echo: forward the ranks' stdout and stderr here, prefixed by ``[rank r]``.
        on_report: called here as ``on_report(rank, value)`` for every ``ctx.report(value)``
            a rank makes, while the ranks run: live plots and progress in a notebook.
        op_timeout: seconds a send, receive or collective may make no progress before it
            raises :class:`~ddtk.comm.transport.CollectiveTimeoutError` naming the missing
            rank (sets ``DDTK_OP_TIMEOUT`` in the ranks). None keeps ``DDTK_OP_TIMEOUT``
            if set, else 300 s (``ddtk.comm.context.DEFAULT_OP_TIMEOUT``); 0 turns it
            off and leaves hangs to ``timeout``.
        transport: how ddtk's own messages and collectives move between the ranks:
            ``"shm"`` (shared memory, the way NCCL moves data inside a host), ``"tcp"``
            (gloo's sockets) or ``"auto"`` (shared memory wherever the machine allows it,
            see :func:`ddtk.comm.context.check_transport`). ``torch.distributed``'s own
            collectives, and DDP, use the backend whatever this says.
        network: the network between the ranks, if not this machine's own.
            :class:`ddtk.net.emulate.EmulatedNetwork` gives every pair of ranks a bandwidth
            and a latency inside ddtk's transport (portable; ddtk's collectives only);
            :class:`ddtk.net.shaping.ShapedNetwork` starts each rank in its own network
            namespace behind a rate-limited virtual link (root only; every socket,
            gloo's own collectives included). Either way the ranks run on the CPU with
            gloo, which ``backend="auto"`` then picks.

    Raises:
        RankError: a rank raised or died; carries its rank number and traceback.
        TimeoutError: ``timeout`` expired; names the ranks still running.
        ValueError, TypeError: bad arguments, raised before any process starts.
    """
    import torch.distributed as dist

    from ddtk.comm.context import check_transport

    if network is not None:
        backend = _network_backend(backend)
    backend = _validate(fn, world_size, backend, timeout, threads)
    transport = check_transport(transport)
    if op_timeout is not None and (
        isinstance(op_timeout, bool)
        or not isinstance(op_timeout, (int, float))
        or not 0 <= op_timeout < float("inf")
    ):
        raise ValueError(
            f"op_timeout must be a number of seconds >= 0 (0: off) or None, got {op_timeout!r}"
        )
    limit = 10 * 365 * 86400.0 if timeout is None else float(timeout)
    host, transport, rank_envs = _network_settings(network, world_size, transport)
    store = dist.TCPStore(
        host,
        0,
        world_size + 1,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=limit),
    )
    job = {
        "fn": fn, "args": tuple(args), "kwargs": dict(kwargs or {}), "world_size": world_size,
        "backend": backend, "host": host, "port": store.port, "timeout": limit,
        "threads": threads, "validate": validate, "transport": transport, "network": network,
    }  # fmt: skip
    ranks: list[_Rank] = []
    sel = selectors.DefaultSelector()
    try:
        for rank in range(world_size):
            env = _child_env(rank, world_size, store.port, threads)
            env.update(rank_envs[rank])
            if op_timeout is not None:
                env["DDTK_OP_TIMEOUT"] = str(float(op_timeout)) if op_timeout else "off"
            r = _spawn(rank, job, env, echo)
            ranks.append(r)
            sel.register(r.result_fd, selectors.EVENT_READ, r)
        return _collect(ranks, sel, time.monotonic() + limit, timeout, store, on_report)
    finally:
        _stop(ranks)
        _sweep_segments(ranks)
        sel.close()
        for r in ranks:
            os.close(r.result_fd)
            for t in r.threads:
                t.join(timeout=2.0)
        del store


def _network_backend(backend: str) -> str:
    """Emulated and shaped networks carry CPU traffic: gloo, whatever GPUs the machine has."""
    if backend == "nccl":
        raise ValueError(
            "network= emulates or shapes the traffic of CPU ranks over gloo; it cannot be "
            "used with backend='nccl' (use backend='gloo' or 'auto')"
        )
    return "gloo"


def _network_settings(
    network: Any, world_size: int, transport: str
) -> tuple[str, str, list[dict[str, str]]]:
    """Where the store listens, the transport, and each rank's extra environment, for ``network``."""
    if network is None:
        return "127.0.0.1", transport, [{} for _ in range(world_size)]
    if not hasattr(network, "prepare"):
        raise TypeError(
            "network must be a ddtk.net.emulate.EmulatedNetwork or a ddtk.net.shaping.ShapedNetwork, "
            f"got {type(network).__name__}"
        )
    return network.prepare(world_size, transport)


def _sweep_segments(ranks: Sequence[_Rank]) -> None:
    """Remove shared-memory files a rank created and could not unlink (it died while connecting)."""
    from ddtk.comm import shm

    for r in ranks:
        for path in shm.segments_of(r.proc.pid):
            path.unlink(missing_ok=True)


def _collect(
    ranks: list[_Rank],
    sel: selectors.BaseSelector,
    deadline: float,
    timeout: float | None,
    store: Any,
    on_report: Callable[[int, Any], None] | None,
) -> list[Any]:
    """Wait for every rank's record; raise on the first failure or at the deadline."""
    while not all(r.done for r in ranks):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(_timeout_message(ranks, timeout, store))
        for r in _read_ready(sel, min(0.1, remaining), on_report):
            _finish(r)
            kind, value = r.record  # type: ignore[misc]
            if kind != "ok":
                raise RankError(r.rank, value, r.proc.poll())
    return [r.record[1] for r in ranks]  # type: ignore[index]


def _timeout_message(ranks: list[_Rank], timeout: float | None, store: Any) -> str:
    """Name the ranks still inside ``fn`` and those that had returned and were waiting for them."""
    waiting = [r.rank for r in ranks if not r.done and store.check([f"ddtk/returned/{r.rank}"])]
    running = [r.rank for r in ranks if not r.done and r.rank not in waiting]
    text = f"ddtk.launch timed out after {timeout} s; rank(s) {', '.join(map(str, running))} were still running (stopped)."
    if waiting:
        text += f" Rank(s) {', '.join(map(str, waiting))} had returned and were waiting for them."
    return (
        text
        + " A rank blocked in a collective usually means another rank skipped or reordered that collective."
    )
