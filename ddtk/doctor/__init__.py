"""``ddtk doctor``: what this machine can run, and what to do about what it cannot.

The command works in three steps, each its own function so that the logic can be
tested without the machine it describes:

1. :func:`collect` probes the machine and returns plain facts (a JSON-ready dict):
   Python, torch and its backends (gloo, NCCL, MPI), GPUs, Horovod and the
   controllers and operations it was built with, Ray, cores and memory. Every probe
   catches its own failures and records the error text, so one broken package
   never hides the rest of the report.
2. :func:`hints` and :func:`notebook_rows` are pure functions of those facts: the
   first turns each missing piece into an actionable hint, the second says for each
   course notebook whether it can run here, on which backend, or why not.
3. :func:`render` prints the report as rich tables; ``--json`` prints it as JSON.

The probes are in :mod:`ddtk.doctor.packages` (Python packages) and
:mod:`ddtk.doctor.system` (the machine beneath them; the network probe and the sysfs
root it reads stay here, beside :func:`collect`), the logic on facts in
:mod:`ddtk.doctor.advice`, the tables in :mod:`ddtk.doctor.tables`; every public
name of those modules is importable from ``ddtk.doctor``.

The exit code is 0 when the core of the course (torch with a working gloo
backend) works, and 1 otherwise. Heavy imports (torch, horovod) happen inside the
probes so that ``ddtk --help`` stays fast; Ray is never imported, only looked up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddtk.doctor.advice import (
    HINT_DEEPSPEED,
    HINT_HOROVOD,
    HINT_NO_GPU,
    HINT_RAY,
    HINT_TENSORFLOW,
    HINT_TORCH,
    NEED_HINTS,
    NotebookLike,
    backend,
    core_ok,
    gloo_hint,
    gpu_hint,
    gpu_ready,
    hints,
    horovod_hint,
    horovod_ready,
    need_hint,
    notebook_rows,
    op_timeout_hint,
    ray_hint,
    report,
    torch_hint,
    transport_hint,
)
from ddtk.doctor.packages import (
    HOROVOD_BUILT_FLAGS,
    HOROVOD_VERSION,
    TORCH_MISSING,
    Facts,
    _safe,
    find_tool,
    probe_horovod,
    probe_packages,
    probe_python,
    probe_ray,
    probe_torch,
)
from ddtk.doctor.system import (
    FAULTS_MISSING,
    NETWORK_MISSING,
    SANDBOX_MISSING,
    TRANSPORT_MISSING,
    probe_faults,
    probe_sandbox,
    probe_system,
    probe_tools,
    probe_transport,
)
from ddtk.doctor.tables import render

__all__ = [
    "FAULTS_MISSING",
    "HINT_DEEPSPEED",
    "HINT_HOROVOD",
    "HINT_NO_GPU",
    "HINT_RAY",
    "HINT_TENSORFLOW",
    "HINT_TORCH",
    "HOROVOD_BUILT_FLAGS",
    "HOROVOD_VERSION",
    "NEED_HINTS",
    "NETWORK_MISSING",
    "RDMA_SYSFS",
    "SANDBOX_MISSING",
    "TORCH_MISSING",
    "TRANSPORT_MISSING",
    "Facts",
    "NotebookLike",
    "add_parser",
    "backend",
    "collect",
    "configure",
    "core_ok",
    "find_tool",
    "gloo_hint",
    "gpu_hint",
    "gpu_ready",
    "hints",
    "horovod_hint",
    "horovod_ready",
    "main",
    "need_hint",
    "notebook_rows",
    "op_timeout_hint",
    "probe_faults",
    "probe_horovod",
    "probe_network",
    "probe_packages",
    "probe_python",
    "probe_ray",
    "probe_sandbox",
    "probe_system",
    "probe_tools",
    "probe_torch",
    "probe_transport",
    "ray_hint",
    "render",
    "report",
    "run",
    "torch_hint",
    "transport_hint",
]


RDMA_SYSFS = Path("/sys/class/infiniband")


def probe_network() -> Facts:
    """What this machine has for lecture 04: RDMA ports, ``iperf3``, and kernel shaping.

    ``rdma`` lists the ports under ``/sys/class/infiniband`` (device, port, state,
    rate, link layer: what ``ibstat`` prints); an empty list means NCCL would fall back
    to sockets between nodes. ``shaping_unavailable`` says why
    :class:`ddtk.net.shaping.ShapedNetwork` cannot run here (None when it can).
    """
    from ddtk.net.shaping import unavailable_reason

    ports = []
    root = RDMA_SYSFS
    for port in sorted(root.glob("*/ports/*")) if root.is_dir() else []:

        def read(name: str, port: Path = port) -> str | None:
            f = port / name
            return f.read_text().strip() if f.is_file() else None

        ports.append({"device": port.parent.parent.name, "port": port.name, "state": read("state"),
                      "rate": read("rate"), "link_layer": read("link_layer")})  # fmt: skip
    return {"rdma": ports, "iperf3": shutil.which("iperf3"),
            "shaping_unavailable": unavailable_reason(), "error": None}  # fmt: skip


def collect() -> Facts:
    """Probe this machine and return every fact the report is built from (JSON-ready)."""
    from ddtk._version import __version__

    return {
        "ddtk": {"version": __version__},
        "python": _safe(
            probe_python, {"version": None, "executable": sys.executable, "platform": None}
        ),
        "torch": _safe(probe_torch, TORCH_MISSING),
        "tools": _safe(probe_tools, {"mpirun": None, "nvidia_smi": None}),
        "horovod": _safe(
            probe_horovod,
            {
                "installed": False,
                "version": None,
                "importable": False,
                "built": {},
                "horovodrun": None,
            },
        ),
        "ray": _safe(probe_ray, {"installed": False, "version": None}),
        "deepspeed": _safe(lambda: probe_packages("deepspeed", "ninja"), {"installed": False}),
        "tensorflow": _safe(lambda: probe_packages("tensorflow", "tf-keras"), {"installed": False}),
        "system": _safe(
            probe_system,
            {
                "cpu_count": os.cpu_count(),
                "affinity_count": None,
                "memory_total_bytes": None,
                "memory_available_bytes": None,
            },
        ),
        "faults": _safe(probe_faults, FAULTS_MISSING),
        "transport": _safe(probe_transport, TRANSPORT_MISSING),
        "network": _safe(probe_network, NETWORK_MISSING),
        "sandbox": _safe(probe_sandbox, SANDBOX_MISSING),
    }


def run(args: argparse.Namespace) -> int:
    """Handler of ``ddtk doctor``: probe, print, and return 0 if the core works, else 1."""
    from ddtk.course.catalog import NOTEBOOKS

    rep = report(collect(), NOTEBOOKS)
    if getattr(args, "json", False):
        print(json.dumps(rep, indent=2))
    else:
        render(rep)
    return 0 if rep["core_ok"] else 1


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the doctor's options to ``parser`` and make :func:`run` its handler."""
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``doctor`` on the ``ddtk`` command's sub-parsers."""
    parser = subparsers.add_parser(
        "doctor",
        help="check what this machine can run (torch, gloo/NCCL, GPUs, Horovod, Ray)",
        description="Probe this machine and say which course notebooks can run here.",
    )
    return configure(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the doctor on its own: ``python -m ddtk.doctor [--json]``."""
    parser = configure(argparse.ArgumentParser(prog="ddtk doctor"))
    args = parser.parse_args(argv)
    return args.func(args)
