"""The layout of a run directory: ``step-N`` folders, their file names, and what a load returns.

Every kind of checkpoint (full, incremental, sharded) lives in a folder
``step-000123/`` of the run directory, so retention, :func:`~ddtk.checkpoint.store.latest`
and the loaders of every kind find checkpoints the same way. This module is that
shared ground, with no knowledge of any one kind: the other checkpoint modules build
on it and never on each other's internals.

>>> step_dir("run", 7).name
'step-000007'
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtk.checkpoint.atomic import CheckpointError
from ddtk.checkpoint.state import CheckpointState

__all__ = [
    "META_FILE",
    "STATE_FILE",
    "STEP_RE",
    "Checkpoint",
    "CheckpointNotFoundError",
    "SavedAt",
    "UnsafeCheckpointError",
    "checkpoint_dirs",
    "step_dir",
]

STATE_FILE = "state.pt"
META_FILE = "meta.json"
STEP_RE = re.compile(r"^step-(\d+)$")


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No complete, verified checkpoint exists where one was asked for."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file holds pickled objects other than tensors and plain data; it was not run."""


class SavedAt:
    """The step and epoch of a loaded checkpoint, read from its ``manifest``."""

    manifest: dict[str, Any]

    @property
    def step(self) -> int:
        """The step it was saved at."""
        return int(self.manifest["step"])

    @property
    def epoch(self) -> int | None:
        """The epoch it was saved at."""
        return self.manifest.get("epoch")


@dataclass
class Checkpoint(SavedAt):
    """A loaded checkpoint: where it was, its manifest and its state."""

    path: Path
    manifest: dict[str, Any]
    state: CheckpointState


def step_dir(directory: str | os.PathLike[str], step: int) -> Path:
    """The directory of the checkpoint of ``step`` inside a run directory."""
    return Path(directory) / f"step-{step:06d}"


def checkpoint_dirs(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-N`` directory (complete or not), oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = STEP_RE.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)
