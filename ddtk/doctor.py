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

The exit code is 0 when the core of the course (torch with a working gloo
backend) works, and 1 otherwise. Heavy imports (torch, horovod) happen inside the
probes so that ``ddtk --help`` stays fast; Ray is never imported, only looked up.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

Facts = dict[str, Any]

HOROVOD_VERSION = "0.28.1"
HOROVOD_BUILT_FLAGS = ("gloo", "mpi", "nccl", "cuda", "rocm", "ddl", "ccl")

HINT_TORCH = "run `make venv` or `pip install -e .` (installs torch)"
HINT_HOROVOD = (
    f"run `make horovod` (builds Horovod {HOROVOD_VERSION} with Gloo for this torch, "
    "about 4 minutes)"
)
HINT_RAY = "run `make venv` or `pip install -e .[ray]`"
HINT_DEEPSPEED = "run `make venv` or `pip install -e .[deepspeed]`"
HINT_TENSORFLOW = "run `make venv` or `pip install -e .[tensorflow]` (tensorflow with tf-keras)"
HINT_NO_GPU = (
    "no CUDA GPU: the notebooks' NCCL parameters fall back to gloo on CPU "
    "(set `backend='nccl'`, `use_gpu=True` on a GPU machine)"
)


class NotebookLike(Protocol):
    """What :func:`notebook_rows` reads from a catalog entry (see ``ddtk.course.catalog``)."""

    name: str
    path: str
    title: str
    kind: str
    needs: frozenset[str]

    @property
    def exists(self) -> bool: ...


# --------------------------------------------------------------------------- probes


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
    }


# ------------------------------------------------------------- pure logic on facts


def core_ok(facts: Facts) -> bool:
    """True when torch imports and a gloo process group works: what every notebook needs."""
    torch = facts["torch"]
    return bool(torch.get("installed") and torch.get("gloo") and torch.get("gloo_works"))


def gpu_ready(facts: Facts) -> bool:
    """True when torch sees at least one CUDA GPU."""
    torch = facts["torch"]
    return bool(torch.get("cuda_available") and torch.get("gpu_count", 0) > 0)


def backend(facts: Facts) -> str:
    """The process-group backend notebooks should use here: nccl on CUDA GPUs, else gloo."""
    return "nccl" if gpu_ready(facts) and facts["torch"].get("nccl") else "gloo"


def horovod_ready(facts: Facts) -> bool:
    """True when ``horovod.torch`` imports and can run on this machine's backend."""
    hvd = facts["horovod"]
    built = hvd.get("built", {})
    return bool(hvd.get("importable") and (built.get("gloo") or built.get("mpi")))


def torch_hint(facts: Facts) -> str | None:
    """What to do when torch is missing or broken; None when it works."""
    torch = facts["torch"]
    if not torch.get("installed"):
        detail = f" ({torch['error']})" if torch.get("error") else ""
        return f"torch does not import{detail}: {HINT_TORCH}"
    if not torch.get("distributed"):
        return (
            "this torch build has no torch.distributed: install a standard build with `make venv`"
        )
    return None


def gloo_hint(facts: Facts) -> str | None:
    """What to do when gloo is missing or fails its smoke test; None when it works."""
    torch = facts["torch"]
    if not torch.get("installed") or not torch.get("distributed"):
        return None
    if not torch.get("gloo"):
        return "this torch build has no gloo backend: install a standard build with `make venv`"
    if not torch.get("gloo_works"):
        return (
            f"a one-rank gloo group failed ({torch.get('gloo_error')}): if the host name does "
            "not resolve, set `GLOO_SOCKET_IFNAME=lo` (or your network interface)"
        )
    return None


def horovod_hint(facts: Facts) -> str | None:
    """What to do when Horovod is missing, broken or built without a usable controller."""
    hvd = facts["horovod"]
    torch_version = facts["torch"].get("version") or "this torch"
    if not hvd.get("installed"):
        return f"Horovod is not installed: {HINT_HOROVOD}"
    if not hvd.get("importable"):
        return (
            f"Horovod is installed but `horovod.torch` does not import ({hvd.get('error')}); "
            f"it was probably built for another torch: run `make horovod` to rebuild it "
            f"for torch {torch_version}"
        )
    if not horovod_ready(facts):
        return f"Horovod was built without Gloo or MPI: {HINT_HOROVOD}"
    return None


def ray_hint(facts: Facts) -> str | None:
    """What to do when Ray is missing; None when it is installed."""
    return None if facts["ray"].get("installed") else f"Ray is not installed: {HINT_RAY}"


def gpu_hint(facts: Facts) -> str | None:
    """What no GPU means for the course, and what to do if a GPU is present but unused."""
    if gpu_ready(facts):
        if not facts["torch"].get("nccl"):
            return "this torch has no NCCL: GPU notebooks fall back to gloo (install a CUDA build of torch)"
        return None
    if facts["tools"].get("nvidia_smi") and facts["torch"].get("build") == "CPU":
        return (
            "`nvidia-smi` is present but this torch is a CPU build: install a CUDA build of "
            "torch to use the GPUs; until then " + HINT_NO_GPU
        )
    return HINT_NO_GPU


def _package_hint(key: str, what: str, hint: str) -> Callable[[Facts], str | None]:
    def check(facts: Facts) -> str | None:
        return None if facts.get(key, {}).get("installed") else f"{what} is not installed: {hint}"

    return check


NEED_HINTS: dict[str, Callable[[Facts], str | None]] = {
    "ray": ray_hint,
    "deepspeed": _package_hint("deepspeed", "DeepSpeed (with ninja)", HINT_DEEPSPEED),
    "tensorflow": _package_hint("tensorflow", "TensorFlow with tf-keras", HINT_TENSORFLOW),
    "horovod": horovod_hint,
    "gpu": lambda facts: None if gpu_ready(facts) else "needs a CUDA GPU (none found here)",
}


def need_hint(need: str, facts: Facts) -> str | None:
    """Why a notebook's ``need`` is not met here (with what to do), or None when it is."""
    if need not in NEED_HINTS:
        return f"needs {need!r}, which `ddtk doctor` does not know how to check"
    return NEED_HINTS[need](facts)


def _mpi_hint(facts: Facts) -> str | None:
    """MPI is optional in this course: say so, and how Horovod runs without it."""
    if facts["torch"].get("mpi") or not facts["torch"].get("installed"):
        return None
    tail = " (`mpirun` found, but torch cannot use it)" if facts["tools"].get("mpirun") else ""
    return (
        f"torch has no MPI backend{tail}: optional, the course uses gloo/nccl and runs "
        "Horovod with `horovodrun --gloo`"
    )


def _horovodrun_hint(facts: Facts) -> str | None:
    """horovodrun is needed to launch Horovod jobs; say where to find it if it is missing."""
    hvd = facts["horovod"]
    if not hvd.get("importable") or hvd.get("horovodrun"):
        return None
    return (
        "`horovodrun` is neither beside this Python nor on PATH: activate the venv "
        "(`source .venv/bin/activate`) or rerun `make horovod`"
    )


def _cores_hint(facts: Facts) -> str | None:
    """The laptop defaults start two ranks; warn when fewer cores are usable."""
    cores = facts["system"].get("affinity_count") or facts["system"].get("cpu_count")
    if cores is None or cores >= 2:
        return None
    return f"only {cores} usable core: notebooks still run with world_size=2, but slower"


def op_timeout_hint(facts: Facts) -> str | None:
    """A bad ``DDTK_OP_TIMEOUT`` breaks every launch; ``off`` leaves hangs to launch's timeout."""
    faults = facts.get("faults", {})
    env = faults.get("op_timeout_env", "DDTK_OP_TIMEOUT")
    if faults.get("op_timeout_error"):
        return f"{faults['op_timeout_error']}: fix or unset it, or every rank fails at start-up"
    if faults.get("op_timeout") is None:
        return (
            f"{env} is off: a hung peer is only caught by ddtk.launch(timeout=); unset it "
            "(default 300 s) or set a number of seconds to get CollectiveTimeoutError naming "
            "the collective and the missing rank"
        )
    return None


def transport_hint(facts: Facts) -> str | None:
    """A bad ``DDTK_TRANSPORT``, or shared memory asked for (or expected) and not available."""
    t = facts.get("transport") or TRANSPORT_MISSING
    if t.get("setting_error"):
        return f"{t['setting_error']}: fix or unset DDTK_TRANSPORT, or every launch fails"
    if t.get("shm_unavailable"):
        if t.get("setting") == "shm":
            return f"DDTK_TRANSPORT=shm cannot work here ({t['shm_unavailable']}): use auto or tcp"
        return (
            f"ddtk's collectives run over gloo's sockets: {t['shm_unavailable']}. They work, "
            "only slower than over shared memory"
        )
    free = t.get("shm_free_bytes")
    if free is not None and free < 256 << 20:
        return (
            f"/dev/shm has {free >> 20} MiB free: enough for a few ranks, but enlarge it "
            "(docker run --shm-size=1g) for many"
        )
    return None


def hints(facts: Facts) -> list[dict[str, str]]:
    """Every missing piece as ``{"level", "topic", "hint"}``, most serious first.

    ``level`` is ``error`` (the core is broken), ``warn`` (some notebooks cannot run)
    or ``info`` (works, with a caveat).
    """
    checks: list[tuple[str, str, str | None]] = [
        ("error", "torch", torch_hint(facts)),
        ("error", "gloo", gloo_hint(facts)),
        ("warn", "horovod", horovod_hint(facts)),
        ("warn", "horovodrun", _horovodrun_hint(facts)),
        ("warn", "ray", ray_hint(facts)),
        ("info", "gpu", gpu_hint(facts)),
        ("info", "mpi", _mpi_hint(facts)),
        ("info", "cores", _cores_hint(facts)),
        (
            "error" if (facts.get("transport") or {}).get("setting_error") else "info",
            "transport",
            transport_hint(facts),
        ),
        (
            "error" if facts.get("faults", {}).get("op_timeout_error") else "info",
            "faults",
            op_timeout_hint(facts),
        ),
    ]
    return [{"level": lvl, "topic": topic, "hint": hint} for lvl, topic, hint in checks if hint]


def notebook_rows(facts: Facts, catalog: Iterable[NotebookLike]) -> list[dict[str, Any]]:
    """For each notebook: can it run here, on which backend, and if not, why (with hints)."""
    rows = []
    for nb in catalog:
        reasons: list[str] = []
        if not nb.exists:
            reasons.append("not written yet")
        if not core_ok(facts):
            reasons.append("torch + gloo do not work here (see the hints above)")
        reasons += [hint for need in sorted(nb.needs) if (hint := need_hint(need, facts))]
        runs = not reasons
        rows.append(
            {
                "name": nb.name,
                "path": nb.path,
                "title": nb.title,
                "kind": nb.kind,
                "needs": sorted(nb.needs),
                "runs": runs,
                "backend": backend(facts) if runs else None,
                "reasons": reasons,
            }
        )
    return rows


def report(facts: Facts, catalog: Iterable[NotebookLike]) -> dict[str, Any]:
    """The whole report: the facts plus everything derived from them."""
    from ddtk.faults.model import failure_model

    return {
        "core_ok": core_ok(facts),
        "backend": backend(facts),
        "facts": facts,
        "hints": hints(facts),
        "notebooks": notebook_rows(facts, catalog),
        "failure_model": failure_model(),
    }


# ----------------------------------------------------------------------- rendering


def _yes_no(value: Any) -> str:
    """A coloured yes/no cell for rich."""
    return "[green]yes[/]" if value else "[red]no[/]"


def _gib(n_bytes: int | None) -> str:
    return "?" if n_bytes is None else f"{n_bytes / 2**30:.1f} GiB"


def _machine_table(facts: Facts) -> Any:
    """Python, cores and memory, torch and its backends, as one two-column table."""
    from rich.table import Table

    py, torch, sysf, tools = facts["python"], facts["torch"], facts["system"], facts["tools"]
    table = Table(title="This machine", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("ddtk", facts["ddtk"]["version"])
    table.add_row("Python", f"{py.get('version')}  ({py.get('executable')})")
    table.add_row("cores", f"{sysf.get('cpu_count')} logical, {sysf.get('affinity_count')} usable")
    memory = f"{_gib(sysf.get('memory_total_bytes'))} total, {_gib(sysf.get('memory_available_bytes'))} available"
    table.add_row("memory", memory)
    if torch.get("installed"):
        table.add_row("torch", f"{torch['version']} ({torch['build']} build)")
    else:
        table.add_row("torch", f"[red]missing[/] {torch.get('error') or ''}")
    gpus = ", ".join(torch.get("gpus") or []) or "none"
    gpu_error = f"  {torch['gpu_error']}" if torch.get("gpu_error") else ""
    table.add_row(
        "CUDA available", f"{_yes_no(torch.get('cuda_available'))}  GPUs: {gpus}{gpu_error}"
    )
    gloo = _yes_no(torch.get("gloo") and torch.get("gloo_works"))
    table.add_row("gloo", gloo + (f"  {torch['gloo_error']}" if torch.get("gloo_error") else ""))
    nccl_version = f"  (NCCL {torch['nccl_version']})" if torch.get("nccl_version") else ""
    table.add_row("NCCL", _yes_no(torch.get("nccl")) + nccl_version)
    table.add_row(
        "MPI (torch)", f"{_yes_no(torch.get('mpi'))}  mpirun: {tools.get('mpirun') or 'not found'}"
    )
    t = facts.get("transport") or TRANSPORT_MISSING
    why = f"  ({t['shm_unavailable']})" if t.get("shm_unavailable") else ""
    free = f", /dev/shm {_gib(t['shm_free_bytes'])} free" if t.get("shm_free_bytes") else ""
    table.add_row(
        "ddtk transport", f"{t.get('in_force')} (DDTK_TRANSPORT={t.get('setting')}){free}{why}"
    )
    net = facts.get("network") or NETWORK_MISSING
    ports = ", ".join(
        f"{p['device']}:{p['port']} {p.get('state')} {p.get('rate')} {p.get('link_layer')}"
        for p in net.get("rdma") or []
    )
    table.add_row("RDMA ports", ports or "none (NCCL would use sockets between nodes)")
    shaping = net.get("shaping_unavailable")
    table.add_row(
        "network tools",
        f"iperf3: {net.get('iperf3') or 'not found'}; kernel shaping: "
        + ("yes (namespaces + tbf)" if not shaping else f"no ({shaping})"),
    )
    return table


def _tools_table(facts: Facts) -> Any:
    """Horovod (with its build flags), Ray, DeepSpeed and TensorFlow."""
    from rich.table import Table

    hvd, ray = facts["horovod"], facts["ray"]
    table = Table(
        title="Horovod, Ray, DeepSpeed, TensorFlow", show_header=False, title_justify="left"
    )
    table.add_column("what", style="bold")
    table.add_column("value")
    if hvd.get("importable"):
        table.add_row("Horovod", f"{hvd.get('version')}")
        flags = hvd.get("built", {})
        built = " ".join(
            f"{flag}:{'yes' if flags.get(flag) else 'no'}" for flag in HOROVOD_BUILT_FLAGS
        )
        table.add_row("Horovod built with", built)
    elif hvd.get("installed"):
        table.add_row(
            "Horovod", f"[red]broken[/] {hvd.get('version') or ''} {hvd.get('error') or ''}"
        )
    else:
        table.add_row("Horovod", "[yellow]not installed[/]")
    table.add_row("horovodrun", hvd.get("horovodrun") or "not found")
    ray_text = ray.get("version") if ray.get("installed") else "[yellow]not installed[/]"
    table.add_row("Ray", str(ray_text))
    for key, label in (("deepspeed", "DeepSpeed"), ("tensorflow", "TensorFlow")):
        pkg = facts.get(key, {})
        versions = ", ".join(f"{n} {v or 'missing'}" for n, v in pkg.get("versions", {}).items())
        table.add_row(
            label, versions if pkg.get("installed") else f"[yellow]not installed[/] {versions}"
        )
    return table


def _faults_table(facts: Facts) -> Any:
    """The op timeout in force, the launchers that restart a group, and the injectors."""
    from rich.table import Table

    faults = facts.get("faults", {})
    table = Table(title="Fault tolerance", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    if faults.get("op_timeout_error"):
        timeout = f"[red]invalid[/] {faults['op_timeout_error']}"
    elif faults.get("op_timeout") is None:
        timeout = "[yellow]off[/] (hangs end only at launch's timeout)"
    else:
        where = "default" if faults.get("op_timeout_default") else "from the environment"
        timeout = f"{faults['op_timeout']:g} s ({where})"
    table.add_row(f"op timeout ({faults.get('op_timeout_env', 'DDTK_OP_TIMEOUT')})", timeout)
    for tool in ("torchrun", "horovodrun"):
        table.add_row(tool, faults.get(tool) or "[yellow]not found[/]")
    table.add_row("Ray Train", _yes_no(faults.get("ray")))
    table.add_row("injectors", ", ".join(faults.get("injectors") or []) or "none")
    return table


def _failure_model_table(cases: Sequence[dict[str, str]]) -> Any:
    """What is guaranteed when something breaks, and what is lost."""
    from rich.table import Table

    table = Table(title="Failure model", title_justify="left")
    for column in ("event", "detected as", "then", "lost"):
        table.add_column(column, style="bold" if column == "event" else None)
    for case in cases:
        table.add_row(case["event"], case["detected_as"], case["then"], case["lost"])
    return table


def _hints_table(items: Sequence[dict[str, str]]) -> Any:
    from rich.table import Table

    style = {"error": "bold red", "warn": "yellow", "info": "cyan"}
    table = Table(title="Hints", title_justify="left")
    table.add_column("level")
    table.add_column("topic", style="bold")
    table.add_column("what to do")
    for item in items:
        table.add_row(f"[{style[item['level']]}]{item['level']}[/]", item["topic"], item["hint"])
    return table


def _notebooks_table(rows: Sequence[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="Course notebooks", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("title")
    table.add_column("runs here")
    table.add_column("backend / why not")
    for row in rows:
        verdict = "[green]yes[/]" if row["runs"] else "[red]no[/]"
        detail = row["backend"] if row["runs"] else "; ".join(row["reasons"])
        table.add_row(row["name"], row["title"], verdict, detail)
    return table


def render(rep: dict[str, Any], console: Any = None) -> None:
    """Print the report as rich tables."""
    from rich.console import Console

    console = console or Console()
    facts = rep["facts"]
    console.print(_machine_table(facts))
    console.print(_tools_table(facts))
    if rep["hints"]:
        console.print(_hints_table(rep["hints"]))
    console.print(_notebooks_table(rep["notebooks"]))
    console.print(_faults_table(facts))
    console.print(_failure_model_table(rep["failure_model"]))
    if rep["core_ok"]:
        console.print(
            f"[green]core OK[/]: torch + gloo work; notebooks use backend={rep['backend']}"
        )
    else:
        console.print("[bold red]core broken[/]: torch + gloo do not work here (see the hints)")


# ----------------------------------------------------------------------------- CLI


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


if __name__ == "__main__":
    sys.exit(main())
