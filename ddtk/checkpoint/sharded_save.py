"""Save a sharded checkpoint: every rank writes its shard, rank 0 checks the layout and commits.

Rank 0 prepares the ``step-N`` directory; each rank writes its own file
atomically and reports its size and sha256 (or its error) to rank 0, which
checks that the flat pieces tile every tensor and writes the manifest last. If
any rank failed, nothing is committed and every rank raises the same
:class:`~ddtk.checkpoint.shards.ShardWriteError`.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ddtk.checkpoint.atomic import CheckpointError, FileInfo, atomic_torch_save
from ddtk.checkpoint.layout import step_dir
from ddtk.checkpoint.manifest import MANIFEST_NAME
from ddtk.checkpoint.manifest import write_manifest as _write_manifest
from ddtk.checkpoint.retention import apply_retention, check_policy
from ddtk.checkpoint.shards import (
    KIND,
    TAG_OUTCOME,
    TAG_READY,
    TAG_REPORT,
    ShardedState,
    ShardWriteError,
    shard_name,
)

__all__ = ["save_sharded"]


def _layout(state: ShardedState) -> dict[str, list[Any]]:
    return {
        name: [t.offset, t.local.numel(), t.numel, str(t.local.dtype).removeprefix("torch.")]
        for name, t in state.flat.items()
    }


def _check_layouts(layouts: list[dict[str, list[Any]]]) -> dict[str, Any]:
    """Merge the ranks' layouts into the manifest's; ValueError unless the pieces tile each tensor."""
    names = set(layouts[0])
    for rank, lay in enumerate(layouts):
        if set(lay) != names:
            raise ValueError(
                f"ranks 0 and {rank} save different flat entries: {sorted(names ^ set(lay))}"
            )
    merged = {}
    for name in sorted(names):
        _, _, numel, dtype = layouts[0][name]
        chunks = []
        for rank, lay in enumerate(layouts):
            offset, length, n, dt = lay[name]
            if (n, dt) != (numel, dtype):
                raise ValueError(
                    f"flat entry {name!r}: rank 0 has {numel} {dtype} elements, rank {rank} {n} {dt}"
                )
            if length:
                chunks.append([rank, offset, length])
        covered = 0
        for _, offset, length in sorted(chunks, key=lambda c: c[1]):
            if offset != covered:
                raise ValueError(
                    f"flat entry {name!r}: the ranks' pieces leave a gap or overlap at element "
                    f"{min(offset, covered)}"
                )
            covered += length
        if covered != numel:
            raise ValueError(f"flat entry {name!r}: pieces cover {covered} of {numel} elements")
        merged[name] = {"numel": numel, "dtype": dtype, "chunks": chunks}
    return merged


def _prepare_dir(path: Path) -> str | None:
    """Rank 0 empties ``path`` for a new checkpoint; returns an error message or None."""
    if (path / MANIFEST_NAME).exists():
        return f"a committed checkpoint already exists at {path}"
    try:
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
    except OSError as exc:
        return f"could not create {path}: {exc}"
    return None


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU in storage of its own (``torch.save`` of a view writes the whole base)."""
    t = t.detach().cpu()
    return t.clone() if t.untyped_storage().nbytes() != t.nbytes else t


def _write_shard(ctx: Any, path: Path, state: ShardedState) -> dict[str, Any]:
    """Write this rank's shard; returns a report for rank 0 (errors included, never raised)."""
    name = shard_name(ctx.rank, ctx.world_size)
    payload = {
        "flat": {k: _compact(t.local) for k, t in state.flat.items()},
        "per_rank": state.per_rank,
        "replicated": state.replicated if ctx.rank == 0 else {},
    }
    try:
        info = atomic_torch_save(payload, path / name)
    except Exception as exc:  # every rank must hear about it, so it travels to rank 0
        return {"ok": False, "error": f"rank {ctx.rank} could not write {name}: {exc}"}
    return {"ok": True, "file": name, "size": info.size, "sha256": info.sha256}


def _commit(
    path: Path,
    reports: list[dict[str, Any]],
    layouts: list[dict[str, list[Any]]],
    manifest: dict[str, Any],
) -> str | None:
    """Rank 0 writes the manifest if every shard is good; else removes the directory.

    Returns None once committed, else the errors, which every rank then raises.
    """
    errors = [r["error"] for r in reports if not r["ok"]]
    if not errors:
        try:
            extra = {"meta": manifest.pop("meta"), "sharded": {"flat": _check_layouts(layouts)}}
            files = {r["file"]: FileInfo(r["size"], r["sha256"]) for r in reports}
            _write_manifest(path, files, kind=KIND, extra=extra, **manifest)
            return None
        except (ValueError, TypeError, CheckpointError, OSError) as exc:
            errors.append(f"rank 0 could not commit {path}: {exc}")
    shutil.rmtree(path, ignore_errors=True)
    return "; ".join(errors) + "; nothing was committed"


def save_sharded(
    ctx: Any,
    directory: str | os.PathLike[str],
    state: ShardedState,
    step: int,
    *,
    epoch: int | None = None,
    extra: Mapping[str, Any] | None = None,
    keep_last: int | None = None,
    keep_every: int | None = None,
) -> Path:
    """Every rank calls this with its own :class:`ShardedState`; returns ``directory/step-N``.

    Rank 0 prepares the directory, each rank writes its shard atomically and
    reports its size and sha256 (or its error) to rank 0, which checks that the
    flat pieces tile every tensor and then writes the manifest (the commit).
    If any rank failed, nothing is committed, the directory is removed, and
    every rank raises :class:`ShardWriteError` naming the rank and file. A
    rank killed mid-way leaves an uncommitted directory that
    :func:`~ddtk.checkpoint.store.latest` ignores (the others get the context's
    ``op_timeout`` error, or wait for the launcher to stop them). No rank
    returns before the commit. ``state.meta`` and ``extra`` must be JSON; both
    come back in :attr:`ShardedCheckpoint.meta` (``extra`` under ``"extra"``).
    Retention runs on rank 0 after the commit; if it fails, a warning says so.
    """
    if not isinstance(state, ShardedState):
        raise TypeError(f"state must be a ShardedState, got {type(state).__name__}")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    check_policy(keep_last, keep_every)
    meta = dict(state.meta, step=step, epoch=epoch, extra=dict(extra or {}))
    try:
        json.dumps(meta)
    except TypeError as exc:
        raise TypeError(f"state.meta and extra must be JSON-serialisable: {exc}") from None
    path = step_dir(directory, step)
    error = _share(ctx, _prepare_dir(path) if ctx.rank == 0 else None, TAG_READY)
    if error is not None:
        raise CheckpointError(error)
    report = dict(_write_shard(ctx, path, state), layout=_layout(state))
    outcome = None
    if ctx.rank == 0:
        reports = [report] + [ctx.recv(r, tag=TAG_REPORT).payload for r in range(1, ctx.world_size)]
        layouts = [r.pop("layout") for r in reports]
        info = {"step": step, "epoch": epoch, "world_size": ctx.world_size, "meta": meta}
        outcome = _commit(path, reports, layouts, info)
        if outcome is None:
            _retain(directory, keep_last, keep_every)
    else:
        ctx.send(report, 0, tag=TAG_REPORT)
    outcome = _share(ctx, outcome, TAG_OUTCOME)
    if outcome is not None:
        raise ShardWriteError(outcome)
    ctx.barrier()
    return path


def _retain(directory: Any, keep_last: int | None, keep_every: int | None) -> None:
    """Apply the retention policy; a failure there must not fail the committed save."""
    if keep_last is None and keep_every is None:
        return
    try:
        apply_retention(directory, keep_last=keep_last, keep_every=keep_every, checksums=False)
    except (OSError, CheckpointError) as exc:
        warnings.warn(f"retention in {directory} failed: {exc}", RuntimeWarning, stacklevel=3)


def _share(ctx: Any, value: Any, tag: int) -> Any:
    """Rank 0's ``value`` on every rank (plain objects through send/recv)."""
    if ctx.rank == 0:
        for r in range(1, ctx.world_size):
            ctx.send(value, r, tag=tag)
        ctx.flush()
        return value
    return ctx.recv(0, tag=tag).payload
