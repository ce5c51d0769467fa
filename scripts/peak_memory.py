"""Peak memory of a command's whole process tree: what a learner's server must hold for a lab.

Why: a JupyterHub server (deploy/jupyterhub/values.yaml) gets a memory guarantee and a
limit; the kernel is only one process of a lab, which also starts ranks, a Ray cluster
(GCS, raylets, workers) or ``horovodrun``. Kubernetes counts the memory of all of them
against the limit, and a memory-backed ``/dev/shm`` (Ray's object store, NCCL and gloo
buffers) counts too. This samples the tree and reports what it peaked at.

Usage::

    python scripts/peak_memory.py --json build/peak-lab01.json -- \\
        .venv/bin/python -m pytest --nbval-lax -p no:cacheprovider solutions/lab01-ray-train.ipynb

Each sample (every ``--interval`` seconds) walks the command's process and its
descendants, plus any process in a session one of them leads (a daemon that outlives
its parent, such as a Ray agent, stays in its session), and adds up:

- ``pss``: proportional set size; a page shared by N processes counts 1/N in each, so the
  sum is the tree's real footprint (the closest figure to what the memory cgroup charges
  for the processes' own pages);
- ``rss``: resident set size; shared pages (torch's libraries in every rank) count once
  per process, so this overstates the footprint;
- ``shm``: bytes used in ``/dev/shm`` above what was used before the command started
  (Ray's object store, shared-memory transports), which a memory-backed ``emptyDir``
  charges to the Pod;
- ``threads``: every process's threads, what a Pod's PID limit (the kubelet's
  ``podPidsLimit``) counts.

Peak of ``pss + shm`` is the figure to size a server's memory limit from. PSS needs
``/proc/<pid>/smaps_rollup``, readable for processes of the same user. When the command
exits, whatever it left running in those sessions is listed and stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

SHM = "/dev/shm"


@dataclass
class Peaks:
    """The largest value each figure reached, and when (seconds after the start)."""

    pss_bytes: int = 0
    rss_bytes: int = 0
    shm_bytes: int = 0
    pss_plus_shm_bytes: int = 0
    pss_plus_shm_at_s: float = 0.0
    processes: int = 0
    threads: int = 0
    samples: int = 0
    seconds: float = 0.0
    returncode: int | None = None
    left_running: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _tree(root: psutil.Process, sessions: set[int]) -> list[psutil.Process]:
    """``root``, its descendants, and every process in a session one of them leads.

    ``sessions`` gathers the sessions seen so far (the command's own, a Jupyter kernel's),
    so a daemon whose parent has exited is still found on the next sample.
    """
    procs = {root.pid: root}
    try:
        for child in root.children(recursive=True):
            procs[child.pid] = child
    except psutil.NoSuchProcess:
        pass
    sessions.update(pid for pid in procs if _sid(pid) == pid)
    for proc in psutil.process_iter():
        if proc.pid not in procs and _sid(proc.pid) in sessions:
            procs[proc.pid] = proc
    return list(procs.values())


def _memory(procs: list[psutil.Process]) -> tuple[int, int, int, int]:
    """(PSS sum, RSS sum, processes, threads); processes that ended meanwhile are skipped."""
    pss = rss = counted = threads = 0
    for proc in procs:
        try:
            info = proc.memory_full_info()
            threads += proc.num_threads()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        pss += getattr(info, "pss", info.rss)
        rss += info.rss
        counted += 1
    return pss, rss, counted, threads


def _stop_leftovers(sessions: set[int]) -> list[str]:
    """Stop what is still running in ``sessions`` (TERM, then KILL after 5 s); their names."""
    left = []
    for proc in psutil.process_iter(["name", "status"]):
        if _sid(proc.pid) in sessions and proc.info["status"] != psutil.STATUS_ZOMBIE:
            left.append(proc)
    for proc in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(left, timeout=5)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    return sorted(f"{p.pid} {p.info['name']}" for p in left)


def _shm_used() -> int:
    try:
        return shutil.disk_usage(SHM).used
    except OSError:
        return 0


def measure(command: list[str], interval: float = 0.5) -> Peaks:
    """Run ``command`` in a new session and sample its tree until it exits."""
    if not command:
        raise ValueError("no command to measure: give it after --")
    shm_before = _shm_used()
    peaks = Peaks(command=command)
    start = time.monotonic()
    proc = subprocess.Popen(command, start_new_session=True)
    root = psutil.Process(proc.pid)
    sessions = {proc.pid}
    while True:
        pss, rss, counted, threads = _memory(_tree(root, sessions))
        shm = max(0, _shm_used() - shm_before)
        now = time.monotonic() - start
        peaks.samples += 1
        peaks.pss_bytes = max(peaks.pss_bytes, pss)
        peaks.rss_bytes = max(peaks.rss_bytes, rss)
        peaks.shm_bytes = max(peaks.shm_bytes, shm)
        peaks.processes = max(peaks.processes, counted)
        peaks.threads = max(peaks.threads, threads)
        if pss + shm > peaks.pss_plus_shm_bytes:
            peaks.pss_plus_shm_bytes, peaks.pss_plus_shm_at_s = pss + shm, round(now, 1)
        if proc.poll() is not None:
            break
        time.sleep(interval)
    peaks.returncode = proc.returncode
    peaks.seconds = round(time.monotonic() - start, 1)
    peaks.left_running = _stop_leftovers(sessions)
    return peaks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--json", type=Path, help="also write the peaks here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.interval <= 0:
        parser.error(f"--interval must be positive, got {args.interval}")
    try:
        peaks = measure(command, args.interval)
    except ValueError as exc:
        parser.error(str(exc))
    mib = 1 << 20
    print(
        f"peak PSS {peaks.pss_bytes / mib:.0f} MiB, RSS {peaks.rss_bytes / mib:.0f} MiB, "
        f"/dev/shm {peaks.shm_bytes / mib:.0f} MiB, PSS+shm {peaks.pss_plus_shm_bytes / mib:.0f} MiB "
        f"at {peaks.pss_plus_shm_at_s} s; at most {peaks.processes} processes and "
        f"{peaks.threads} threads; {peaks.seconds} s, exit {peaks.returncode}; "
        f"left running (stopped): {', '.join(peaks.left_running) or 'nothing'}",
        file=sys.stderr,
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(peaks), indent=1) + "\n")
    return peaks.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
