"""Start a command under hard resource limits, as another user: the last step before a
graded kernel runs (:mod:`~ddtk.course.grading.jail` puts it in front of the kernel).

Run as a script (by path, with ``python -I``, so it imports nothing of ddtk)::

    python -I limits.py [--memory-mb N] [--nproc N] [--fsize-mb N] [--nofile N]
                        [--uid U [--chown FILE]...] -- COMMAND...

It sets each limit as both the soft and the **hard** limit, so the command cannot raise
it again, switches core dumps off, and, with ``--uid``, hands the ``--chown`` files (the
kernel's connection file) to that user, drops every group and switches to that uid and
gid, and sets ``no_new_privs`` (no set-uid program can give privileges back). Then it
*replaces itself* with the command (``exec``), so every process the command starts
inherits all of it.

- ``--memory-mb``: ``RLIMIT_AS``, the address space one process may map. It counts
  reserved space (thread stacks, allocator arenas, mapped files), which is larger than
  resident memory: a kernel that imports torch maps about 4 GiB. The total of a run's
  processes is watched from outside by the grader.
- ``--nproc``: ``RLIMIT_NPROC``, the tasks (processes and threads) of the user. Only
  meaningful with ``--uid``: a fresh uid counts this run alone.
- ``--fsize-mb``: ``RLIMIT_FSIZE``, the largest file a process may write.
- ``--nofile``: ``RLIMIT_NOFILE``, open files per process.

``0`` means no limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import sys

_PR_SET_NO_NEW_PRIVS = 38
_MIB = 1024 * 1024
_LIMITS = {  # option: (resource, unit)
    "--memory-mb": (resource.RLIMIT_AS, _MIB),
    "--nproc": (resource.RLIMIT_NPROC, 1),
    "--fsize-mb": (resource.RLIMIT_FSIZE, _MIB),
    "--nofile": (resource.RLIMIT_NOFILE, 1),
}


def set_hard_limit(which: int, value: int) -> None:
    """Set ``which`` to ``value`` as both soft and hard limit (never above the current hard one)."""
    _soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def apply_limits(megabytes: int) -> None:
    """Limit this process's address space to ``megabytes`` MiB (0: none), hard; no core files."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if megabytes > 0:
        set_hard_limit(resource.RLIMIT_AS, megabytes * _MIB)


def become(uid: int, chown: list[str]) -> None:
    """Give ``chown`` to ``uid``, then switch to ``uid``/``uid`` with no groups and no_new_privs."""
    for path in chown:
        os.chown(path, uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:  # never run as the grader by mistake
        sys.exit(f"limits.py: could not switch to uid {uid}")


def no_new_privs() -> None:
    """Set no_new_privs: exec of a set-uid program no longer raises privileges (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def main(argv: list[str]) -> None:
    """Parse the options (module docstring), apply them and exec the command."""
    usage = (
        "usage: limits.py [--memory-mb N] [--nproc N] [--fsize-mb N] [--uid U [--chown F]] -- CMD"
    )
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        sys.exit(usage)
    split = argv.index("--")
    options, cmd = argv[:split], argv[split + 1 :]
    if len(options) % 2:
        sys.exit(usage)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    uid, chown = None, []
    for name, value in zip(options[::2], options[1::2]):
        if name == "--chown":
            chown.append(value)
            continue
        if name not in _LIMITS and name != "--uid":
            sys.exit(usage)
        if not value.isdigit():
            sys.exit(f"{usage}\n{name} takes a whole number, not {value!r}")
        if name == "--uid":
            uid = int(value)
        elif int(value) > 0:
            which, unit = _LIMITS[name]
            set_hard_limit(which, int(value) * unit)
    if uid is not None:
        become(uid, chown)
    no_new_privs()
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
