"""The checkpoint manifest: what a checkpoint holds, and the marker that it is complete.

A checkpoint directory is committed when its ``manifest.json`` exists: the
manifest is written last (atomically), after every file it lists is durable.
It lists every file (any number of them, so sharded checkpoints fit) with its
size and sha256 (one digest, or one per 16 MiB chunk for the large state file:
see :mod:`ddtk.checkpoint.digest`), plus the step, epoch, world size, library
versions and time. :func:`verify` re-reads the files and reports every difference.

>>> import os, tempfile
>>> from ddtk.checkpoint.atomic import atomic_write_bytes
>>> from ddtk.checkpoint.manifest import verify, write_manifest
>>> d = tempfile.mkdtemp()
>>> info = atomic_write_bytes(os.path.join(d, "a.bin"), b"abc")
>>> verify(d)
['manifest.json is missing (the checkpoint was never committed)']
>>> m = write_manifest(d, {"a.bin": info}, step=7, epoch=0, world_size=1)
>>> m["step"], m["files"]["a.bin"]["size"], verify(d)
(7, 3, [])
>>> with open(os.path.join(d, "a.bin"), "wb") as f:
...     _ = f.write(b"abd")
>>> verify(d)
['a.bin: sha256 differs from the manifest (the file is corrupt)']
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch

from ddtk._version import __version__
from ddtk.checkpoint.atomic import CheckpointError, FileInfo, atomic_write_bytes
from ddtk.checkpoint.digest import file_digest

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "READABLE_FORMATS",
    "CorruptCheckpointError",
    "describe_file",
    "library_versions",
    "read_manifest",
    "verify",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 2
"""Format 2 added chunked digests (``chunk_bytes``, ``sha256_chunks``); format 1 is still read."""
READABLE_FORMATS = (1, 2)


class CorruptCheckpointError(CheckpointError):
    """A checkpoint is incomplete or its files do not match its manifest."""


def library_versions() -> dict[str, str]:
    """Versions of the libraries that wrote a checkpoint (python, torch, ddtk, numpy)."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ddtk": __version__,
        "numpy": np.__version__,
    }


def describe_file(path: str | os.PathLike[str], chunk_bytes: int = 0) -> FileInfo:
    """Size and sha256 of a file on disk, whole or per ``chunk_bytes`` chunk."""
    return file_digest(path, chunk_bytes)


def _check_name(name: str) -> None:
    """File names in a manifest are plain relative paths inside the checkpoint directory."""
    pure = PurePosixPath(name)
    if not name or pure.is_absolute() or ".." in pure.parts or name == MANIFEST_NAME:
        raise ValueError(f"invalid file name in a checkpoint manifest: {name!r}")


def write_manifest(
    directory: str | os.PathLike[str],
    files: Mapping[str, FileInfo],
    *,
    step: int,
    epoch: int | None = None,
    world_size: int = 1,
    kind: str = "full",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``directory/manifest.json`` atomically; this commits the checkpoint.

    ``files`` maps each file's path relative to ``directory`` to its
    :class:`~ddtk.checkpoint.atomic.FileInfo`. ``kind`` names the layout
    (``"full"`` for :func:`ddtk.checkpoint.store.save`) so other writers
    (sharded, incremental) can share the format. Returns the manifest written.
    """
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    for name in files:
        _check_name(name)
    manifest = {
        "format": FORMAT_VERSION,
        "kind": kind,
        "step": step,
        "epoch": epoch,
        "world_size": world_size,
        "files": {name: info.entry() for name, info in sorted(files.items())},
        "versions": library_versions(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "unix_time": time.time(),
        "extra": dict(extra or {}),
    }
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    atomic_write_bytes(Path(directory) / MANIFEST_NAME, data)
    return manifest


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse ``directory/manifest.json``; :class:`CorruptCheckpointError` if missing or invalid."""
    path = Path(directory) / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_bytes())
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(
            f"{path} is missing (the checkpoint was never committed)"
        ) from exc
    except (OSError, ValueError) as exc:
        raise CorruptCheckpointError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CorruptCheckpointError(f"{path} is not a ddtk checkpoint manifest")
    if manifest.get("format") not in READABLE_FORMATS:
        raise CorruptCheckpointError(
            f"{path} has format {manifest.get('format')!r}; this ddtk reads formats "
            + ", ".join(map(str, READABLE_FORMATS))
        )
    return manifest


def verify(directory: str | os.PathLike[str], checksums: bool = True) -> list[str]:
    """Every problem of the checkpoint in ``directory``; an empty list means it is good.

    Checks that the manifest exists and parses, and that each listed file exists
    with the recorded size and (when ``checksums``) sha256. ``checksums=False``
    is a cheap completeness check that reads no file contents.
    """
    directory = Path(directory)
    try:
        manifest = read_manifest(directory)
    except CorruptCheckpointError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            return [f"{MANIFEST_NAME} is missing (the checkpoint was never committed)"]
        return [str(exc)]
    problems = []
    for name, entry in manifest["files"].items():
        try:
            _check_name(name)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        path = directory / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        size = path.stat().st_size
        if size != entry.get("size"):
            problems.append(f"{name}: {size} bytes, the manifest says {entry.get('size')}")
        elif checksums:
            problems += _checksum_problems(name, path, entry)
    return problems


def _checksum_problems(name: str, path: Path, entry: Mapping[str, Any]) -> list[str]:
    """What differs between a file's sha256 (whole or chunked) and its manifest entry."""
    if "sha256_chunks" not in entry:
        if describe_file(path).sha256 != entry.get("sha256"):
            return [f"{name}: sha256 differs from the manifest (the file is corrupt)"]
        return []
    chunk_bytes, recorded = entry.get("chunk_bytes"), entry["sha256_chunks"]
    if not isinstance(chunk_bytes, int) or chunk_bytes <= 0 or not isinstance(recorded, list):
        return [f"{name}: the manifest's chunked sha256 entry is malformed"]
    found = describe_file(path, chunk_bytes).chunks
    if len(found) != len(recorded):
        return [f"{name}: {len(found)} chunks of sha256, the manifest lists {len(recorded)}"]
    bad = [i for i, (a, b) in enumerate(zip(found, recorded)) if a != b]
    if not bad:
        return []
    mib = chunk_bytes / (1 << 20)
    where = ", ".join(f"{i * mib:g}-{(i + 1) * mib:g} MiB" for i in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return [
        f"{name}: sha256 differs from the manifest in {len(bad)} of {len(found)} chunks "
        f"(bytes {where}{more}; the file is corrupt)"
    ]
