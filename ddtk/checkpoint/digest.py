"""sha256 of checkpoint files, fast enough not to be the slow part of a save or a load.

A checkpoint is verified byte for byte before it is loaded, and sha256 at
about 1.8 GB/s per core with the x86 SHA extensions (SHA-NI), and a few hundred
MB/s without them (lecture 06 measures both), is slower than writing a file to
the page cache or reading it back. One sha256 of a whole file is
inherently sequential: one core does all of it. So a large file is recorded as
the sha256 of each ``chunk_bytes`` piece (**chunked digests**), which every core
can hash at once:

* a save writes the file, then hashes its chunks from the page cache
  (:func:`file_digest`) while ``fsync`` waits for the disk;
* a load checks the chunks in threads while another thread parses the file,
  and a mismatch says *where* the file is damaged.

Every byte is still covered by a sha256, as in S3's multipart checksums. A file
of one chunk or less keeps the single sha256, which ``sha256sum`` prints.

>>> import hashlib, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "f.bin")
>>> with open(path, "wb") as f:
...     _ = f.write(b"a" * 10)
>>> d = file_digest(path, chunk_bytes=4)
>>> d.size, len(d.chunks), d.sha256 is None
(10, 3, True)
>>> d.chunks[2] == hashlib.sha256(b"aa").hexdigest()
True
>>> file_digest(path).sha256 == hashlib.sha256(b"a" * 10).hexdigest()
True
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHUNK_BYTES", "FileInfo", "file_digest", "hash_threads", "limit_hash_threads"]

CHUNK_BYTES = 16 << 20
"""Chunk size of chunked digests: 19 chunks for a 300 MB file, enough to spread over cores."""


@dataclass(frozen=True)
class FileInfo:
    """Size and sha256 of a file: one hex digest (``sha256``) or one per chunk (``chunks``)."""

    size: int
    sha256: str | None = None
    chunk_bytes: int = 0
    chunks: tuple[str, ...] = ()

    def entry(self) -> dict:
        """The manifest entry: ``size`` with ``sha256``, or with ``chunk_bytes`` and ``sha256_chunks``."""
        if self.chunk_bytes:
            return {
                "size": self.size,
                "chunk_bytes": self.chunk_bytes,
                "sha256_chunks": list(self.chunks),
            }
        return {"size": self.size, "sha256": self.sha256}


_THREADS_LIMIT: ContextVar[int | None] = ContextVar("ddtk_hash_threads", default=None)


def hash_threads() -> int:
    """Threads that hash chunks: the cores this process may use, at most 8, or the
    limit set by :func:`limit_hash_threads` in this thread."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = _THREADS_LIMIT.get()
    return max(1, min(8, cores, limit or cores))


@contextmanager
def limit_hash_threads(threads: int) -> Iterator[None]:
    """Hash with at most ``threads`` threads inside the block (in the calling thread).

    A background checkpoint writer uses one, so that hashing does not take the
    cores that training is using; a synchronous save or a load uses them all.
    """
    token = _THREADS_LIMIT.set(threads)
    try:
        yield
    finally:
        _THREADS_LIMIT.reset(token)


def _sha256(buffer: memoryview) -> str:
    return hashlib.sha256(buffer).hexdigest()


def _chunk_digests(view: memoryview, chunk_bytes: int) -> tuple[str, ...]:
    """sha256 of each ``chunk_bytes`` piece of ``view``, hashed by up to :func:`hash_threads` threads."""
    pieces = [view[i : i + chunk_bytes] for i in range(0, len(view), chunk_bytes)]
    try:
        workers = min(len(pieces), hash_threads())
        if workers == 1:
            return tuple(_sha256(p) for p in pieces)
        with ThreadPoolExecutor(workers, thread_name_prefix="ddtk-sha256") as pool:
            return tuple(pool.map(_sha256, pieces))
    finally:
        for p in pieces:
            p.release()


def file_digest(path: str | os.PathLike[str], chunk_bytes: int = 0) -> FileInfo:
    """Size and sha256 of a file on disk, whole or per chunk; chunks are hashed in threads.

    The file is memory-mapped (no copy through a read buffer) and the mapping is
    populated in one call, which is much cheaper than a page fault per page.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return FileInfo(0, _sha256(memoryview(b"")))
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapped = mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ)
    try:
        view = memoryview(mapped)
        try:
            if not chunk_bytes or size <= chunk_bytes:
                return FileInfo(size, _sha256(view))
            return FileInfo(size, None, chunk_bytes, _chunk_digests(view, chunk_bytes))
        finally:
            view.release()
    finally:
        mapped.close()
