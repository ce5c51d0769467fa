"""Reproduce, cheaply and on purpose, two failures lecture 04's troubleshooting section explains.

Both run two gloo processes on this machine, forked from the caller (so no second
``import torch``), and return the error text each rank saw, verbatim:

* :func:`wrong_interface`: ``GLOO_SOCKET_IFNAME`` names an interface this host does not
  have, the gloo twin of a wrong ``NCCL_SOCKET_IFNAME``.
* :func:`hung_rank`: one rank never reaches the all-reduce; the other times out. Each rank
  also records the collectives it entered, the minimal form of what PyTorch's NCCL flight
  recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE``) keeps, which is how you find the rank that
  hung: it is the one whose last entry is behind the others'.

Each call takes a few seconds, reaps its processes and leaves nothing running.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import socket
import time
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, timeout_s: float, stall_s: float, env: dict, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    entered: list[str] = []
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=timeout_s)
        )
        entered.append("all_reduce #1")
        dist.all_reduce(torch.ones(4))
        if rank == 1:
            time.sleep(stall_s)  # "stuck in user code": never reaches the second all-reduce
        else:
            entered.append("all_reduce #2")
            dist.all_reduce(torch.ones(4))
        queue.put((rank, "ok", entered))
    except Exception as exc:  # the point is to report it
        queue.put((rank, f"{type(exc).__name__}: {exc}", entered))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(env: dict, timeout_s: float, stall_s: float) -> list[dict]:
    ctx = mp.get_context("fork")
    queue, port = ctx.Queue(), _free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, port, timeout_s, stall_s, env, queue), daemon=True)
        for r in range(2)
    ]
    for p in procs:
        p.start()
    rows = []
    deadline = time.monotonic() + timeout_s + stall_s + 15
    while len(rows) < 2 and time.monotonic() < deadline:
        try:
            rows.append(queue.get(timeout=0.5))
        except Exception:  # queue.Empty: a rank has not reported yet
            if not any(p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()
    return [
        {"rank": r, "error": e if e != "ok" else None, "entered": ent} for r, e, ent in sorted(rows)
    ]


def wrong_interface(name: str = "nosuchif0") -> list[dict]:
    """Both ranks with ``GLOO_SOCKET_IFNAME=name``: gloo refuses to create its device."""
    return _run({"GLOO_SOCKET_IFNAME": name}, timeout_s=5.0, stall_s=0.0)


def hung_rank(timeout_s: float = 1.0) -> list[dict]:
    """Rank 1 stalls after the first all-reduce; rank 0 times out in the second."""
    return _run({}, timeout_s=timeout_s, stall_s=timeout_s + 1.5)
