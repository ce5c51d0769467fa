"""Executed notebooks kept by what they ran, so one execution serves every reader.

A notebook run costs minutes when it starts a Ray cluster or a Horovod job, and the
same run is wanted by several readers: a lab's own test, its graded class, and (later)
the course site. :class:`ExecutionCache` stores each run under a key made of

- what the run executes: the code cells' sources in order (the parameters a run injects
  are a cell of their own, so they are part of it);
- how it runs: the runner's name and settings (a time or memory limit can change the
  result);
- what it runs against: a digest of the ddtk package's own files, the Python version
  and every installed distribution's version (:func:`environment_digest`).

Change any of them and the key changes, so a stale run is never read back. Two
processes that ask for the same key at once take a file lock: the second waits for the
first's result instead of running it again. Entries live under ``build/executed/``
unless ``DDTK_EXECUTED`` names another folder; deleting the folder (or ``make test
FRESH=1``) forces fresh executions.

A run that ends in a time-out, a dead kernel or a kernel that never started is not
kept: it says something about the machine at that moment, not about the notebook.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbformat import NotebookNode

    from ddtk.course.grading.sandbox import Execution

ENV_VAR = "DDTK_EXECUTED"
DEFAULT_ROOT = Path("build") / "executed"
_FORMAT = 1  # bump when what an entry holds changes
_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


@functools.cache
def environment_digest() -> str:
    """A hash of what a notebook runs against: ddtk's files, Python, installed versions.

    Computed once per process: reading ddtk's few hundred files and the installed
    distributions' names takes well under a second.
    """
    from importlib import metadata

    import ddtk

    h = hashlib.sha256()
    h.update(f"format {_FORMAT}\n{sys.version}\n{sys.executable}\n".encode())
    package = Path(ddtk.__file__).resolve().parent
    for path in sorted(package.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".sh", ".yaml", ".json"):
            h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    versions = sorted(
        f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions() if d.metadata["Name"]
    )
    h.update("\n".join(versions).encode())
    return h.hexdigest()


def code_of(nb: NotebookNode | Mapping[str, Any]) -> list[str]:
    """The sources of ``nb``'s code cells, in order: what executing it runs."""
    return [
        src if isinstance(src := c.get("source", ""), str) else "".join(src)
        for c in nb["cells"]
        if c.get("cell_type") == "code"
    ]


def execution_key(runner: str, nb: NotebookNode, settings: Mapping[str, Any]) -> str:
    """The key of running ``nb`` with ``runner`` and ``settings`` in this environment."""
    blob = json.dumps(
        {"runner": runner, "code": code_of(nb), "settings": dict(settings),
         "environment": environment_digest()},
        sort_keys=True, default=str,
    )  # fmt: skip
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CacheStats:
    """How many runs of this process came from the cache and how many executed."""

    hits: int
    executed: int


class ExecutionCache:
    """A folder of executed notebooks, one entry per :func:`execution_key`."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root or os.environ.get(ENV_VAR) or DEFAULT_ROOT).absolute()
        self.hits = 0
        self.executed = 0

    @property
    def stats(self) -> CacheStats:
        return CacheStats(self.hits, self.executed)

    def entry(self, runner: str, label: str, key: str) -> Path:
        """The folder of one entry: the runner, a readable label (the notebook's name), the key."""
        slug = _SLUG.sub("-", label).strip("-") or "notebook"
        return self.root / runner / f"{slug}-{key[:20]}"

    @contextlib.contextmanager
    def _locked(self, folder: Path) -> Iterator[None]:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.with_name(folder.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def sandboxed(
        self,
        nb: NotebookNode,
        *,
        name: str,
        timeout: float,
        memory_mb: int,
        execute: Callable[..., Execution] | None = None,
        hide: tuple[Path, ...] | list[Path] = (),
    ) -> Execution:
        """:func:`~ddtk.course.grading.sandbox.execute` of ``nb``, or its stored result.

        The result is the same object a fresh run returns (executed notebook, status,
        the cells that finished, the hand-in files); ``seconds`` is the stored run's.
        """
        if execute is None:
            from ddtk.course.grading.sandbox import execute
        settings = {"name": name, "timeout": timeout, "memory_mb": memory_mb}
        folder = self.entry("sandbox", Path(name).stem, execution_key("sandbox", nb, settings))
        with self._locked(folder):
            stored = _load_execution(folder)
            if stored is not None:
                self.hits += 1
                return stored
            run = execute(nb, name=name, timeout=timeout, memory_mb=memory_mb, hide=hide)
            self.executed += 1
            if run.status == "completed":
                _store_execution(folder, run, name)
            return run


def _store_execution(folder: Path, run: Execution, name: str) -> None:
    """Write ``run`` to ``folder`` atomically: a reader sees all of it or none of it."""
    import nbformat

    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "handin").mkdir(parents=True)
    nbformat.write(run.notebook, str(partial / name))
    for file, data in run.handin.items():
        (partial / "handin" / file).write_bytes(data)
    meta = {"notebook": name, "status": run.status, "seconds": run.seconds,
            "reason": run.reason, "finished": sorted(run.finished), "handin": sorted(run.handin)}  # fmt: skip
    (partial / "run.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)


def _load_execution(folder: Path) -> Execution | None:
    """The run stored in ``folder``, or None when there is none (or it cannot be read)."""
    import nbformat

    from ddtk.course.grading.sandbox import Execution

    try:
        meta = json.loads((folder / "run.json").read_text())
        nb = nbformat.read(str(folder / meta["notebook"]), as_version=4)
        handin = {f: (folder / "handin" / f).read_bytes() for f in meta["handin"]}
    except (OSError, ValueError, KeyError):
        return None
    return Execution(nb, meta["status"], meta["seconds"], meta["reason"], set(meta["finished"]), handin)


__all__ = [
    "DEFAULT_ROOT",
    "ENV_VAR",
    "CacheStats",
    "ExecutionCache",
    "code_of",
    "environment_digest",
    "execution_key",
]
