"""Remove the shared-memory buffers of DeepSpeed's CPU all-reduce when a job ends.

On CPU, DeepSpeed's ``deepspeed_shm_comm`` op gives every rank a 69 MB segment,
``/dev/shm/deepspeed_allreduce_buffer_{uid}_{master_addr}_{master_port}_{rank}``, and
never unlinks it: each finished job would leave its ranks' segments in memory until the
next reboot. A recipe calls :func:`remove_shm_buffers` after its last collective and
``destroy_process_group()``, when no rank maps the segments any more (mapped ones would
survive the unlink until their process exits anyway).
"""

from __future__ import annotations

import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer"


def shm_buffer(rank: int, port: str | int, uid: int | None = None) -> list[Path]:
    """This user's segments of ``rank`` in the job whose rendezvous port is ``port``."""
    uid = os.getuid() if uid is None else uid
    return sorted(SHM_DIR.glob(f"{PREFIX}_{uid}_*_{port}_{rank}"))


def remove_shm_buffers() -> int:
    """Unlink this rank's segment of the job in this process's environment; return how many."""
    rank, port = os.environ.get("RANK"), os.environ.get("MASTER_PORT")
    if rank is None or port is None:
        return 0
    removed = 0
    for path in shm_buffer(int(rank), port):
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed


__all__ = ["remove_shm_buffers", "shm_buffer"]
