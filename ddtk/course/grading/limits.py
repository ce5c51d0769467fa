"""Start a command under an address-space limit: the wrapper ``ddtk course grade`` puts
in front of each grading kernel.

Run as a script (by path, so it imports nothing of ddtk)::

    python limits.py MEGABYTES -- KERNEL COMMAND...

It sets ``RLIMIT_AS`` (the virtual address space one process may map) to ``MEGABYTES``
MiB, switches core dumps off, and then *replaces itself* with the command (``exec``), so
the kernel keeps this process's id and every process it starts inherits both limits.
The limit is per process, not a total: a kernel and each of its workers may each map
that much. Python code that asks for more gets ``MemoryError`` in the cell that asked;
native code may abort instead, which is a dead kernel. ``0`` means no limit.

No cgroup is needed, so it works unprivileged and in containers; the price is that the
limit counts reserved address space (thread stacks, allocator arenas, mapped files),
which is larger than resident memory: a kernel that imports torch maps about 4 GiB.
"""

from __future__ import annotations

import os
import resource
import sys


def apply_limits(megabytes: int) -> None:
    """Limit this process's address space to ``megabytes`` MiB (0: no limit) and disable core files."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if megabytes > 0:
        limit = megabytes * 1024 * 1024
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def main(argv: list[str]) -> None:
    """Parse ``MEGABYTES -- COMMAND...``, apply the limits and exec the command."""
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        sys.exit("usage: limits.py MEGABYTES -- COMMAND [ARGS...]")
    apply_limits(int(argv[0]))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
