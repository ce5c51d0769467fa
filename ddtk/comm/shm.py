"""Shared-memory segments for ranks on one host: layout, futex waits, liveness and cleanup.

This is the plumbing under :mod:`ddtk.comm.shm_transport`. The ranks of one host
share a single file in ``/dev/shm``, laid out as::

    [header 64 B][control: one 64 B slot per local rank][channels: L x L rings]

* **Control slot** of local rank ``i``: a *doorbell* (int32 futex word), a
  *sleeping* flag, the process id and a state (open / closed). A rank that has
  nothing to do sleeps on its own doorbell; a peer that gives it data or frees
  room in a ring bumps the doorbell and wakes it, only if it sleeps.
* **Channel** ``i -> j``: a single-producer single-consumer ring buffer. Its
  header holds the writer's position and, a cache line further, the reader's
  position (both byte counts that only grow). Messages are 64-byte aligned
  records: a 64-byte header (tag, byte count) and the payload.

Positions are 8-byte aligned int64 stores, which x86-64 makes atomic and
keeps in program order (stores are not reordered with stores, nor loads with
loads), so "write the payload, then publish the position" needs no fence. That
guarantee is why the transport is offered on x86-64 Linux only.

The file lives only while the ranks connect: once every local rank has mapped
it, it is unlinked, so no exit path (normal, exception, SIGKILL of a rank or
of the launcher) can leave it behind. A crash inside that short window leaves a
file named after the creating process; :func:`sweep_stale` removes such files
once that process is gone, and :func:`ddtk.launch` sweeps its ranks' files.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "ddtk-shm-"
ALIGN = 64
HEADER = 64
SLOT = 64
CHANNEL_HEADER = 128
MAGIC = 0x64647463_6B73686D  # "ddtkshm"

STATE_OPEN, STATE_CLOSED = 1, 2

# int64 word indices inside a control slot / channel header (byte offset // 8)
_SLOT_PID, _SLOT_STATE, _SLOT_PROBE, _SLOT_DIRECT = 1, 2, 3, 4
_CH_WRITE, _CH_READ, _CH_ACK = 0, 8, 9  # the ack count shares the reader's cache line

_SYS_FUTEX = {"x86_64": 202}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


def unsupported_reason() -> str | None:
    """Why this machine cannot use the shared-memory transport, or None if it can."""
    if sys.platform != "linux":
        return f"the shared-memory transport needs Linux (this is {sys.platform})"
    machine = platform.machine()
    if machine not in _SYS_FUTEX:
        return (
            f"the shared-memory transport relies on x86-64 memory ordering; this CPU is {machine}"
        )
    if not SHM_DIR.is_dir() or not os.access(SHM_DIR, os.W_OK):
        return f"{SHM_DIR} is missing or not writable"
    return None


def align(n: int) -> int:
    """``n`` rounded up to the record alignment (64 bytes, one cache line)."""
    return (n + ALIGN - 1) & ~(ALIGN - 1)


@dataclass(frozen=True)
class Layout:
    """Where everything sits in a segment for ``local_size`` ranks and rings of ``capacity`` bytes."""

    local_size: int
    capacity: int

    @property
    def channels_offset(self) -> int:
        return -(-(HEADER + SLOT * self.local_size) // 4096) * 4096

    @property
    def channel_stride(self) -> int:
        return CHANNEL_HEADER + self.capacity

    @property
    def size(self) -> int:
        return self.channels_offset + self.local_size**2 * self.channel_stride

    def slot(self, i: int) -> int:
        """Byte offset of local rank ``i``'s control slot."""
        return HEADER + SLOT * i

    def channel(self, src: int, dst: int) -> int:
        """Byte offset of the header of the ring from local rank ``src`` to ``dst``."""
        return self.channels_offset + (src * self.local_size + dst) * self.channel_stride


def default_capacity(local_size: int, budget: int = 128 << 20) -> int:
    """Ring size per ordered pair: 2 MiB, less when many ranks share ``budget`` bytes (>= 256 KiB).

    Small rings are faster than large ones: a ring that fits in the caches is
    written by one core and read by another without a trip to memory, and a
    large message streams through it in pieces anyway.
    """
    pairs = max(1, local_size * (local_size - 1))
    return max(256 << 10, min(2 << 20, budget // pairs)) // ALIGN * ALIGN


CAPACITY_ENV = "DDTK_SHM_RING_BYTES"


def capacity_from_env(local_size: int) -> int:
    """The ring size: :data:`CAPACITY_ENV` (bytes, ``K``/``M`` suffixes) or :func:`default_capacity`."""
    text = os.environ.get(CAPACITY_ENV, "").strip()
    if not text:
        return default_capacity(local_size)
    from ddtk.bench.timing import parse_size

    size = parse_size(text)
    if size < 4096:
        raise ValueError(f"{CAPACITY_ENV} must be at least 4K, got {text!r}")
    return size // ALIGN * ALIGN


class Segment:
    """One mapped segment: int32 and int64 views of it, and futex addresses inside it."""

    def __init__(self, path: Path, layout: Layout, mm: mmap.mmap):
        self.path, self.layout, self.mm = path, layout, mm
        self.q = memoryview(mm).cast("q")
        self.i = memoryview(mm).cast("i")
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(mm))

    @classmethod
    def create(cls, local_size: int, capacity: int) -> Segment:
        """Create, size and map a fresh segment named after this process (see :func:`sweep_stale`)."""
        layout = Layout(local_size, capacity)
        path = SHM_DIR / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:10]}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:  # reserve the memory now: a full tmpfs is an error here, not a SIGBUS later
                os.posix_fallocate(fd, 0, layout.size)
            except OSError as exc:
                free = os.statvfs(SHM_DIR)
                raise OSError(
                    f"cannot reserve {layout.size >> 20} MiB in {SHM_DIR} for the shared-memory "
                    f"transport ({free.f_bavail * free.f_frsize >> 20} MiB free): {exc.strerror}. "
                    "Enlarge /dev/shm (docker run --shm-size=1g) or use transport='tcp'."
                ) from None
            mm = mmap.mmap(fd, layout.size)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        seg = cls(path, layout, mm)
        seg.q[0], seg.q[1], seg.q[2] = MAGIC, local_size, capacity
        return seg

    @classmethod
    def open(cls, path: Path) -> Segment:
        """Map a segment another local rank created."""
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        head = memoryview(mm).cast("q")
        magic, local_size, capacity = head[0], head[1], head[2]
        head.release()
        if magic != MAGIC:
            mm.close()
            raise RuntimeError(f"{path} is not a ddtk shared-memory segment")
        return cls(path, Layout(local_size, capacity), mm)

    def address(self, offset: int) -> int:
        """The virtual address of byte ``offset`` (for futex calls)."""
        return self._base + offset

    def unlink(self) -> None:
        """Remove the file; the mappings stay valid until every process unmaps them."""
        self.path.unlink(missing_ok=True)


_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
if _libc is not None:
    _libc.process_vm_readv.restype = ctypes.c_ssize_t


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def futex_wait(address: int, expected: int, seconds: float) -> None:
    """Sleep while the int32 at ``address`` equals ``expected``, at most ``seconds``."""
    ts = _Timespec(int(seconds), int((seconds % 1) * 1e9))
    _libc.syscall(_SYS_FUTEX[platform.machine()], ctypes.c_void_p(address), _FUTEX_WAIT,
                  expected, ctypes.byref(ts), None, 0)  # fmt: skip


def futex_wake(address: int) -> None:
    """Wake the processes sleeping on the int32 at ``address``."""
    _libc.syscall(_SYS_FUTEX[platform.machine()], ctypes.c_void_p(address), _FUTEX_WAKE,
                  2**31 - 1, None, None, 0)  # fmt: skip


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def read_peer(pid: int, local: int, remote: int, nbytes: int) -> None:
    """Copy ``nbytes`` from address ``remote`` of process ``pid`` to ``local`` in this process.

    One copy, by the kernel (``process_vm_readv``, "cross-memory attach", what MPI
    libraries use for large messages inside a node). Raises OSError with the errno.
    """
    done = 0
    while done < nbytes:
        here, there = _IoVec(local + done, nbytes - done), _IoVec(remote + done, nbytes - done)
        got = _libc.process_vm_readv(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            raise OSError(err, f"process_vm_readv from process {pid}: {os.strerror(err)}")
        done += got


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def segments_of(pid: int) -> list[Path]:
    """The segment files created by process ``pid`` that still exist."""
    return sorted(SHM_DIR.glob(f"{PREFIX}{pid}-*"))


def sweep_stale() -> list[Path]:
    """Unlink segment files whose creating process is gone; return what was removed."""
    removed = []
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        try:
            pid = int(path.name[len(PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if not pid_alive(pid):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
