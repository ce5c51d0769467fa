"""Checkpoints that survive a kill at any moment: atomic files, a manifest, exact resume.

A run killed at any moment resumes from its last committed checkpoint, loses
no committed work, and ends with the same model as a run never interrupted:

* :mod:`~ddtk.checkpoint.atomic`: write-to-temp, fsync, rename, fsync the directory;
* :mod:`~ddtk.checkpoint.manifest`: sizes and sha256 of every file, written last
  (the commit marker), and :func:`verify`;
* :mod:`~ddtk.checkpoint.state`: what a bitwise resume needs (model, optimizer,
  scheduler, counters, RNGs, :class:`ResumableSampler` position);
* :mod:`~ddtk.checkpoint.store`: :func:`save`, :func:`latest`, :func:`load` with
  verification, fallback to the previous good checkpoint, and weights-only loading;
* :mod:`~ddtk.checkpoint.retention`: ``keep_last`` / ``keep_every``.

>>> import tempfile, torch
>>> import ddtk.checkpoint as ckpt
>>> run = tempfile.mkdtemp()
>>> model = torch.nn.Linear(2, 2)
>>> ckpt.save(run, ckpt.capture(model, step=5), 5).name
'step-000005'
>>> ckpt.load(run, torch.nn.Linear(2, 2)).step
5
"""

from ddtk.checkpoint.atomic import (
    CheckpointError,
    CheckpointWriteError,
    FileInfo,
    atomic_torch_save,
    atomic_write,
    atomic_write_bytes,
)
from ddtk.checkpoint.manifest import (
    MANIFEST_NAME,
    CorruptCheckpointError,
    read_manifest,
    verify,
    write_manifest,
)
from ddtk.checkpoint.retention import apply_retention, plan_retention
from ddtk.checkpoint.state import (
    CheckpointMismatchError,
    CheckpointState,
    ResumableSampler,
    capture,
    capture_rng,
    restore,
    restore_rng,
)
from ddtk.checkpoint.store import (
    Checkpoint,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
    checkpoint_dirs,
    latest,
    load,
    save,
    step_dir,
)

__all__ = [
    "MANIFEST_NAME",
    "Checkpoint",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointState",
    "CheckpointWriteError",
    "CorruptCheckpointError",
    "FileInfo",
    "ResumableSampler",
    "UnsafeCheckpointError",
    "apply_retention",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_bytes",
    "capture",
    "capture_rng",
    "checkpoint_dirs",
    "latest",
    "load",
    "plan_retention",
    "read_manifest",
    "restore",
    "restore_rng",
    "save",
    "step_dir",
    "verify",
    "write_manifest",
]
