"""Build DeepSpeed's CPU shared-memory communication op ahead of the first job that needs it.

On a CPU, ``deepspeed.comm`` JIT-compiles ``deepspeed_shm_comm`` (two C++ files, with
ninja) the first time a process group starts, and caches it under
``~/.cache/torch_extensions``: about 20 s of two cores on a quiet machine, minutes on a
busy one, paid by whichever job comes first. ``make test`` runs this module in the
background before the tests start, so the compile overlaps with them; a job that needs
the op meanwhile waits on DeepSpeed's own build lock rather than compiling it twice.
It calls DeepSpeed's own ``build_shm_op``, so the cached build is the one a job loads,
with this interpreter's ``bin`` first on PATH as the launchers run their ranks
(:func:`ddtk.frameworks.launchers.tool_env`): torch's JIT build runs the first ``ninja``
on PATH, and the venv's ninja (1.13) and Debian's (1.11) record commands differently,
so a build by one is rebuilt by the other.

    python -m ddtk.frameworks.deepspeed_ops
"""

from __future__ import annotations

import os
import time

from ddtk.frameworks.launchers import tool_env


def build() -> str:
    """Build (or load from the cache) the op; say what happened and how long it took."""
    started = time.perf_counter()
    os.environ["PATH"] = tool_env()["PATH"]  # the ninja the ranks will find
    try:
        from deepspeed.comm.torch import build_shm_op
    except ImportError:
        return "DeepSpeed is not installed: nothing to build"
    op = build_shm_op()
    seconds = time.perf_counter() - started
    if op is None:
        return f"this accelerator needs no shared-memory op ({seconds:.1f} s)"
    return f"{op.__name__} ready in {seconds:.1f} s ({op.__file__})"


def main() -> None:
    print(build(), flush=True)


if __name__ == "__main__":
    main()
