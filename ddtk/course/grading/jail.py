"""Confine a graded notebook's kernel: its own namespaces, its own user, a read-only system.

A graded notebook is hostile code until proven otherwise: the submission controls its
kernel completely. :class:`Jail` wraps the kernel's command so that, where the machine
allows it,

- it runs in its **own PID, mount, IPC, UTS and network namespaces** (bubblewrap,
  Debian's ``bubblewrap`` package): it sees only its own processes, so it can neither
  signal nor drive a classmate's kernel, and when its kernel ends every process it
  started ends with it (``setsid`` and double forks do not leave a PID namespace); the
  network is loopback only;
- it sees the file system **read-only**, with a private ``/tmp`` and ``/dev/shm``, and
  only its own run folder writable. The paths the grader names as private (the
  solutions, the submissions, the output folder) are hidden under empty folders;
- it runs as **its own unprivileged user**, a fresh uid per run (only when the grader is
  root), with ``no_new_privs``: the file permissions of the machine apply to it, and two
  runs cannot touch each other's files or processes.

Where bubblewrap is missing or user namespaces are off, or the grader is not root,
grading still runs without the protection it lacks; :func:`confinement` says which, in
one line (``ddtk course grade`` prints it, ``ddtk doctor`` reports it).
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

_LAUNCHER = Path(__file__).with_name("limits.py")
# Environment variables a kernel keeps from the grader's: what Python, torch, Ray and
# Horovod read. Anything else (tokens, credentials, the grader's paths) is not passed on.
_ENV_PREFIXES = ("DDTK_", "RAY_", "OMP_", "MKL_", "OPENBLAS_", "HOROVOD_", "NCCL_", "GLOO_",
                 "TF_", "CUDA_", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS",
                 "LANG", "LC_", "TZ", "TERM", "MALLOC_", "_MALLOC")  # fmt: skip
_UID_RANGE = (1_000_000, 2_000_000_000)  # fresh uids: far above any real account


@dataclass(frozen=True)
class Confinement:
    """What this machine lets the grader do to contain a kernel, and what is missing."""

    bwrap: str | None  # the bubblewrap binary, when namespaces work
    own_user: bool  # each run gets a fresh uid (the grader is root)
    missing: tuple[str, ...]

    @property
    def namespaces(self) -> bool:
        return self.bwrap is not None

    def summary(self) -> str:
        """One line: what is in force, or which protections are missing."""
        if not self.missing:
            return (
                "sandbox: own PID, mount, IPC and network namespaces (loopback only), read-only "
                "system, a fresh unprivileged user per run"
            )
        return "sandbox: missing protections: " + "; ".join(self.missing)


def _bwrap_works(bwrap: str) -> bool:
    """Whether bubblewrap can make the namespaces a run needs on this machine."""
    probe = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid",
             "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "true"]  # fmt: skip
    if os.geteuid() != 0:
        probe.insert(1, "--unshare-user")
    try:
        return subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.cache
def confinement() -> Confinement:
    """Probe (once per process) which protections this machine can give a graded kernel."""
    missing = []
    bwrap = shutil.which("bwrap")
    if os.environ.get("DDTK_GRADE_SANDBOX", "").lower() in ("0", "off", "none"):
        bwrap = None
        missing.append("namespaces switched off (DDTK_GRADE_SANDBOX=off)")
    elif bwrap is None:
        missing.append(
            "no bubblewrap (apt-get install bubblewrap): kernels share the network, the file "
            "system's view and the process table"
        )
    elif not _bwrap_works(bwrap):
        bwrap = None
        missing.append(
            "bubblewrap cannot create namespaces here (user namespaces disabled?): kernels share "
            "the network, the file system's view and the process table"
        )
    own_user = os.geteuid() == 0
    closed = sorted({c for p in _needed_paths() for c in _closed_ancestors(p)})
    if not own_user:
        missing.append("not root: kernels run as the grader's own user")
    elif bwrap is None and closed:  # without a mount namespace there is no way around them
        own_user = False
        missing.append(
            f"the interpreter lives under {closed[0]}, which other users cannot enter: kernels "
            "run as the grader's own user"
        )
    return Confinement(bwrap, own_user, tuple(missing))


def _closed_ancestors(path: Path) -> list[Path]:
    """Ancestors of ``path`` that other users may not traverse (``/root`` holding a pyenv)."""
    closed = []
    for parent in reversed(path.parents):
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue
        if parent != Path("/") and not mode & stat.S_IXOTH:
            closed.append(parent)
    return closed


def _needed_paths() -> list[Path]:
    """What a kernel must reach: the interpreter, its prefixes, and this package."""
    import ddtk

    paths = {Path(sys.executable).resolve(), Path(sys.prefix), Path(sys.base_prefix)}
    paths.add(Path(ddtk.__file__).resolve().parents[1])
    return sorted(paths)


def private_paths(*paths: Path | None) -> list[Path]:
    """``paths`` and the course's own private folder (``solutions/``: lab answers, the quiz
    key, the project reference), for :class:`Jail` to hide."""
    import ddtk

    found = [Path(p).absolute() for p in paths if p is not None]
    found.append(Path(ddtk.__file__).resolve().parents[1] / "solutions")
    return found


def kernel_env(base: Mapping[str, str], home: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """The environment a kernel gets: a few of the grader's variables, its own home, ``extra``."""
    env = {k: v for k, v in base.items() if k.startswith(_ENV_PREFIXES)}
    env["PATH"] = os.pathsep.join(
        dict.fromkeys([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    )
    env.update(HOME=str(home), MPLCONFIGDIR=str(home / ".config" / "matplotlib"),
               IPYTHONDIR=str(home / ".ipython"), XDG_CACHE_HOME=str(home / ".cache"))  # fmt: skip
    env.update(extra)
    return env


class Jail:
    """One run's confinement: its writable folder, its uid, the paths it must not see."""

    def __init__(self, folder: Path, hide: Iterable[Path] = (), conf: Confinement | None = None):
        self.conf = conf or confinement()
        self.folder = folder
        self.uid = secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0]
        self.hide = [Path(p).absolute() for p in hide]
        if self.conf.own_user:
            os.chown(folder, self.uid, self.uid)
            os.chmod(folder, 0o700)
            os.chmod(folder.parent, 0o711)  # traversable, not listable

    @property
    def tmp(self) -> Path:
        """The kernel's ``TMPDIR``: a private ``/tmp`` in namespaces, else inside its folder."""
        return Path("/tmp") if self.conf.namespaces else self.folder / "tmp"

    def _bwrap_args(self, tmp_mb: int, cwd: Path | None = None) -> list[str]:
        size = ["--size", str(tmp_mb * 2**20)] if tmp_mb else []
        args = [self.conf.bwrap or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev",
                "--perms", "1777", *size, "--tmpfs", "/dev/shm",
                "--proc", "/proc", "--perms", "1777", *size, "--tmpfs", "/tmp",
                "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--hostname", "localhost",
                "--die-with-parent", "--new-session", "--unsetenv", "JPY_PARENT_PID"]  # fmt: skip
        if os.geteuid() != 0:
            args.insert(1, "--unshare-user")
        needed = _needed_paths()
        tmp = Path("/tmp")
        # the private /tmp would hide a checkout or a venv that lives there: show it again
        # (before the closed folders, which may lie below it)
        shown = sorted({tmp / p.relative_to(tmp).parts[0] for p in needed if tmp in p.parents})
        for top in shown:
            args += ["--ro-bind", str(top), str(top)]
        for closed in sorted({c for p in needed for c in _closed_ancestors(p)}):
            args += ["--perms", "0755", "--tmpfs", str(closed)]
            tops = {closed / p.relative_to(closed).parts[0] for p in needed if closed in p.parents}
            for top in sorted(tops):  # put back what lives below it
                args += ["--ro-bind", str(top), str(top)]
        for path in self.hide:
            if path.is_dir() and not any(path == p or path in p.parents for p in needed):
                args += ["--perms", "0555", "--tmpfs", str(path)]
        for parent in reversed(self.folder.parents):  # inside the private /tmp: traversable
            if tmp in parent.parents and not any(t == parent or t in parent.parents for t in shown):
                args += ["--perms", "0711", "--dir", str(parent)]
        args += ["--bind", str(self.folder), str(self.folder), "--chdir", str(cwd or self.folder)]
        return args

    def wrap(
        self, cmd: list[str], limits: Mapping[str, int], chown: Iterable[str] = (), tmp_mb: int = 0,
        cwd: Path | None = None,
    ) -> list[str]:  # fmt: skip
        """``cmd`` run inside the jail, under ``limits`` (see :mod:`.limits`); its private
        ``/tmp`` and ``/dev/shm`` hold ``tmp_mb`` MiB each (0: the system's default size);
        ``cwd``: its working folder, inside :attr:`folder` (default: the folder itself)."""
        launcher = [sys.executable, "-I", str(_LAUNCHER)]
        for key, value in limits.items():
            if key == "nproc" and not self.conf.own_user:
                continue  # RLIMIT_NPROC counts every task of the uid: the grader's own, here
            launcher += [f"--{key.replace('_', '-')}", str(int(value))]
        if self.conf.own_user:
            launcher += ["--uid", str(self.uid)]
            for path in chown:
                launcher += ["--chown", path]
        launcher += ["--", *cmd]
        if self.conf.namespaces:
            return [*self._bwrap_args(tmp_mb, cwd), *launcher]
        return launcher


__all__ = ["Confinement", "Jail", "confinement", "kernel_env", "private_paths"]
