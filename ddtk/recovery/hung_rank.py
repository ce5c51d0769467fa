"""Find the rank that hangs a collective, live: ``py-spy dump`` and the flight recorder.

A two-rank gloo job under ``torchrun`` trains a few steps. At ``hang_step`` rank 1 blocks
in its data loading (``read_batch``) and never reaches the all-reduce, while rank 0
waits inside it. Neither rank fails until the process group's timeout, and then only
rank 0 does, naming no culprit. While the job hangs, :func:`diagnose` looks at it twice
from outside, as one would on a cluster:

1. ``py-spy dump --pid`` on each rank prints its Python stacks: rank 0's main thread is
   in ``all_reduce``, rank 1's in ``read_batch``. This takes ptrace rights over the rank:
   root, ``CAP_SYS_PTRACE`` (a pod's ``securityContext.capabilities.add: [SYS_PTRACE]``),
   or, under Linux's Yama ``ptrace_scope=1`` (most laptops), the rank's own consent,
   which the worker gives with ``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)``.
2. The flight recorder (``TORCH_FR_BUFFER_SIZE`` > 0) keeps each rank's last collectives
   with their sequence numbers and states. The rank that issued fewer is behind; its
   next collective is the one the others wait in. NCCL's watchdog writes the recorder
   by itself on a timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``) and ``torchfrtrace`` reads
   those files. Gloo has no such watchdog, so each rank here runs a thread that writes
   its recorder when a request file appears, through
   ``torch._C._distributed_c10d._dump_fr_trace_json``: a private function, the one the
   watchdog's dump uses, pinned by ``tests/test_hung_rank.py`` so that an upgrade shows.

``python -m ddtk.recovery.hung_rank DIR`` is the worker script. Every process is
started in a session of its own and the whole group is killed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HangReport", "diagnose", "main_frames", "who_is_behind"]

_REQUEST = "dump-recorder"


@dataclass
class HangReport:
    """What :func:`diagnose` saw; ``stacks`` holds py-spy's text or the reason it failed."""

    stacks: dict[int, str] = field(default_factory=dict)
    recorder: dict[int, list[dict]] = field(default_factory=dict)
    behind: int | None = None  # the rank that issued the fewest collectives
    waiting_in: str | None = None  # the collective the other ranks wait in
    seconds: float = 0.0

    def issued(self) -> dict[int, int]:
        """Collectives each rank issued, by the flight recorder."""
        return {rank: len(entries) for rank, entries in self.recorder.items()}


def who_is_behind(recorder: dict[int, list[dict]]) -> tuple[int | None, str | None]:
    """The rank that issued the fewest collectives, and the next one the others issued
    (the one they wait in); ``(None, None)`` when every rank issued as many."""
    issued = {rank: len(entries) for rank, entries in recorder.items()}
    if not issued or len(set(issued.values())) == 1:
        return None, None
    behind, ahead = min(issued, key=issued.get), max(issued, key=issued.get)
    return behind, recorder[ahead][issued[behind]]["profiling_name"]


def main_frames(dump: str) -> list[str]:
    """The frames of the main thread in ``py-spy dump``'s text, innermost first."""
    frames, inside = [], False
    for line in dump.splitlines():
        if line.startswith("Thread "):
            inside = '"MainThread"' in line
        elif inside and line.startswith("    "):
            frames.append(line.strip())
    return frames


def _py_spy_dump(pid: int) -> str:
    from ddtk.profiling.pyspy import PySpyError, _py_spy

    try:
        done = subprocess.run([_py_spy(), "dump", "--pid", str(pid)], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
    except (PySpyError, subprocess.TimeoutExpired) as exc:
        return f"py-spy dump failed: {exc}"
    return done.stdout if done.returncode == 0 else f"py-spy dump failed: {done.stderr.strip()}"


def _wait_for(paths: list[Path], proc: subprocess.Popen, deadline: float, what: str) -> None:
    """Wait until every file of ``paths`` exists; fail at once if the job has ended."""
    while not all(p.exists() for p in paths):
        if proc.poll() is not None:
            tail = (proc.stdout.read() if proc.stdout else "")[-2000:]
            raise RuntimeError(f"the hung-rank job ended (exit status {proc.returncode}) "
                               f"before {what}:\n{tail}")  # fmt: skip
        if time.monotonic() > deadline:
            raise TimeoutError(f"the hung-rank job did not reach {what} in time")
        time.sleep(0.05)


def _read_recorder(path: Path) -> list[dict]:
    keep = ("collective_seq_id", "profiling_name", "input_sizes", "state")
    return [{k: e.get(k) for k in keep} for e in json.loads(path.read_text()).get("entries", [])]


def _stop(proc: subprocess.Popen) -> None:
    """Kill torchrun and its ranks: they run in sessions of their own, not in its group."""
    import psutil

    ranks: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        ranks = psutil.Process(proc.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for rank in ranks:
        with contextlib.suppress(psutil.Error):
            rank.kill()
    psutil.wait_procs(ranks, timeout=10)
    proc.communicate()


def diagnose(hang_step: int = 2, limit_s: float = 90.0) -> HangReport:
    """Start the job, let rank 1 hang at ``hang_step``, look at both ranks, then kill it."""
    import tempfile

    from ddtk.frameworks.launchers import free_port, torchrun_command

    if isinstance(hang_step, bool) or not isinstance(hang_step, int) or hang_step < 0:
        raise ValueError(f"hang_step must be an integer >= 0, got {hang_step!r}")
    t0 = time.monotonic()
    report = HangReport()
    with tempfile.TemporaryDirectory(prefix="ddtk-hung-") as folder:
        out = Path(folder)
        cmd = torchrun_command(2, ["-m", "ddtk.recovery.hung_rank", str(out), "--hang-step",
                                   str(hang_step)], master_port=free_port())  # fmt: skip
        env = dict(os.environ, TORCH_FR_BUFFER_SIZE="256", PYTHONUNBUFFERED="1")
        repo = str(Path(__file__).resolve().parents[2])  # a source checkout without pip install
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)  # fmt: skip
        try:
            deadline = t0 + limit_s
            _wait_for([out / f"hanging_{r}" for r in (0, 1)], proc, deadline, "its hang")
            time.sleep(0.5)  # rank 0 is inside the all-reduce by now
            for rank in (0, 1):
                pid = int((out / f"pid_{rank}").read_text())
                report.stacks[rank] = _py_spy_dump(pid)
            (out / _REQUEST).write_text("")
            files = [out / f"recorder_{r}.json" for r in (0, 1)]
            _wait_for(files, proc, deadline, "its flight-recorder dump")
            report.recorder = {r: _read_recorder(f) for r, f in enumerate(files)}
        finally:
            _stop(proc)
    report.behind, report.waiting_in = who_is_behind(report.recorder)
    report.seconds = time.monotonic() - t0
    return report


def _allow_ptrace() -> None:
    """Let any process of this user ptrace this one (Yama ``ptrace_scope=1``); Linux only."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)  # PR_SET_PTRACER, PR_SET_PTRACER_ANY


def _recorder_thread(out: Path, rank: int) -> None:
    """Write this rank's flight recorder when the request file appears."""
    from torch._C._distributed_c10d import _dump_fr_trace_json

    while not (out / _REQUEST).exists():
        time.sleep(0.05)
    tmp = out / f".recorder_{rank}.json"
    tmp.write_bytes(_dump_fr_trace_json())
    tmp.rename(out / f"recorder_{rank}.json")  # whole, or not there


def read_batch(step: int) -> None:
    """Rank 1's data loading at the hang step: it never returns (a stuck read, a deadlock)."""
    while True:
        time.sleep(1.0)


def train_step(step: int) -> None:
    """One step's collective, as DDP's gradient all-reduce would be."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1024))


def _worker(out: Path, hang_step: int, steps: int) -> None:
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    _allow_ptrace()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    threading.Thread(target=_recorder_thread, args=(out, rank), daemon=True).start()
    (out / f"pid_{rank}").write_text(str(os.getpid()))
    for step in range(steps):
        if step == hang_step:
            (out / f"hanging_{rank}").write_text(str(step))
            if rank == 1:
                read_batch(step)
        train_step(step)
    dist.destroy_process_group()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="ddtk.recovery.hung_rank")
    parser.add_argument("out", type=Path, help="folder for the pids, markers and recorder dumps")
    parser.add_argument("--hang-step", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    _worker(args.out, args.hang_step, max(args.steps, args.hang_step + 1))
    sys.exit(0)
