"""Entry point of one rank started by :func:`ddtk.launch`: :func:`main`.

A rank is forked by the launching process's zygote (:mod:`ddtk._zygote`), which calls
:func:`main`, or started as ``python -m ddtk._rank`` where there is no zygote.

The parent writes a cloudpickled job to this process's stdin, keeps the other
end of a result pipe, and owns the rendezvous store. This process joins the
process group, runs the user's function with a :class:`DistributedContext`,
and writes back framed records: any number of ``("report", value)`` while it
runs (``ctx.report``), then ``("ok", result)`` or ``("error", text)``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import sys
import traceback
from typing import Any


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process if the launching process dies, so no rank is orphaned."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


class RecordWriter:
    """Writes framed, cloudpickled records (8-byte length prefix) to the launcher's result pipe.

    Reports (``("report", value)``) may come from any thread while the rank runs;
    the last record is the result, ``("ok", value)`` or ``("error", text)``.
    """

    def __init__(self, fd: int):
        import threading

        self._file = os.fdopen(fd, "wb", closefd=True)
        self._lock = threading.Lock()

    def write(self, record: Any) -> None:
        import cloudpickle

        data = cloudpickle.dumps(record)
        with self._lock:
            self._file.write(struct.pack("<Q", len(data)) + data)
            self._file.flush()

    def report(self, value: Any) -> None:
        """Send ``value`` to the launcher's ``on_report`` callback now."""
        self.write(("report", value))

    def close(self) -> None:
        self._file.close()


def _run(job: dict, writer: RecordWriter) -> Any:
    import torch
    import torch.distributed as dist

    from ddtk.comm.context import DistributedContext, _init_group

    torch.set_num_threads(job["threads"])
    rank, world = job["rank"], job["world_size"]
    if job["backend"] == "nccl":
        torch.cuda.set_device(rank)
    store = dist.TCPStore(
        job["host"], job["port"], world + 1, is_master=False, timeout=_td(job["timeout"])
    )
    _init_group(job["backend"], rank, world, job["timeout"], store=store)
    try:
        ctx = DistributedContext.from_env(
            job["backend"], validate=job["validate"], timeout=job["timeout"],
            transport=job["transport"], network=job.get("network"),
        )  # fmt: skip
        ctx.reporter = writer.report
        result = job["fn"](ctx, *job["args"], **job["kwargs"])
        store.set(
            f"ddtk/returned/{rank}", "1"
        )  # lets the launcher tell the finished from the stuck
        # A clean exit: wait until every rank is done, deliver messages still in flight,
        # and only then let the group go, so no peer sees its connection close early.
        # The barriers go through the launcher's store, not through gloo connections.
        _store_barrier(store, "ddtk/exit/1", world, job["timeout"])
        ctx.flush(timeout=5.0)  # everyone is done: what is not received now never will be
        _store_barrier(store, "ddtk/exit/2", world, job["timeout"])
        ctx.close()
        return result
    finally:
        dist.destroy_process_group()


def _store_barrier(store, key: str, world_size: int, timeout: float) -> None:
    """Wait until ``world_size`` processes have reached ``key`` (counted in the TCPStore)."""
    import time

    store.add(key, 1)
    deadline = time.monotonic() + timeout
    while store.add(key, 0) < world_size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank reached the end of the run ({key})")
        time.sleep(0.002)


def _td(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=seconds)


def main() -> None:
    result_fd = int(sys.argv[1])
    _die_with_parent(int(sys.argv[2]))
    if os.environ.get("DDTK_NETNS"):  # a ShapedNetwork: join this rank's namespace before any socket
        from ddtk.net.shaping import join_namespace

        join_namespace(os.environ["DDTK_NETNS"])
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    import cloudpickle

    job = cloudpickle.loads(sys.stdin.buffer.read())
    writer = RecordWriter(result_fd)
    try:
        record: tuple[str, Any] = ("ok", _run(job, writer))
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        record = ("error", "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    try:
        writer.write(record)
    except Exception as exc:  # the result itself could not be pickled
        text = f"rank {job['rank']}: the return value could not be sent back: {exc!r}"
        writer.write(("error", text))
    writer.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
