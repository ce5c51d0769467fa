"""Which checkpoints to keep: the last N, every k-th step, and never the only good one.

Rules, applied by :func:`apply_retention` to a run directory:

* good checkpoints (complete, checksums match) are kept when they are among
  the ``keep_last`` newest, or their step is a multiple of ``keep_every``;
  the newest good checkpoint is always kept, whatever the policy;
* bad ones (incomplete or corrupt) older than the newest good one are removed:
  a resume never needs them; bad ones newer than it are left alone, since a
  writer may still be filling them;
* with no good checkpoint at all, nothing is removed.

>>> from ddtk.checkpoint.retention import plan_retention
>>> sorted(plan_retention([100, 200, 300, 400, 500], keep_last=2, keep_every=200))
[200, 400, 500]
>>> sorted(plan_retention([100, 200], keep_last=None, keep_every=None))
[100, 200]
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from ddtk.checkpoint.layout import checkpoint_dirs
from ddtk.checkpoint.manifest import MANIFEST_NAME, verify

__all__ = ["apply_retention", "check_policy", "plan_retention"]


def check_policy(keep_last: int | None, keep_every: int | None) -> None:
    """ValueError unless each of ``keep_last``/``keep_every`` is None or an integer >= 1."""
    for name, value in (("keep_last", keep_last), ("keep_every", keep_every)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ValueError(f"{name} must be None or an integer >= 1, got {value!r}")


def plan_retention(
    good_steps: Iterable[int], keep_last: int | None = None, keep_every: int | None = None
) -> set[int]:
    """The steps to keep among the good checkpoints' steps (the newest always stays)."""
    check_policy(keep_last, keep_every)
    steps = sorted(set(good_steps))
    if not steps:
        return set()
    if keep_last is None and keep_every is None:
        return set(steps)
    keep = {steps[-1]}
    if keep_last is not None:
        keep.update(steps[-keep_last:])
    if keep_every is not None:
        keep.update(s for s in steps if s % keep_every == 0)
    return keep


def apply_retention(
    directory: str | os.PathLike[str],
    *,
    keep_last: int | None = None,
    keep_every: int | None = None,
    dry_run: bool = False,
    checksums: bool = True,
) -> list[Path]:
    """Delete the checkpoints the policy does not keep; returns the paths removed (or to remove).

    The newest good checkpoint is always found with full checksum verification.
    ``checksums=False`` checks the older ones for completeness only (sizes, no
    reading), which keeps a save from re-reading the whole history; an older
    checkpoint corrupted in place then counts as good for the policy.
    """
    check_policy(keep_last, keep_every)
    entries = checkpoint_dirs(directory)
    good: dict[int, Path] = {}
    newest: int | None = None
    for step, path in reversed(entries):
        if not verify(path, checksums=checksums or newest is None):
            good[step] = path
            newest = step if newest is None else newest
    if newest is None:
        return []
    keep = plan_retention(good, keep_last, keep_every)
    doomed = [
        path
        for step, path in entries
        if (step in good and step not in keep) or (step not in good and step < newest)
    ]
    if not dry_run:
        for path in doomed:
            # un-commit first: a removal cut short leaves an incomplete directory, never a
            # "complete" one with files missing
            (path / MANIFEST_NAME).unlink(missing_ok=True)
            shutil.rmtree(path, ignore_errors=True)
    return doomed
