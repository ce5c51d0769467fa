"""Probes of the Python packages the course runs on: Python, torch (gloo, NCCL, MPI, GPUs), Horovod, Ray.

Each probe returns plain facts (a JSON-ready dict) and catches its own failures,
recording the error text, so one broken package never hides the rest of the
report. torch and Horovod are imported inside their probes, so that ``ddtk --help``
stays fast; Ray, DeepSpeed and TensorFlow are only looked up, never imported.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Facts = dict[str, Any]
"""What a probe returns: plain, JSON-ready values by name."""


HOROVOD_VERSION = "0.28.1"


HOROVOD_BUILT_FLAGS = ("gloo", "mpi", "nccl", "cuda", "rocm", "ddl", "ccl")


def _error_text(exc: BaseException) -> str:
    """One line that names the exception and its message."""
    return f"{type(exc).__name__}: {exc}".strip()


def _safe(probe: Callable[[], Facts], default: Facts) -> Facts:
    """Run one probe; on any exception return ``default`` with the error recorded."""
    try:
        return probe()
    except Exception as exc:  # a doctor reports failures, it never raises them
        return {**default, "error": _error_text(exc)}


def _dist_version(name: str) -> str | None:
    """Installed version of a distribution, read from its metadata without importing it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def find_tool(name: str) -> str | None:
    """Path of a command: beside this interpreter first (an unactivated venv), then on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def probe_python() -> Facts:
    """Interpreter version, executable and platform."""
    return {
        "version": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "error": None,
    }


def _gloo_smoke_test() -> None:
    """Build a one-rank gloo process group and all-reduce a tensor through it.

    The group is created directly, not through ``init_process_group``, so the check
    leaves no global state behind and also works inside a process that already has
    a default group. It fails where gloo cannot open a device (for example when the
    host name does not resolve).
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))
    tensor = torch.ones(4)
    group.allreduce([tensor]).wait()
    if not torch.equal(tensor, torch.ones(4)):
        raise RuntimeError(f"one-rank gloo all_reduce returned {tensor.tolist()}")


def _gpu_facts(torch: Any) -> Facts:
    """CUDA availability, GPU names and the NCCL version (when CUDA is present)."""
    available = bool(torch.cuda.is_available())
    count = int(torch.cuda.device_count()) if available else 0
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    nccl_version = None
    if available and torch.distributed.is_nccl_available():
        version = torch.cuda.nccl.version()
        nccl_version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return {
        "cuda_available": available,
        "gpu_count": count,
        "gpus": names,
        "nccl_version": nccl_version,
    }


def probe_torch() -> Facts:
    """torch version and build, GPUs, and which process-group backends it offers."""
    import torch
    import torch.distributed as dist

    if torch.version.cuda:
        build = f"CUDA {torch.version.cuda}"
    elif getattr(torch.version, "hip", None):
        build = f"ROCm {torch.version.hip}"
    else:
        build = "CPU"
    distributed = dist.is_available()
    facts: Facts = {
        "installed": True,
        "version": torch.__version__,
        "build": build,
        "cuda_version": torch.version.cuda,
        "distributed": distributed,
        "gloo": distributed and dist.is_gloo_available(),
        "gloo_works": False,
        "gloo_error": None,
        "nccl": distributed and dist.is_nccl_available(),
        "mpi": distributed and dist.is_mpi_available(),
        "cuda_available": False,
        "gpu_count": 0,
        "gpus": [],
        "nccl_version": None,
        "gpu_error": None,
        "error": None,
    }
    try:
        facts.update(_gpu_facts(torch))
    except Exception as exc:  # a broken driver must not hide that torch and gloo work
        facts["gpu_error"] = _error_text(exc)
    if facts["gloo"]:
        try:
            _gloo_smoke_test()
            facts["gloo_works"] = True
        except Exception as exc:
            facts["gloo_error"] = _error_text(exc)
    return facts


TORCH_MISSING: Facts = {
    "installed": False,
    "version": None,
    "build": None,
    "cuda_version": None,
    "distributed": False,
    "gloo": False,
    "gloo_works": False,
    "gloo_error": None,
    "nccl": False,
    "mpi": False,
    "cuda_available": False,
    "gpu_count": 0,
    "gpus": [],
    "nccl_version": None,
    "gpu_error": None,
    "error": None,
}


def probe_horovod() -> Facts:
    """Horovod's version, whether ``horovod.torch`` imports, and what it was built with."""
    facts: Facts = {
        "installed": _dist_version("horovod") is not None,
        "version": _dist_version("horovod"),
        "importable": False,
        "built": {},
        "horovodrun": find_tool("horovodrun"),
        "error": None,
    }
    if not facts["installed"] and importlib.util.find_spec("horovod") is None:
        return facts
    try:
        import horovod.torch as hvd
    except Exception as exc:  # e.g. an extension built against another torch
        facts["error"] = _error_text(exc)
        return facts
    facts["installed"] = True
    facts["importable"] = True
    facts["version"] = facts["version"] or getattr(hvd, "__version__", None)
    facts["built"] = {flag: bool(getattr(hvd, f"{flag}_built")()) for flag in HOROVOD_BUILT_FLAGS}
    return facts


def probe_ray() -> Facts:
    """Ray's version from its metadata; Ray itself is not imported (that takes seconds)."""
    version = _dist_version("ray")
    found = version is not None or importlib.util.find_spec("ray") is not None
    return {"installed": found, "version": version, "error": None}


def probe_packages(*names: str) -> Facts:
    """Versions of optional packages from their metadata, without importing them.

    DeepSpeed and TensorFlow take seconds to import, and TensorFlow must never be
    imported beside torch; the course runs both in their own processes.
    """
    versions = {name: _dist_version(name) for name in names}
    return {"installed": all(versions.values()), "versions": versions, "error": None}
