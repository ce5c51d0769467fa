"""Load a sharded checkpoint at any world size: verify together, then read only the overlapping pieces.

The ranks of the loading world share the hashing of the shard files and the
problems they find, so all of them pick the same checkpoint; then each rank
memory-maps only the shard files that hold the ranges it asked for.
"""

from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ddtk.checkpoint.atomic import CheckpointError
from ddtk.checkpoint.layout import CheckpointNotFoundError, UnsafeCheckpointError, checkpoint_dirs
from ddtk.checkpoint.manifest import (
    MANIFEST_NAME,
    CorruptCheckpointError,
    describe_file,
    read_manifest,
    verify,
)
from ddtk.checkpoint.shards import (
    KIND,
    TAG_VERIFY,
    ShardedCheckpoint,
    ShardedTensor,
    clone_tensors,
    shard_name,
    shard_range,
)
from ddtk.checkpoint.state import CheckpointMismatchError, restore_rng

__all__ = ["load_sharded", "restore_per_rank_rng"]


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it holds pickled objects that are not tensors or "
            f"plain data; nothing from it was executed"
        ) from exc


def _problems(ctx: Any, path: Path) -> list[str]:
    """Every problem of checkpoint ``path``, the same list on every rank.

    Each rank checks that the manifest is there and every file has its size,
    hashes every ``world_size``-th file (so the files are hashed once in all,
    spread over the ranks), and the ranks share what they found.
    """
    problems = verify(path, checksums=False)
    if not problems:
        files = read_manifest(path)["files"]
        for name in sorted(files)[ctx.rank :: ctx.world_size]:
            try:
                digest = describe_file(path / name).sha256
            except OSError as exc:  # reported like any other problem, so no rank is left waiting
                problems.append(f"{name}: unreadable ({exc})")
                continue
            if digest != files[name]["sha256"]:
                problems.append(f"{name}: sha256 differs from the manifest (the file is corrupt)")
    if ctx.world_size > 1:
        others = [r for r in range(ctx.world_size) if r != ctx.rank]
        for r in others:
            ctx.send(problems, r, tag=TAG_VERIFY)
        for r in others:
            problems = problems + ctx.recv(r, tag=TAG_VERIFY).payload
    return sorted(set(problems))


def _good_dir(ctx: Any, source: Path) -> Path:
    """The checkpoint directory to read: ``source`` itself, or the newest good one under it."""
    if not source.is_dir():
        raise CheckpointNotFoundError(f"no checkpoint directory at {source}")
    if source.name.startswith("step-") or (source / MANIFEST_NAME).exists():
        problems = _problems(ctx, source)
        if problems:
            raise CorruptCheckpointError(f"checkpoint {source} is bad: " + "; ".join(problems))
        return source
    tried = []
    for _step, path in reversed(checkpoint_dirs(source)):
        problems = _problems(ctx, path)
        if not problems:
            return path
        warnings.warn(
            f"skipping checkpoint {path}: "
            + "; ".join(problems)
            + "; falling back to an older one",
            RuntimeWarning,
            stacklevel=3,
        )
        tried.append(path.name)
    raise CheckpointNotFoundError(
        f"no good checkpoint in {source}" + (f" (bad: {', '.join(tried)})" if tried else "")
    )


def _wanted(name: str, numel: int, ranges: Any, ctx: Any) -> tuple[int, int]:
    if callable(ranges):
        want = ranges(name, numel)
    else:
        want = ranges.get(name) if isinstance(ranges, Mapping) else ranges
    if want is None:
        return shard_range(numel, ctx.world_size, ctx.rank)
    if want == "full":
        return 0, numel
    lo, hi = want
    if not 0 <= lo <= hi <= numel:
        raise ValueError(f"range {want} of {name!r} is outside [0, {numel}]")
    return int(lo), int(hi)


def load_sharded(
    ctx: Any,
    source: str | os.PathLike[str],
    *,
    ranges: Mapping[str, Any] | Callable[[str, int], Any] | str | None = None,
) -> ShardedCheckpoint:
    """Read the part of a sharded checkpoint this rank needs, at any world size.

    ``source`` is a checkpoint directory (it must be good, else
    :class:`~ddtk.checkpoint.manifest.CorruptCheckpointError` naming the bad
    files) or a run directory (the newest good checkpoint; newer bad ones are
    skipped with a warning naming the files). Sizes and checksums are verified
    before anything is read: the ranks share the hashing (each file is hashed
    once) and the problems they find, so all of them pick the same checkpoint;
    every rank of the new world must therefore call this together.
    ``ranges`` picks the elements of each flat entry this rank gets: by default
    its :func:`shard_range` in the new world; ``"full"`` for whole tensors, or a
    mapping ``name -> (lo, hi) | "full"`` (unlisted names keep the default), or a
    callable ``(name, numel) -> (lo, hi) | "full" | None``.
    Only the shard files overlapping those ranges are opened (memory mapped).
    Per-rank entries come back only if the world size is the saving one.
    """
    path = _good_dir(ctx, Path(source))
    manifest = read_manifest(path)
    if manifest.get("kind") != KIND:
        raise CheckpointError(
            f"{path} is a {manifest.get('kind')!r} checkpoint; load_sharded() reads {KIND!r} ones"
        )
    saved_world = int(manifest["world_size"])
    files: dict[int, Any] = {}

    def shard(rank: int) -> Any:
        if rank not in files:
            files[rank] = _torch_load(path / shard_name(rank, saved_world))
        return files[rank]

    flat = {}
    for name, entry in manifest["extra"]["sharded"]["flat"].items():
        lo, hi = _wanted(name, entry["numel"], ranges, ctx)
        out = torch.empty(hi - lo, dtype=getattr(torch, entry["dtype"]))
        for rank, offset, length in entry["chunks"]:
            a, b = max(lo, offset), min(hi, offset + length)
            if a < b:
                out[a - lo : b - lo] = shard(rank)["flat"][name][a - offset : b - offset]
        flat[name] = ShardedTensor(out, lo, entry["numel"])
    notes = []
    per_rank = None
    if saved_world == ctx.world_size:
        per_rank = dict(shard(ctx.rank)["per_rank"])
    else:
        notes.append(
            f"per-rank entries (RNG states) were saved by {saved_world} ranks and this run has "
            f"{ctx.world_size}: they are not restored"
        )
    replicated = clone_tensors(shard(0)["replicated"])
    per_rank = clone_tensors(per_rank)
    files.clear()
    meta = dict(manifest["extra"].get("meta", {}))
    return ShardedCheckpoint(path, manifest, flat, replicated, per_rank, meta, notes)


def restore_per_rank_rng(ckpt: ShardedCheckpoint, rng: bool) -> None:
    if not rng:
        return
    if ckpt.per_rank is None:
        return  # the note in ckpt.notes says why
    if "rng" not in ckpt.per_rank:
        raise CheckpointMismatchError("the checkpoint holds no RNG state (pass rng=False)")
    restore_rng(ckpt.per_rank["rng"])
