"""Leave a rank process without the interpreter's teardown, where a library aborts in it.

torch 2.13's ``DistributedDataParallel`` on gloo can abort in C++ static
destructors after the script is done: about one DDP process in ten died with
"terminate called without an active exception" (SIGABRT) once ``main`` had
returned, its files written and the process group destroyed (ddtk's own
``DataParallel`` and Horovod, on the same machine, never did in 16 runs each).
``torchrun`` then reports the job as failed, or spends a restart on it. Scripts
that use DDP call :func:`exit_without_static_destructors` as their last statement.
"""

from __future__ import annotations

import os
import sys


def exit_without_static_destructors(code: int = 0) -> None:
    """Flush stdout and stderr, then ``os._exit(code)``: no atexit handlers, no C++ destructors.

    Call it only when nothing is left to do: files closed, the process group destroyed.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
