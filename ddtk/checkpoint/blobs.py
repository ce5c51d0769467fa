"""The on-disk format of incremental checkpoints: content-addressed blobs and their index.

A tensor is stored once, as ``blobs/<sha256>.pt`` beside the ``step-N`` folders,
named by :func:`tensor_digest` of its dtype, shape and bytes; a checkpoint's
``index.pt`` holds the state with each large tensor replaced by a reference
``{REF: digest, "path": key}``. This module reads and checks that format (it is
what :func:`ddtk.checkpoint.store.load` and :func:`~ddtk.checkpoint.store.latest`
need for an incremental checkpoint); :mod:`ddtk.checkpoint.incremental` writes it.

>>> import torch
>>> tensor_digest(torch.zeros(2)) == tensor_digest(torch.zeros(2))
True
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ddtk.checkpoint.layout import META_FILE, Checkpoint, UnsafeCheckpointError
from ddtk.checkpoint.manifest import CorruptCheckpointError, describe_file, read_manifest, verify
from ddtk.checkpoint.state import CheckpointState

__all__ = [
    "BLOB_DIR",
    "INDEX_FILE",
    "KIND",
    "REF",
    "blob_path",
    "blob_problems",
    "incremental_problems",
    "read_incremental",
    "refs",
    "tensor_digest",
]


KIND = "incremental"


INDEX_FILE = "index.pt"


BLOB_DIR = "blobs"


REF = "__ddtk_blob__"


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 (hex) of a tensor's dtype, shape and bytes: equal digests mean equal tensors."""
    if t.is_sparse or t.is_quantized or t.layout != torch.strided:
        raise TypeError(f"incremental checkpoints store dense tensors only, got layout {t.layout}")
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    digest = hashlib.sha256(f"{flat.dtype}|{tuple(t.shape)}|".encode())
    if flat.numel():
        digest.update(memoryview(flat.view(torch.uint8).numpy()))
    return digest.hexdigest()


def refs(structure: Any) -> Iterator[dict[str, str]]:
    """Every blob reference in an index structure."""
    if isinstance(structure, dict):
        if REF in structure:
            yield structure
            return
        for v in structure.values():
            yield from refs(v)
    elif isinstance(structure, list | tuple):
        for v in structure:
            yield from refs(v)


def blob_path(directory: Path, digest: str) -> Path:
    return directory / BLOB_DIR / f"{digest}.pt"


def blob_problems(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """Every blob of a checkpoint that is missing or does not match its size/sha256."""
    problems = []
    for digest, entry in manifest.get("extra", {}).get("blobs", {}).items():
        blob = blob_path(directory, digest)
        name = f"{BLOB_DIR}/{blob.name}"
        if not blob.is_file():
            problems.append(f"{name}: missing")
        elif blob.stat().st_size != entry.get("size"):
            problems.append(
                f"{name}: {blob.stat().st_size} bytes, the manifest says {entry['size']}"
            )
        elif describe_file(blob).sha256 != entry.get("sha256"):
            problems.append(f"{name}: sha256 differs from the manifest (the blob is corrupt)")
    return problems


def incremental_problems(path: Path) -> list[str]:
    """Every problem of an incremental checkpoint directory (its files and its blobs)."""
    problems = verify(path)
    if problems:
        return problems
    manifest = read_manifest(path)
    if manifest.get("kind") != KIND:
        return [f"a {manifest.get('kind')!r} checkpoint, not an incremental one"]
    return blob_problems(path.parent, manifest)


def _load(obj: Path, map_location: Any) -> Any:
    try:
        return torch.load(obj, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"refusing to load {obj}: it contains pickled objects that are not tensors or plain "
            "data, which could run code; nothing from it was executed"
        ) from exc


def _assemble(structure: Any, tensors: dict[str, torch.Tensor], used: set[str]) -> Any:
    """Put the blobs back; a blob used twice is cloned so no two leaves share storage."""
    if isinstance(structure, dict):
        if REF in structure:
            digest = structure[REF]
            t = tensors[digest]
            if digest in used:
                return t.clone()
            used.add(digest)
            return t
        return {k: _assemble(v, tensors, used) for k, v in structure.items()}
    if isinstance(structure, list | tuple):
        return type(structure)(_assemble(v, tensors, used) for v in structure)
    return structure


def read_incremental(path: Path, map_location: Any) -> Checkpoint:
    """Read a verified incremental checkpoint into a full :class:`Checkpoint`."""
    manifest = read_manifest(path)
    index = _load(path / INDEX_FILE, map_location)
    if not isinstance(index, dict) or "structure" not in index:
        raise CorruptCheckpointError(f"{path / INDEX_FILE} is not a ddtk incremental index")
    blobs = manifest["extra"]["blobs"]
    tensors = {}
    for ref in refs(index["structure"]):
        digest = ref[REF]
        if digest not in blobs:
            raise CorruptCheckpointError(f"{path}: {ref['path']} refers to unlisted blob {digest}")
        if digest not in tensors:
            t = _load(blob_path(path.parent, digest), map_location)
            entry = blobs[digest]
            if (
                str(t.dtype).removeprefix("torch.") != entry["dtype"]
                or list(t.shape) != entry["shape"]
            ):
                raise CorruptCheckpointError(
                    f"blob {digest} does not hold the tensor the index names"
                )
            tensors[digest] = t
    state = _assemble(index["structure"], tensors, set())
    meta = json.loads((path / META_FILE).read_bytes())
    if not isinstance(state, dict) or "model" not in state:
        raise CorruptCheckpointError(f"{path / INDEX_FILE} does not hold a ddtk training state")
    return Checkpoint(path, manifest, CheckpointState(state, meta))
