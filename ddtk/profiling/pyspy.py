"""Python-level profiling of a whole launched job with py-spy: every rank, one flame graph.

``torch.profiler`` sees operators; it does not see the Python between them (a slow
collate function, a metrics call that syncs, a logging line that formats a tensor).
py-spy samples the Python stacks of a process tree from outside, without changing
the program. Started as the parent of the job (``py-spy record -- python ...``) it
needs no root and no ``ptrace`` rights beyond those a parent has over its children;
``--subprocesses`` follows every rank ``ddtk.launch``, ``torchrun`` or a DataLoader
starts, and each stack begins with the process it came from. Under py-spy each rank of
``ddtk.launch`` starts as a new interpreter (``DDTK_LAUNCH_ZYGOTE=0``), so that its stacks
begin with its own ``-m ddtk._rank`` rather than the zygote that ranks are forked from.
py-spy labels a process with the command line it had when first seen: a rank caught
between ``fork`` and ``exec`` keeps its launcher's command line in the profile, though
its stacks (``train_rank`` and below) are its own. Tell ranks apart by their process id.

Formats: ``flamegraph`` (an interactive SVG), ``speedscope`` (JSON for
https://speedscope.app) and ``raw`` (collapsed stacks, one ``frame;frame;frame count``
line per stack), which :func:`hot_functions` reads.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

__all__ = ["FORMATS", "PySpyError", "hot_functions", "py_spy_record"]

FORMATS = ("flamegraph", "speedscope", "raw")


class PySpyError(RuntimeError):
    """py-spy is missing, or it (or the job) failed; the message carries its output."""


def _py_spy() -> str:
    exe = Path(sys.executable).with_name("py-spy")
    found = str(exe) if exe.exists() else shutil.which("py-spy")
    if not found:
        raise PySpyError("py-spy is not installed: pip install py-spy (or ddtk[profiling])")
    return found


def py_spy_record(
    command: Sequence[str],
    out: str | Path,
    *,
    rate: int = 100,
    fmt: str = "flamegraph",
    subprocesses: bool = True,
    idle: bool = False,
    timeout: float | None = 600.0,
) -> Path:
    """Run ``command`` under ``py-spy record`` and write the profile to ``out``.

    Args:
        command: the job, e.g. ``[sys.executable, "-m", "ddtk.examples.cnn_ddtk"]``.
        rate: samples per second per process.
        fmt: one of :data:`FORMATS`.
        subprocesses: follow the ranks the command starts.
        idle: also sample threads that are waiting (shows where ranks block).
        timeout: seconds before the job is stopped (py-spy then writes what it has).

    Raises:
        PySpyError: py-spy is missing, the command failed, or no profile was written.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if isinstance(rate, bool) or not isinstance(rate, int) or not 1 <= rate <= 10_000:
        raise ValueError(f"rate must be an integer from 1 to 10000 samples/s, got {rate!r}")
    if not command:
        raise ValueError("command is empty: give the program to profile and its arguments")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    args = [_py_spy(), "record", "--rate", str(rate), "--format", fmt, "--output", str(out)]
    args += ["--subprocesses"] if subprocesses else []
    args += ["--idle"] if idle else []
    try:
        done = subprocess.run(
            [*args, "--", *command], capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "DDTK_LAUNCH_ZYGOTE": "0"},
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise PySpyError(f"the profiled job ran past {timeout} s and was stopped") from exc
    if done.returncode != 0 or not out.exists():
        tail = (done.stdout + done.stderr)[-2000:]
        raise PySpyError(
            f"py-spy record exited with {done.returncode}; its output ends with:\n{tail}"
        )
    return out


def hot_functions(raw: str | Path, n: int = 10, per_process: bool = False) -> list[tuple[str, int]]:
    """The ``n`` leaf functions with the most samples in a ``raw`` (collapsed) py-spy profile.

    With ``per_process`` the name is prefixed by the process the stack came from: the
    innermost ``process ...`` frame, since ``--subprocesses`` stacks start with the
    chain of parents (``process <launcher>;process <rank>;...``).
    """
    counts: Counter[str] = Counter()
    for line in Path(raw).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        leaf = frames[-1]
        processes = [f for f in frames if f.startswith("process ")]
        if per_process and processes:  # with --subprocesses the stack holds the parent chain
            leaf = f"{processes[-1]} {leaf}"
        counts[leaf] += int(count)
    return counts.most_common(n)
