"""Start TensorFlow ``MultiWorkerMirroredStrategy`` workers on this machine and collect their results.

TensorFlow's multi-worker strategy has no launcher of its own: every worker is
an ordinary process that finds the others through ``TF_CONFIG``. Here each one
is ``python -m ddtk.examples.cnn_tf --workers host:port,... --index i``, on
ports free a moment before. TensorFlow never runs in the caller's process (a
notebook kernel with torch in it): the workers are separate processes with
``TF_USE_LEGACY_KERAS=1``. Their output is streamed live as ``[worker i] ...``;
if one fails or the time runs out, all of them are stopped (process groups
killed) and :class:`~ddtk.frameworks.launchers.LauncherError` says which.

On a cluster the same module runs once per node, with ``--workers`` listing the
nodes (``node1:2222,node2:2222``) and ``--index`` the node's position.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ddtk.frameworks.launchers import LauncherError, _kill_group, free_port, tool_env

TF_ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
_NOISE = ("I0000 ", "W0000 ", "E0000 ", "WARNING: All log messages before absl")


def _pump(proc: subprocess.Popen, prefix: str, sink: list[str], echo: bool) -> None:
    """Forward one worker's lines, prefixed, dropping TensorFlow's start-up log chatter."""
    for raw in proc.stdout:  # type: ignore[union-attr]
        line = raw.rstrip("\n")
        sink.append(f"{prefix} {line}")
        if echo and not line.startswith(_NOISE):
            print(f"{prefix} {line}", flush=True)


def run_workers(
    world_size: int = 2,
    epochs: int = 2,
    batch_size: int = 64,
    lr: float = 0.05,
    extra_args: Sequence[str] = (),
    timeout: float = 180.0,
    echo: bool = True,
    module: str = "ddtk.examples.cnn_tf",
) -> list[dict]:
    """Train with ``world_size`` MWMS workers; return each worker's JSON report, in index order.

    Each report has the validation ``loss`` and ``accuracy``, ``images_per_s`` of
    the last epoch (all workers), ``train_loss`` per epoch (identical on every
    worker when they run in lock-step), ``epoch_seconds`` and ``world_size``.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    workers = ",".join(f"localhost:{free_port()}" for _ in range(world_size))
    folder = tempfile.TemporaryDirectory(prefix="ddtk-tf-")
    out = Path(folder.name)
    procs, threads, lines = [], [], []
    try:
        for i in range(world_size):
            cmd = [sys.executable, "-m", module, "--workers", workers, "--index", str(i),
                   "--epochs", str(epochs), "--batch-size", str(batch_size), "--lr", str(lr),
                   "--json", str(out / f"worker{i}.json"), *extra_args]  # fmt: skip
            proc = subprocess.Popen(
                cmd, env=tool_env(TF_ENV), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True,
            )  # fmt: skip
            procs.append(proc)
            t = threading.Thread(target=_pump, args=(proc, f"[worker {i}]", lines, echo), daemon=True)
            t.start()
            threads.append(t)
        _wait_all(procs, timeout, lines)
    finally:
        for proc in procs:
            _kill_group(proc, grace=2.0)
        for t in threads:
            t.join(5)
    with folder:
        return [json.loads((out / f"worker{i}.json").read_text()) for i in range(world_size)]


def _wait_all(procs: list[subprocess.Popen], timeout: float, lines: list[str]) -> None:
    """Wait for every worker; stop at the first failure or at the deadline, naming the worker."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            what = (
                f"worker {failed[0]} exited with {procs[failed[0]].returncode}"
                if failed
                else f"the workers ran past {timeout:g} s"
            )
            tail = "\n".join(line for line in lines[-40:] if "I0000" not in line)
            raise LauncherError(f"MultiWorkerMirroredStrategy run failed: {what}. Last lines:\n{tail}")
        time.sleep(0.1)
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        tail = "\n".join(lines[-40:])
        raise LauncherError(f"worker {failed[0]} exited with {procs[failed[0]].returncode}:\n{tail}")
