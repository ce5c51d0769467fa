"""Atomic file writes: a reader sees the old file or the new one, never half of one.

The bytes go to a temporary name in the same directory, are flushed and
fsynced, and only then ``os.replace`` puts them under the final name (a rename
within one file system is atomic on POSIX); finally the directory itself is
fsynced so the rename survives a power cut. If anything fails (disk full,
permission denied, a crash), the temporary file is removed when the process is
still alive to do it, and the file that was there before is untouched.

>>> import os, tempfile, torch
>>> from ddtk.checkpoint.atomic import atomic_write_bytes, atomic_torch_save
>>> d = tempfile.mkdtemp()
>>> info = atomic_write_bytes(os.path.join(d, "hello.txt"), b"hello")
>>> info.size, info.sha256[:12]
(5, '2cf24dba5fb0')
>>> _ = atomic_torch_save({"w": torch.ones(2)}, os.path.join(d, "w.pt"))
>>> torch.load(os.path.join(d, "w.pt"), weights_only=True)["w"]
tensor([1., 1.])
>>> sorted(os.listdir(d))
['hello.txt', 'w.pt']
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ddtk.checkpoint.digest import FileInfo, file_digest

__all__ = [
    "TMP_MARKER",
    "CheckpointError",
    "CheckpointWriteError",
    "FileInfo",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_bytes",
    "fsync_dir",
    "is_temp_name",
]

TMP_MARKER = ".tmp-"
"""Part of every temporary file name, so leftovers of a killed writer can be recognised."""


class CheckpointError(Exception):
    """Base class of every checkpoint problem ddtk reports."""


class CheckpointWriteError(CheckpointError, OSError):
    """Writing a checkpoint file failed (disk full, permission denied, ...); the old file is intact."""

    def __init__(self, path: str | os.PathLike[str], cause: OSError):
        reason = os.strerror(cause.errno) if cause.errno else str(cause)
        code = errno.errorcode.get(cause.errno or 0, "")
        message = (
            f"could not write checkpoint file {os.fspath(path)}: {reason}"
            + (f" ({code})" if code else "")
            + "; the previous version of the file, if any, is intact"
        )
        OSError.__init__(self, cause.errno, message)
        self.path = os.fspath(path)
        self.cause = cause

    def __str__(self) -> str:
        return self.args[1]


def is_temp_name(name: str) -> bool:
    """True for names made by :func:`atomic_write` for its temporary files."""
    return name.startswith(".") and TMP_MARKER in name


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """fsync a directory so that renames and creations in it are durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_temp(tmp: Path) -> int:
    """Create the temporary file (it must not exist) and return its descriptor."""
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)


def _write_all(fd: int, data: memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write fewer bytes than asked)."""
    while data:
        written = os.write(fd, data)
        data = data[written:]


class _HashingWriter:
    """A minimal binary file object over a descriptor that counts and hashes what passes.

    With ``hashing=False`` it only counts: a chunked digest is taken from the file
    afterwards (:func:`_fsync_and_digest`).
    """

    def __init__(self, fd: int, hashing: bool = True):
        self.fd = fd
        self.size = 0
        self.hash = hashlib.sha256() if hashing else None
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        try:
            _write_all(self.fd, view)
        except OSError as exc:
            # remembered because a serializer may hide it behind its own error while unwinding
            self.error = exc
            raise
        if self.hash is not None:
            self.hash.update(view)
        self.size += len(view)
        return len(view)

    def flush(self) -> None:
        """Nothing is buffered here; durability comes from the fsync in :func:`atomic_write`."""


def _fsync_and_digest(fd: int, tmp: Path, size: int, chunk_bytes: int) -> FileInfo:
    """fsync ``fd`` while the chunks of ``tmp`` are hashed from the page cache.

    The fsync waits for the disk and the hashing uses the cores, so they overlap.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="ddtk-fsync") as pool:
        synced = pool.submit(os.fsync, fd)
        info = file_digest(tmp, chunk_bytes)
        synced.result()
    if info.size != size:
        raise OSError(errno.EIO, f"{size} bytes were written but the file holds {info.size}")
    return info


def atomic_write(
    path: str | os.PathLike[str], write: Callable[[Any], None], *, chunk_bytes: int = 0
) -> FileInfo:
    """Call ``write(fileobj)`` into a temporary file, then atomically move it to ``path``.

    ``fileobj`` has ``write(bytes)`` and ``flush()``. Returns the size and sha256 of
    what was written: one digest computed while writing, or, with ``chunk_bytes``,
    one per chunk computed from the file while it is fsynced (see
    :mod:`ddtk.checkpoint.digest`). Raises :class:`CheckpointWriteError` on any
    OS error, after removing the temporary file.
    """
    path = Path(path)
    tmp = path.parent / f".{path.name}{TMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}"
    fd = -1
    writer: _HashingWriter | None = None
    try:
        fd = _open_temp(tmp)
        writer = _HashingWriter(fd, hashing=not chunk_bytes)
        write(writer)
        if chunk_bytes:
            info = _fsync_and_digest(fd, tmp, writer.size, chunk_bytes)
        else:
            os.fsync(fd)
            info = FileInfo(writer.size, writer.hash.hexdigest())
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        _cleanup(fd, tmp)
        if isinstance(exc, CheckpointWriteError):
            raise
        raise CheckpointWriteError(path, exc) from exc
    except BaseException as exc:
        _cleanup(fd, tmp)
        if writer is not None and writer.error is not None and isinstance(exc, Exception):
            raise CheckpointWriteError(path, writer.error) from exc
        raise
    return info


def _cleanup(fd: int, tmp: Path) -> None:
    """Close and remove a temporary file after a failed write, ignoring secondary errors."""
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes | bytearray | memoryview
) -> FileInfo:
    """Atomically replace ``path`` with ``data``; see :func:`atomic_write`."""
    return atomic_write(path, lambda f: f.write(data))


def atomic_torch_save(obj: Any, path: str | os.PathLike[str], *, chunk_bytes: int = 0) -> FileInfo:
    """Atomically ``torch.save(obj)`` to ``path``, streaming (no full copy in memory)."""
    return atomic_write(path, lambda f: torch.save(obj, f), chunk_bytes=chunk_bytes)
