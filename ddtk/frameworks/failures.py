"""Reproduce, in a few seconds each, the errors lecture 03's troubleshooting section explains.

Each function starts fresh Python processes (so the notebook kernel never holds a broken
Horovod or process group), waits at most ``timeout`` seconds, reaps them, and returns the
tool's own error text, so the lecture quotes what the learner's job would print:

* :func:`horovod_not_initialized`: ``hvd.size()`` before ``hvd.init()``;
* :func:`mismatched_collectives`: two ranks that call different collectives, under
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (which wraps the process group in a checker);
* :func:`sync_batchnorm_on_cpu`: DDP given a CPU module with ``SyncBatchNorm``.
"""

import subprocess
import sys
from collections.abc import Mapping

from ddtk.frameworks.launchers import _kill_group, free_port, tool_env

__all__ = [
    "error_line",
    "horovod_not_initialized",
    "mismatched_collectives",
    "reproduce_all",
    "sync_batchnorm_on_cpu",
]

_HOROVOD = "import horovod.torch as hvd\nhvd.size()\n"

_MISMATCH = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(4))             # rank 0: all-reduce of 4 floats
else:
    dist.broadcast(torch.ones(8), src=0)        # rank 1: a broadcast of 8: a different collective
"""

_SYNC_BN = """
import torch, torch.distributed as dist
from torch import nn
dist.init_process_group("gloo", rank=0, world_size=1)
model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)))
nn.parallel.DistributedDataParallel(model)
"""


def error_line(output: str, marker: str = "Error") -> str:
    """The last line of ``output`` that names an exception (``...Error: message``), without rank prefixes."""
    hits = [line for line in output.splitlines() if marker in line and ":" in line]
    if not hits:
        return output.strip().splitlines()[-1] if output.strip() else ""
    line = hits[-1]
    return line.split("]: ", 1)[1] if line.startswith("[rank") and "]: " in line else line


def _run(code: str, env: Mapping[str, str], timeout: float) -> str:
    """Run ``code`` in a fresh interpreter; its combined output (the group is always reaped)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=tool_env(env), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc, grace=1.0)
        out, _ = proc.communicate()
        out += f"\n(stopped after {timeout:g} s)"
    finally:
        _kill_group(proc, grace=1.0)
    return out


def horovod_not_initialized(timeout: float = 60.0) -> str:
    """The error of a Horovod call made before ``hvd.init()``."""
    return error_line(_run(_HOROVOD, {}, timeout))


def sync_batchnorm_on_cpu(timeout: float = 60.0) -> str:
    """The error DDP raises for a CPU module holding ``SyncBatchNorm`` layers (one rank)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    return error_line(_run(_SYNC_BN, env, timeout))


def mismatched_collectives(timeout: float = 60.0, debug: str = "DETAIL") -> str:
    """Rank 0's error when the two ranks call different collectives (``TORCH_DISTRIBUTED_DEBUG``)."""
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "TORCH_DISTRIBUTED_DEBUG": debug}  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _MISMATCH], env=tool_env(env), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, start_new_session=True,
        ))  # fmt: skip
    outputs = []
    try:
        for proc in procs:
            try:
                outputs.append(proc.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                outputs.append(f"(rank stopped after {timeout:g} s)")
    finally:
        for proc in procs:
            _kill_group(proc, grace=1.0)
    return error_line(outputs[0], "mismatch") or error_line(outputs[0])


def reproduce_all(timeout: float = 60.0) -> dict[str, str]:
    """All three errors, reproduced concurrently (their interpreters start in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    fns = (horovod_not_initialized, mismatched_collectives, sync_batchnorm_on_cpu)
    with ThreadPoolExecutor(len(fns)) as pool:
        futures = {fn.__name__: pool.submit(fn, timeout) for fn in fns}
        return {name: f.result() for name, f in futures.items()}
