"""The failure model: what ddtk guarantees when something breaks, and what is lost.

One table, shared by ``ddtk doctor`` (its *Fault tolerance* section) and the
docs, so the promise printed to learners is the one the tests check. Each
:class:`FailureCase` names an event, how it is detected, what happens next and
what work is lost. The short version: a run killed at any moment resumes from
its last committed checkpoint and loses at most the steps since that commit.

:func:`probe` reports what this machine offers for recovery: the per-operation
timeout in force (``DDTK_OP_TIMEOUT``) and the launchers that restart a failed
group (``torchrun``, ``horovodrun``, Ray).

>>> from ddtk.faults.model import FAILURE_MODEL
>>> [case.event for case in FAILURE_MODEL][:2]
['a rank hangs', 'a rank dies']
>>> all(case.lost for case in FAILURE_MODEL)
True
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["FAILURE_MODEL", "INJECTORS", "FailureCase", "failure_model", "probe"]

INJECTORS: dict[str, str] = {
    "kill_at_step": "SIGKILL a rank at a step",
    "raise_at_step": "raise an exception inside a rank at a step",
    "straggler": "make a rank sleep every k steps",
    "hang": "make a rank stop talking at a step (the op timeout fires)",
    "corrupt_file": "flip bytes of a checkpoint file",
    "truncate_file": "cut a checkpoint file short",
    "crash_during": "crash part-way through a function (e.g. between shard writes and commit)",
}
"""The injectors of :mod:`ddtk.faults`, each with what it breaks."""


@dataclass(frozen=True)
class FailureCase:
    """One kind of failure: how it shows, what follows, and what it costs."""

    event: str
    detected_as: str
    then: str
    lost: str


FAILURE_MODEL: tuple[FailureCase, ...] = (
    FailureCase(
        "a rank hangs",
        "CollectiveTimeoutError naming the collective, the rank and the rank(s) it waited for, "
        "after op_timeout without progress (at most about 1.5 x op_timeout)",
        "every rank ends; ddtk.launch raises RankError; no rank process outlives launch",
        "the process group; the steps since the last committed checkpoint",
    ),
    FailureCase(
        "a rank dies",
        "PeerLostError on the ranks talking to it (gloo closes the connection, well under "
        "a second here), or CollectiveTimeoutError after op_timeout",
        "the launcher (torchrun, Ray Train, Horovod Elastic) restarts the group, which "
        "resumes from ddtk.checkpoint.latest()",
        "the steps since the last committed checkpoint",
    ),
    FailureCase(
        "killed while writing a checkpoint",
        "the checkpoint has no manifest.json (the commit marker is written last)",
        "latest() and load() skip it; retention removes it later",
        "only that checkpoint; the previous one is intact",
    ),
    FailureCase(
        "a checkpoint file is corrupt or truncated",
        "verify(): size or sha256 differs from the manifest",
        "load() warns, naming the file, and falls back to the previous good checkpoint",
        "the steps between the two checkpoints",
    ),
    FailureCase(
        "disk full or permission denied",
        "CheckpointWriteError naming the file and the OS error",
        "the partial checkpoint is removed; training code decides whether to stop",
        "nothing committed; the previous checkpoint is intact",
    ),
    FailureCase(
        "a checkpoint file holds pickled code",
        "UnsafeCheckpointError (tensors are loaded with weights_only=True)",
        "nothing from the file is executed",
        "that checkpoint",
    ),
)


def failure_model() -> list[dict[str, str]]:
    """:data:`FAILURE_MODEL` as JSON-ready dicts."""
    return [asdict(case) for case in FAILURE_MODEL]


def _tool(name: str) -> str | None:
    """An executable next to this Python first (the venv), else on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.access(local, os.X_OK) else shutil.which(name)


def probe() -> dict[str, Any]:
    """The recovery facts of this machine (JSON-ready): op timeout, launchers, injectors."""
    from ddtk.comm.context import OP_TIMEOUT_ENV, op_timeout_from_env

    try:
        op_timeout, op_timeout_error = op_timeout_from_env(), None
    except ValueError as exc:
        op_timeout, op_timeout_error = None, str(exc)
    return {
        "op_timeout_env": OP_TIMEOUT_ENV,
        "op_timeout": op_timeout,
        "op_timeout_error": op_timeout_error,
        "op_timeout_default": not os.environ.get(OP_TIMEOUT_ENV, "").strip(),
        "torchrun": _tool("torchrun"),
        "horovodrun": _tool("horovodrun"),
        "ray": importlib.util.find_spec("ray") is not None,
        "injectors": list(INJECTORS),
        "error": None,
    }
