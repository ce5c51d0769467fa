"""Reproduce two failures a learner meets with torchrun, for real, in a few seconds each.

* :func:`rendezvous_timeout`: ``torchrun --nnodes=2`` started on one node only. The
  agent waits for the second node until the c10d rendezvous's ``join_timeout`` (600 s
  by default, shortened here through ``--rdzv-conf``) and raises
  ``RendezvousTimeoutError``.
* :func:`hung_rank`: two gloo ranks under torchrun; rank 1 never reaches the
  all-reduce (it sleeps, as a hung rank would), so rank 0's collective times out
  after the process group's ``timeout``. With ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` the
  gloo process group is wrapped so that each collective starts with a monitored
  barrier, and the error names the rank that did not arrive.

:func:`reproduce` starts both at once (they mostly wait) and returns the lines of
their output that a learner should recognise. Every process is started in its own
session and its whole group is killed at the end, so nothing is left running.
``python -m ddtk.recovery.troubleshoot hang`` is the worker script of :func:`hung_rank`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["hung_rank", "rendezvous_timeout", "reproduce"]

_KEEP = ("Error", "error", "Timed out", "monitoredBarrier", "failed (exitcode", "Root Cause", "rank      :",
         "exitcode  :")  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun() -> str:
    return str(Path(sys.executable).parent / "torchrun")


def rendezvous_timeout(join_timeout: float = 1.0) -> list[str]:
    """The command of a two-node torchrun job of which only one node starts."""
    return [_torchrun(), "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=localhost:{_free_port()}", f"--rdzv-conf=join_timeout={join_timeout:g}",
            "-m", "ddtk.recovery.troubleshoot", "hang"]  # fmt: skip


def hung_rank(pg_timeout: float = 1.0) -> list[str]:
    """The command of a two-rank gloo job whose rank 1 never joins the all-reduce."""
    return [_torchrun(), "--nnodes=1", "--nproc-per-node=2", f"--rdzv-endpoint=localhost:{_free_port()}",
            "-m", "ddtk.recovery.troubleshoot", "hang", "--timeout", f"{pg_timeout:g}"]  # fmt: skip


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **env)
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip


def _finish(proc: subprocess.Popen, deadline: float) -> tuple[int | None, str]:
    try:
        out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        out = "(stopped: ran past its limit)"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, out


def reproduce(limit_s: float = 40.0) -> dict[str, dict[str, object]]:
    """Run both reproductions at once; per case: command, exit status, seconds, the telling lines."""
    cases = {
        "rendezvous timeout": (rendezvous_timeout(), {}),
        "hung rank (TORCH_DISTRIBUTED_DEBUG=DETAIL)": (
            hung_rank(),
            {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        ),
    }
    t0 = time.monotonic()
    procs = {name: _start(cmd, env) for name, (cmd, env) in cases.items()}
    results = {}
    for name, proc in procs.items():
        rc, out = _finish(proc, t0 + limit_s)
        lines = [ln.rstrip() for ln in out.splitlines()
                 if any(k in ln for k in _KEEP) and not ln.lstrip().startswith(("File ", "raise "))]  # fmt: skip
        last = out.strip().splitlines()[-1:] if out.strip() else []
        results[name] = {"cmd": cases[name][0], "returncode": rc, "seconds": time.monotonic() - t0,
                         "lines": lines + [ln for ln in last if ln not in lines]}  # fmt: skip
    return results


def _hang(timeout: float) -> None:
    """Worker of :func:`hung_rank`: rank 1 sleeps past the timeout, rank 0 all-reduces."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    if dist.get_rank() == 1:
        time.sleep(timeout + 0.5)  # a hung rank: alive, but never reaches the collective
    else:
        dist.all_reduce(torch.ones(4))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="ddtk.recovery.troubleshoot")
    parser.add_argument("case", choices=["hang"])
    parser.add_argument("--timeout", type=float, default=1.0, help="process-group timeout, seconds")
    _hang(parser.parse_args().timeout)
