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
* :mod:`~ddtk.checkpoint.retention`: ``keep_last`` / ``keep_every``;
* :mod:`~ddtk.checkpoint.sharded`: every rank writes its shard, rank 0 commits;
  loading reshards (a 4-rank ZeRO or DP checkpoint resumes on 2 ranks);
* :mod:`~ddtk.checkpoint.background`: :class:`AsyncCheckpointer`, a CPU snapshot
  written by a background thread, one save in flight, errors never lost;
* :mod:`~ddtk.checkpoint.incremental`: only changed tensors are written, as blobs
  named by their sha256; :func:`load` assembles them.

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
from ddtk.checkpoint.background import AsyncCheckpointer, CheckpointerStats, snapshot
from ddtk.checkpoint.incremental import (
    apply_incremental_retention,
    collect_garbage,
    load_incremental,
    save_incremental,
    save_stats,
)
from ddtk.checkpoint.manifest import (
    MANIFEST_NAME,
    CorruptCheckpointError,
    read_manifest,
    verify,
    write_manifest,
)
from ddtk.checkpoint.retention import apply_retention, plan_retention
from ddtk.checkpoint.sharded import (
    ShardedCheckpoint,
    ShardedState,
    ShardedTensor,
    ShardWriteError,
    dp_state,
    load_dp,
    load_sharded,
    load_zero,
    save_sharded,
    zero_state,
)
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
    problems,
    save,
    step_dir,
)

__all__ = [
    "MANIFEST_NAME",
    "AsyncCheckpointer",
    "Checkpoint",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointState",
    "CheckpointWriteError",
    "CheckpointerStats",
    "CorruptCheckpointError",
    "FileInfo",
    "ResumableSampler",
    "ShardWriteError",
    "ShardedCheckpoint",
    "ShardedState",
    "ShardedTensor",
    "UnsafeCheckpointError",
    "apply_incremental_retention",
    "apply_retention",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_bytes",
    "capture",
    "capture_rng",
    "checkpoint_dirs",
    "collect_garbage",
    "dp_state",
    "latest",
    "load",
    "load_dp",
    "load_incremental",
    "load_sharded",
    "load_zero",
    "plan_retention",
    "problems",
    "read_manifest",
    "restore",
    "restore_rng",
    "save",
    "save_incremental",
    "save_sharded",
    "save_stats",
    "snapshot",
    "step_dir",
    "verify",
    "write_manifest",
    "zero_state",
]
