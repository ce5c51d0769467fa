"""Pure logic on the doctor's facts: what works, what to do about what does not, which notebooks run.

Every function here takes the facts :func:`ddtk.doctor.collect` returns and
touches nothing else, so the logic is tested on crafted facts without the
machine it describes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ddtk.doctor.packages import HOROVOD_VERSION, Facts
from ddtk.doctor.system import TRANSPORT_MISSING

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
