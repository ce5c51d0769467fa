"""Save, find and load checkpoints: ``dir/step-000123/`` with the manifest written last.

:func:`save` writes ``state.pt`` (tensors, loaded back with
``torch.load(weights_only=True)`` so a checkpoint can never run code) and
``meta.json`` atomically, then commits them with ``manifest.json``.
:func:`latest` is the newest checkpoint that is complete and whose checksums
match. :func:`load` verifies before it reads; given a run directory it falls
back, with a warning naming the checkpoint and the reason, from a corrupt or
incomplete newest checkpoint to the previous good one. A run killed at any
moment therefore resumes from its last committed step.

>>> import tempfile, torch
>>> from ddtk.checkpoint import capture, latest, load, save
>>> run = tempfile.mkdtemp()
>>> model = torch.nn.Linear(3, 2)
>>> for step in (10, 20):
...     _ = save(run, capture(model, step=step), step)
>>> latest(run).name
'step-000020'
>>> fresh = torch.nn.Linear(3, 2)
>>> ckpt = load(run, fresh)
>>> ckpt.step, torch.equal(fresh.weight, model.weight)
(20, True)
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddtk.checkpoint.atomic import (
    CheckpointError,
    atomic_torch_save,
    atomic_write_bytes,
)
from ddtk.checkpoint.blobs import KIND as INCREMENTAL_KIND
from ddtk.checkpoint.blobs import incremental_problems, read_incremental
from ddtk.checkpoint.digest import CHUNK_BYTES
from ddtk.checkpoint.layout import (
    META_FILE,
    STATE_FILE,
    STEP_RE,
    Checkpoint,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
    checkpoint_dirs,
    step_dir,
)
from ddtk.checkpoint.manifest import (
    MANIFEST_NAME,
    CorruptCheckpointError,
    read_manifest,
    verify,
    write_manifest,
)
from ddtk.checkpoint.retention import apply_retention, check_policy
from ddtk.checkpoint.state import CheckpointState, ResumableSampler, restore

__all__ = [
    "META_FILE",
    "STATE_FILE",
    "Checkpoint",
    "CheckpointNotFoundError",
    "UnsafeCheckpointError",
    "checkpoint_dirs",
    "latest",
    "load",
    "problems",
    "save",
    "step_dir",
]


def save(
    directory: str | os.PathLike[str],
    state: CheckpointState,
    step: int,
    *,
    world_size: int = 1,
    keep_last: int | None = None,
    keep_every: int | None = None,
) -> Path:
    """Write ``state`` as the checkpoint of ``step`` under ``directory``; returns its path.

    The files are written atomically and fsynced, the manifest last. An
    incomplete directory of the same step (left by a killed writer) is
    replaced; a committed one raises :class:`CheckpointError`. If a write fails
    (:class:`~ddtk.checkpoint.atomic.CheckpointWriteError`), the partial
    directory is removed and older checkpoints are untouched. With
    ``keep_last``/``keep_every``, :func:`ddtk.checkpoint.retention.apply_retention`
    runs after the commit (checksums of the newest only, completeness of the rest).
    """
    if not isinstance(state, CheckpointState):
        raise TypeError(
            f"state must be a CheckpointState (see capture()), got {type(state).__name__}"
        )
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    check_policy(keep_last, keep_every)
    path = step_dir(directory, step)
    if (path / MANIFEST_NAME).exists():
        raise CheckpointError(f"a committed checkpoint already exists at {path}")
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    meta = dict(state.meta, step=step)
    try:
        meta_bytes = json.dumps(meta, sort_keys=True).encode()
    except TypeError as exc:
        raise TypeError(f"checkpoint metadata must be JSON-serialisable: {exc}") from exc
    try:
        files = {
            STATE_FILE: atomic_torch_save(
                state.tensors, path / STATE_FILE, chunk_bytes=CHUNK_BYTES
            ),
            META_FILE: atomic_write_bytes(path / META_FILE, meta_bytes),
        }
        write_manifest(path, files, step=step, epoch=meta.get("epoch"), world_size=world_size)
    except BaseException:
        # nothing was committed: leave no partial directory behind (a kill leaves one,
        # which latest() ignores and retention removes)
        shutil.rmtree(path, ignore_errors=True)
        raise
    if keep_last is not None or keep_every is not None:
        apply_retention(directory, keep_last=keep_last, keep_every=keep_every, checksums=False)
    return path


def problems(path: str | os.PathLike[str]) -> list[str]:
    """Everything wrong with one checkpoint directory; empty when it is good.

    The files its manifest lists (sizes, sha256) for every kind, and for an
    incremental checkpoint also the shared blobs it refers to.
    """
    found = verify(path)
    if not found and read_manifest(path).get("kind") == INCREMENTAL_KIND:
        found = incremental_problems(Path(path))
    return found


def latest(directory: str | os.PathLike[str], *, warn: bool = False) -> Path | None:
    """The newest complete checkpoint (of any kind) that passes :func:`problems`, or None.

    With ``warn``, each newer checkpoint skipped on the way is reported with
    ``warnings.warn`` naming it and its problems.
    """
    for _step, path in reversed(checkpoint_dirs(directory)):
        found = problems(path)
        if not found:
            return path
        if warn:
            _warn_skipped(path, found)
    return None


def _warn_skipped(path: Path, problems: list[str]) -> None:
    warnings.warn(
        f"skipping checkpoint {path}: " + "; ".join(problems) + "; falling back to an older one",
        RuntimeWarning,
        stacklevel=3,
    )


def _read(path: Path, map_location: Any) -> Checkpoint:
    """Read a verified checkpoint directory; refuse anything but tensors and plain data."""
    manifest = read_manifest(path)
    kind = manifest.get("kind")
    if kind == INCREMENTAL_KIND:
        return read_incremental(path, map_location)
    if kind == "sharded":
        raise CheckpointError(
            f"{path} is a sharded checkpoint written by {manifest.get('world_size')} ranks: "
            "every rank reads its part with ddtk.checkpoint.load_sharded(ctx, ...) "
            "(or load_dp / load_zero), at any world size"
        )
    if kind != "full":
        raise CheckpointError(f"{path} is a {kind!r} checkpoint, which load() does not know")
    try:
        tensors = torch.load(path / STATE_FILE, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"refusing to load {path / STATE_FILE}: it contains pickled objects that are not "
            f"tensors or plain data, which could run code; nothing from it was executed "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        ) from exc
    meta = json.loads((path / META_FILE).read_bytes())
    if not isinstance(tensors, dict) or "model" not in tensors:
        raise CorruptCheckpointError(f"{path / STATE_FILE} does not hold a ddtk training state")
    return Checkpoint(path, manifest, CheckpointState(tensors, meta))


def _verified_read(path: Path, map_location: Any) -> tuple[list[str], Checkpoint | None]:
    """``(problems, checkpoint)``: verify ``path`` and read it at the same time.

    The checksums are computed in other threads while this one parses the
    files, so a load costs about ``max(verify, read)`` instead of their sum.
    What was read counts only when the checkpoint verifies: with problems the
    checkpoint is None and any error of the read is dropped (a damaged file may
    well fail to parse). ``weights_only`` loading makes parsing unverified bytes
    safe. Nothing is restored into a model until this returns.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="ddtk-verify") as pool:
        checking = pool.submit(problems, path)
        try:
            ckpt, error = _read(path, map_location), None
        except Exception as exc:  # reported below only if the checkpoint verifies
            ckpt, error = None, exc
        found = checking.result()
    if found:
        return found, None
    if error is not None:
        raise error
    return [], ckpt


def load(
    source: str | os.PathLike[str],
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    sampler: ResumableSampler | None = None,
    *,
    map_location: Any = "cpu",
    rng: bool = True,
) -> Checkpoint:
    """Load a checkpoint, verify it, and restore it into the objects given.

    Reads full checkpoints (:func:`save`) and incremental ones
    (:func:`ddtk.checkpoint.incremental.save_incremental`, assembled from their
    blobs); a sharded checkpoint is read by every rank with
    :func:`ddtk.checkpoint.sharded.load_sharded`, and this says so.
    ``source`` is a checkpoint directory (it must be good) or a run directory
    (the newest good checkpoint is used; newer bad ones are skipped with a
    warning). Raises :class:`CheckpointNotFoundError` when there is none,
    :class:`~ddtk.checkpoint.manifest.CorruptCheckpointError` for a bad explicit
    checkpoint, :class:`UnsafeCheckpointError` for a file that is not plain
    tensors, and :class:`~ddtk.checkpoint.state.CheckpointMismatchError` (naming
    keys and shapes) when it does not fit the model. Restoring into objects also
    sets the RNGs saved with the state (``rng=False`` leaves them alone); with no
    objects it only reads (restore later with :func:`ddtk.checkpoint.state.restore`).
    """
    source = Path(source)
    if not source.is_dir():
        raise CheckpointNotFoundError(f"no checkpoint directory at {source}")
    if STEP_RE.match(source.name) or (source / MANIFEST_NAME).exists():
        found, ckpt = _verified_read(source, map_location)
        if found:
            raise CorruptCheckpointError(f"checkpoint {source} is bad: " + "; ".join(found))
    else:
        ckpt = _newest_good(source, map_location)
    if any(obj is not None for obj in (model, optimizer, scheduler, sampler)):
        rng = rng and "rng" in ckpt.state.tensors
        restore(ckpt.state, model, optimizer, scheduler, sampler, rng=rng)
    return ckpt


def _newest_good(directory: Path, map_location: Any) -> Checkpoint:
    """The newest verified checkpoint of a run directory, warning about each one skipped."""
    tried = []
    for _step, path in reversed(checkpoint_dirs(directory)):
        found, ckpt = _verified_read(path, map_location)
        if found:
            _warn_skipped(path, found)
            tried.append(f"{path.name} ({'; '.join(found)})")
            continue
        return ckpt
    detail = ": bad ones are " + ", ".join(tried) if tried else " (no step-N directories)"
    raise CheckpointNotFoundError(f"no good checkpoint in {directory}{detail}")
