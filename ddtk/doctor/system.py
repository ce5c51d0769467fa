"""Probes of the machine beneath the packages: cores and memory, tools, transport, network, faults.

Like the package probes, each returns JSON-ready facts; the ``*_MISSING`` values
stand in for a probe that failed.
"""

from __future__ import annotations

import os
import shutil

from ddtk.doctor.packages import Facts, find_tool


def probe_system() -> Facts:
    """Logical cores, the cores this process may use, and memory."""
    import psutil

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    memory = psutil.virtual_memory()
    return {
        "cpu_count": os.cpu_count(),
        "affinity_count": affinity,
        "memory_total_bytes": int(memory.total),
        "memory_available_bytes": int(memory.available),
        "error": None,
    }


def probe_tools() -> Facts:
    """Launchers and drivers on PATH: ``mpirun`` (MPI jobs) and ``nvidia-smi`` (a GPU driver).

    torch's own MPI support is in the torch facts; ``nvidia-smi`` without CUDA in
    torch means the GPUs are there but this torch cannot use them.
    """
    return {"mpirun": find_tool("mpirun"), "nvidia_smi": shutil.which("nvidia-smi"), "error": None}


def probe_transport() -> Facts:
    """The transport ddtk's own collectives use between local ranks, and why.

    ``setting`` is ``DDTK_TRANSPORT`` (default ``auto``), ``in_force`` what a
    :func:`ddtk.launch` on this machine gets, ``shm_unavailable`` why shared
    memory cannot be used (None when it can) and ``shm_free_bytes`` the room in /dev/shm.
    """
    from ddtk.comm import shm
    from ddtk.comm.context import check_transport

    try:
        setting, error = check_transport(None), None
    except ValueError as exc:
        setting, error = os.environ.get("DDTK_TRANSPORT"), str(exc)
    reason = shm.unsupported_reason()
    free = None
    if reason is None:
        stat = os.statvfs(shm.SHM_DIR)
        free = stat.f_bavail * stat.f_frsize
    in_force = "tcp" if setting == "tcp" or reason or error else "shm"
    return {"setting": setting, "setting_error": error, "in_force": in_force,
            "shm_unavailable": reason, "shm_free_bytes": free, "error": None}  # fmt: skip


def probe_sandbox() -> Facts:
    """Whether ``ddtk course grade`` can confine a graded kernel here, and what is missing."""
    from ddtk.course.grading.jail import confinement

    conf = confinement()
    return {"namespaces": conf.namespaces, "own_user": conf.own_user, "bwrap": conf.bwrap,
            "missing": list(conf.missing), "summary": conf.summary(), "error": None}  # fmt: skip


SANDBOX_MISSING: Facts = {"namespaces": False, "own_user": False, "bwrap": None,
                          "missing": ["not probed"], "summary": "sandbox: not probed"}  # fmt: skip


NETWORK_MISSING: Facts = {"rdma": [], "iperf3": None, "shaping_unavailable": "not probed"}


TRANSPORT_MISSING: Facts = {
    "setting": None, "setting_error": None, "in_force": "tcp", "shm_unavailable": "not probed",
    "shm_free_bytes": None,
}  # fmt: skip


def probe_faults() -> Facts:
    """Recovery facts: the op timeout in force, the restarting launchers, the injectors."""
    from ddtk.faults.model import probe

    return probe()


FAULTS_MISSING: Facts = {
    "op_timeout_env": "DDTK_OP_TIMEOUT",
    "op_timeout": None,
    "op_timeout_error": None,
    "op_timeout_default": True,
    "torchrun": None,
    "horovodrun": None,
    "ray": False,
    "injectors": [],
}
