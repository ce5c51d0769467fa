"""Incremental checkpoints: write only the tensors whose content changed, referenced by hash.

Between two checkpoints often only part of the state changes (a fine-tuned
head, a frozen backbone, embeddings of rare tokens). :func:`save_incremental`
hashes every tensor (sha256 of its dtype, shape and bytes) and writes a tensor
as a content-addressed blob ``directory/blobs/<sha256>.pt`` (atomically, loaded
with ``torch.load(weights_only=True)``) only when no good blob with that hash
exists yet. The checkpoint directory ``step-N/`` holds:

* ``index.pt``: the state's structure without its large tensors (each replaced
  by a reference to its blob; tensors under ``inline_bytes`` stay inline);
* ``meta.json``: the JSON metadata, as for :func:`ddtk.checkpoint.store.save`;
* ``manifest.json`` with ``kind="incremental"``, written last: it lists the two
  files above with their checksums and, in ``extra["blobs"]``, the size and file
  sha256 of every blob the checkpoint needs, plus the bytes this save wrote.

:func:`load_incremental` verifies the manifest and every blob before it
assembles the state, and falls back from a bad newest checkpoint to an older
good one. :func:`collect_garbage` deletes blobs no committed checkpoint refers
to; :func:`apply_incremental_retention` runs retention first and then it, so a
blob still used by a kept checkpoint is never deleted.

>>> import tempfile, torch
>>> from ddtk.checkpoint import capture
>>> from ddtk.checkpoint.incremental import load_incremental, save_incremental, save_stats
>>> run = tempfile.mkdtemp()
>>> model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32))
>>> first = save_incremental(run, capture(model, step=1, rng=False), 1)
>>> with torch.no_grad():
...     _ = model[1].weight.add_(1.0)
>>> second = save_incremental(run, capture(model, step=2, rng=False), 2)
>>> save_stats(first)["blobs_written"], save_stats(second)["blobs_written"]
(2, 1)
>>> fresh = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32))
>>> load_incremental(run, fresh).step, torch.equal(fresh[1].weight, model[1].weight)
(2, True)
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddtk.checkpoint.atomic import CheckpointError, atomic_torch_save, atomic_write_bytes
from ddtk.checkpoint.blobs import (
    BLOB_DIR,
    INDEX_FILE,
    KIND,
    REF,
    blob_path,
    incremental_problems,
    read_incremental,
    tensor_digest,
)
from ddtk.checkpoint.layout import META_FILE, checkpoint_dirs, step_dir
from ddtk.checkpoint.manifest import (
    MANIFEST_NAME,
    CorruptCheckpointError,
    describe_file,
    read_manifest,
    write_manifest,
)
from ddtk.checkpoint.retention import apply_retention, check_policy
from ddtk.checkpoint.state import CheckpointState, ResumableSampler, restore
from ddtk.checkpoint.store import Checkpoint, load

__all__ = [
    "BLOB_DIR",
    "INDEX_FILE",
    "KIND",
    "apply_incremental_retention",
    "collect_garbage",
    "incremental_problems",
    "load_incremental",
    "read_incremental",
    "referenced_blobs",
    "save_incremental",
    "save_stats",
    "tensor_digest",
]


def _split(obj: Any, inline_bytes: int, leaves: dict[str, torch.Tensor], key: str = "") -> Any:
    """The structure with every tensor of at least ``inline_bytes`` replaced by a reference."""
    if isinstance(obj, torch.Tensor):
        if obj.nbytes < inline_bytes:
            return obj
        digest = tensor_digest(obj)
        leaves.setdefault(digest, obj)
        return {REF: digest, "path": key}
    if isinstance(obj, dict):
        return {k: _split(v, inline_bytes, leaves, f"{key}/{k}") for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_split(v, inline_bytes, leaves, f"{key}/{i}") for i, v in enumerate(obj))
    return obj


def _known_blobs(directory: Path) -> dict[str, dict[str, Any]]:
    """Size and file sha256 of every blob listed by a committed incremental checkpoint."""
    known: dict[str, dict[str, Any]] = {}
    for _step, path in checkpoint_dirs(directory):
        try:
            manifest = read_manifest(path)
        except CorruptCheckpointError:
            continue
        if manifest.get("kind") == KIND:
            known.update(manifest.get("extra", {}).get("blobs", {}))
    return known


def _reusable(path: Path, entry: dict[str, Any] | None, check: str) -> bool:
    """An existing blob is reused only if its size (and, with check="sha256", checksum) is good."""
    if entry is None or not path.is_file() or path.stat().st_size != entry.get("size"):
        return False
    return check == "size" or describe_file(path).sha256 == entry.get("sha256")


def save_incremental(
    directory: str | os.PathLike[str],
    state: CheckpointState,
    step: int,
    *,
    world_size: int = 1,
    keep_last: int | None = None,
    keep_every: int | None = None,
    inline_bytes: int = 1024,
    check_reused: str = "sha256",
) -> Path:
    """Write ``state`` as the incremental checkpoint of ``step``; returns its directory.

    Only tensors with no good blob yet are written (``check_reused="sha256"``
    re-reads an existing blob to check it, ``"size"`` trusts a matching size).
    Tensors smaller than ``inline_bytes`` are kept in ``index.pt``. The bytes
    written are in the manifest (see :func:`save_stats`). With ``keep_last`` /
    ``keep_every``, :func:`apply_incremental_retention` runs after the commit.
    """
    if not isinstance(state, CheckpointState):
        raise TypeError(
            f"state must be a CheckpointState (see capture()), got {type(state).__name__}"
        )
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    if not isinstance(inline_bytes, int) or isinstance(inline_bytes, bool) or inline_bytes < 0:
        raise ValueError(f"inline_bytes must be an integer >= 0, got {inline_bytes!r}")
    if check_reused not in ("sha256", "size"):
        raise ValueError(f"check_reused must be 'sha256' or 'size', got {check_reused!r}")
    check_policy(keep_last, keep_every)
    meta = dict(state.meta, step=step)
    try:
        meta_bytes = json.dumps(meta, sort_keys=True).encode()
    except TypeError as exc:
        raise TypeError(f"checkpoint metadata must be JSON-serialisable: {exc}") from exc
    directory = Path(directory)
    path = step_dir(directory, step)
    if (path / MANIFEST_NAME).exists():
        raise CheckpointError(f"a committed checkpoint already exists at {path}")
    start = time.perf_counter()
    leaves: dict[str, torch.Tensor] = {}
    structure = _split(state.tensors, inline_bytes, leaves)
    known = _known_blobs(directory)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (directory / BLOB_DIR).mkdir(exist_ok=True)
    try:
        blobs, written = _write_blobs(directory, leaves, known, check_reused)
        files = {
            INDEX_FILE: atomic_torch_save({"format": 1, "structure": structure}, path / INDEX_FILE),
            META_FILE: atomic_write_bytes(path / META_FILE, meta_bytes),
        }
        blob_bytes = sum(blobs[d]["size"] for d in written)
        extra = {
            "blobs": blobs,
            "blobs_written": len(written),
            "blobs_reused": len(blobs) - len(written),
            "blob_bytes_written": blob_bytes,
            "bytes_written": blob_bytes + sum(f.size for f in files.values()),
            "tensor_bytes": sum(t.nbytes for t in leaves.values()),
            "seconds": time.perf_counter() - start,
        }
        write_manifest(path, files, step=step, epoch=meta.get("epoch"), world_size=world_size,
                       kind=KIND, extra=extra)  # fmt: skip
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    if keep_last is not None or keep_every is not None:
        apply_incremental_retention(directory, keep_last=keep_last, keep_every=keep_every)
    return path


def _write_blobs(
    directory: Path, leaves: dict[str, torch.Tensor], known: dict[str, Any], check: str
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Write the blobs not already good on disk; return every blob's entry and the digests written."""
    blobs: dict[str, dict[str, Any]] = {}
    written = []
    for digest, tensor in leaves.items():
        target = blob_path(directory, digest)
        entry = known.get(digest)
        if not _reusable(target, entry, check):
            t = tensor.detach().to("cpu")
            if t.untyped_storage().nbytes() != t.nbytes or not t.is_contiguous():
                t = t.contiguous().clone()  # a view would save its whole storage
            info = atomic_torch_save(t, target)
            entry = {"size": info.size, "sha256": info.sha256}
            written.append(digest)
        blobs[digest] = {
            "size": entry["size"],
            "sha256": entry["sha256"],
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape),
        }
    return blobs, written


def save_stats(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What an incremental save wrote: blobs written/reused, bytes written, tensor bytes, seconds."""
    extra = read_manifest(path).get("extra", {})
    keys = ("blobs_written", "blobs_reused", "blob_bytes_written", "bytes_written",
            "tensor_bytes", "seconds")  # fmt: skip
    return {k: extra.get(k) for k in keys}


def load_incremental(
    source: str | os.PathLike[str],
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    sampler: ResumableSampler | None = None,
    *,
    map_location: Any = "cpu",
    rng: bool = True,
) -> Checkpoint:
    """Assemble an incremental checkpoint, verifying every blob, and restore it like ``load``.

    :func:`ddtk.checkpoint.load` reads incremental checkpoints too; this one also
    refuses any other kind. ``source`` is a checkpoint directory (it must be good,
    else :class:`~ddtk.checkpoint.manifest.CorruptCheckpointError` naming the bad
    file or blob) or a run directory (the newest good checkpoint; newer bad ones
    are skipped with a warning naming them).
    """
    ckpt = load(source, map_location=map_location)  # verifies, falls back, reads any kind
    if ckpt.manifest.get("kind") != KIND:
        raise CheckpointError(
            f"{ckpt.path} is a {ckpt.manifest.get('kind')!r} checkpoint, not an incremental one"
        )
    if any(obj is not None for obj in (model, optimizer, scheduler, sampler)):
        rng = rng and "rng" in ckpt.state.tensors
        restore(ckpt.state, model, optimizer, scheduler, sampler, rng=rng)
    return ckpt


def referenced_blobs(directory: str | os.PathLike[str]) -> set[str]:
    """Digests of the blobs referred to by any committed checkpoint of a run directory."""
    return set(_known_blobs(Path(directory)))


def collect_garbage(directory: str | os.PathLike[str], *, dry_run: bool = False) -> list[Path]:
    """Delete blobs (and leftover temporary files) no committed checkpoint refers to.

    Returns the paths removed (or, with ``dry_run``, to remove). Run it from the
    single writer of the run, never while another save is in progress.
    """
    blob_dir = Path(directory) / BLOB_DIR
    if not blob_dir.is_dir():
        return []
    keep = referenced_blobs(directory)
    doomed = sorted(p for p in blob_dir.iterdir() if p.is_file() and p.stem not in keep)
    if not dry_run:
        for p in doomed:
            p.unlink(missing_ok=True)
    return doomed


def apply_incremental_retention(
    directory: str | os.PathLike[str],
    *,
    keep_last: int | None = None,
    keep_every: int | None = None,
    dry_run: bool = False,
) -> list[Path]:
    """Retention (:func:`ddtk.checkpoint.retention.apply_retention`), then :func:`collect_garbage`.

    Returns the checkpoint directories and blobs removed. Blobs of every kept
    checkpoint stay, whatever their age.
    """
    removed = apply_retention(
        directory, keep_last=keep_last, keep_every=keep_every, dry_run=dry_run, checksums=False
    )
    if dry_run:
        doomed = {p.resolve() for p in removed}
        keep: set[str] = set()
        for _step, path in checkpoint_dirs(directory):
            if path.resolve() in doomed:
                continue
            try:
                keep.update(read_manifest(path).get("extra", {}).get("blobs", {}))
            except CorruptCheckpointError:
                continue
        blob_dir = Path(directory) / BLOB_DIR
        if not blob_dir.is_dir():
            return removed
        return removed + sorted(p for p in blob_dir.iterdir() if p.is_file() and p.stem not in keep)
    return removed + collect_garbage(directory)
