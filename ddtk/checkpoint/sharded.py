"""Sharded checkpoints: every rank writes its own piece, and any world size can load them.

A sharded checkpoint is a ``step-000123/`` directory (found by
:func:`~ddtk.checkpoint.store.latest` and pruned by retention like any other)
holding one file per rank, ``shard-00001-of-00004.pt``, and the manifest,
written last by rank 0 once every rank has reported its shard durable. What a
rank saves is a :class:`ShardedState` of three kinds of entries:

* **flat** entries (:class:`ShardedTensor`): a 1-D global tensor of known
  ``numel`` split into contiguous ranges, one per rank (DCP's chunk metadata).
  The layout goes into the manifest, so a run with another world size can find
  and read only the pieces that overlap the range it needs (files are memory
  mapped): a 4-rank checkpoint resumes on 2 or 3 ranks;
* **replicated** entries (scheduler state, optimizer hyperparameters, scalar
  counters): identical on every rank, written once, by rank 0;
* **per-rank** entries (RNG states): stored in each rank's own file and given
  back only when the world size is the same; at another world size they are
  left alone and :attr:`ShardedCheckpoint.notes` says so.

:func:`save_sharded` and :func:`load_sharded` are the generic pair;
:func:`zero_state`/:func:`load_zero` do it for a
:class:`~ddtk.parallel.zero.ZeroOptimizer` (each rank saves the part of the
parameters and optimizer state it owns), :func:`dp_state`/:func:`load_dp` for
plain data parallelism (each rank writes 1/N of the replicated model and
optimizer, which spreads the writes; a load reads it all back).

>>> import ddtk, tempfile, torch
>>> from ddtk.checkpoint.sharded import ShardedState, ShardedTensor, load_sharded, save_sharded
>>> def save(ctx, run):
...     full = torch.arange(10.0)
...     state = ShardedState(flat={"w": ShardedTensor.from_full(full, ctx.rank, ctx.world_size)})
...     return save_sharded(ctx, run, state, step=3).name
>>> def load(ctx, run):
...     return load_sharded(ctx, run).flat["w"].local.tolist()
>>> run = tempfile.mkdtemp()
>>> ddtk.launch(save, 2, args=(run,), echo=False, timeout=120)
['step-000003', 'step-000003']
>>> ddtk.launch(load, 3, args=(run,), echo=False, timeout=120)
[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddtk.checkpoint.atomic import CheckpointError, FileInfo, atomic_torch_save
from ddtk.checkpoint.manifest import (
    MANIFEST_NAME,
    CorruptCheckpointError,
    describe_file,
    read_manifest,
    verify,
)
from ddtk.checkpoint.manifest import write_manifest as _write_manifest
from ddtk.checkpoint.state import (
    CheckpointMismatchError,
    ResumableSampler,
    capture_rng,
    check_model_compatible,
    restore_rng,
)
from ddtk.checkpoint.store import (
    CheckpointNotFoundError,
    UnsafeCheckpointError,
    checkpoint_dirs,
    step_dir,
)

__all__ = [
    "KIND",
    "ShardWriteError",
    "ShardedCheckpoint",
    "ShardedState",
    "ShardedTensor",
    "dp_state",
    "load_dp",
    "load_sharded",
    "load_zero",
    "save_sharded",
    "shard_name",
    "shard_range",
    "zero_state",
]

KIND = "sharded"
"""The manifest ``kind`` of a sharded checkpoint."""

_TAG_READY, _TAG_REPORT, _TAG_OUTCOME, _TAG_VERIFY = 7301, 7302, 7303, 7304


class ShardWriteError(CheckpointError):
    """A rank could not write its shard; nothing was committed and every rank raises this."""


def shard_name(rank: int, world_size: int) -> str:
    """The file name of ``rank``'s shard: ``shard-00001-of-00004.pt``."""
    return f"shard-{rank:05d}-of-{world_size:05d}.pt"


def shard_range(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """``[lo, hi)`` of a 1-D tensor of ``numel`` elements that ``rank`` holds.

    The rule of :class:`~ddtk.parallel.zero.ZeroOptimizer`: chunks of
    ``ceil(numel / world_size)``, the last ones shorter or empty (ZeRO pads
    instead; the padding is never saved).

    >>> [shard_range(10, 4, r) for r in range(4)]
    [(0, 3), (3, 6), (6, 9), (9, 10)]
    >>> [shard_range(2, 3, r) for r in range(3)]
    [(0, 1), (1, 2), (2, 2)]
    """
    if world_size < 1 or not 0 <= rank < world_size or numel < 0:
        raise ValueError(f"bad shard_range({numel}, {world_size}, {rank})")
    size = math.ceil(numel / world_size)
    return min(rank * size, numel), min((rank + 1) * size, numel)


@dataclass
class ShardedTensor:
    """Elements ``[offset, offset + local.numel())`` of a 1-D global tensor of ``numel`` elements.

    >>> t = ShardedTensor.from_full(torch.arange(10.0), rank=3, world_size=4)
    >>> t.local.tolist(), t.offset, t.numel
    ([9.0], 9, 10)
    """

    local: torch.Tensor
    offset: int
    numel: int

    def __post_init__(self) -> None:
        if not isinstance(self.local, torch.Tensor) or self.local.dim() != 1:
            raise TypeError("ShardedTensor.local must be a 1-D tensor")
        if not 0 <= self.offset <= self.offset + self.local.numel() <= self.numel:
            raise ValueError(
                f"piece [{self.offset}, {self.offset + self.local.numel()}) does not fit in a "
                f"tensor of {self.numel} elements"
            )

    @classmethod
    def from_full(cls, full: torch.Tensor, rank: int, world_size: int) -> ShardedTensor:
        """``rank``'s piece (:func:`shard_range`) of ``full``, flattened and copied."""
        flat = full.detach().reshape(-1)
        lo, hi = shard_range(flat.numel(), world_size, rank)
        return cls(flat[lo:hi].clone(), lo, flat.numel())


@dataclass
class ShardedState:
    """What one rank saves: flat pieces, replicated entries, per-rank entries and JSON metadata.

    ``replicated`` is written by rank 0 only (every rank should hold the same);
    ``per_rank`` is restored only at the same world size; ``meta`` must be JSON.

    >>> st = ShardedState(
    ...     flat={"w": ShardedTensor.from_full(torch.ones(5), rank=0, world_size=2)},
    ...     replicated={"lr": 0.1},
    ...     meta={"note": "warm-up done"},
    ... )
    >>> st.flat["w"].local.tolist(), st.per_rank
    ([1.0, 1.0, 1.0], {})
    """

    flat: dict[str, ShardedTensor] = field(default_factory=dict)
    replicated: dict[str, Any] = field(default_factory=dict)
    per_rank: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class ShardedCheckpoint:
    """A sharded checkpoint as loaded by one rank of the new world (see the module example).

    ``flat`` holds this rank's requested pieces, ``per_rank`` is None when the
    world size changed, and ``notes`` says what was not restored and why.
    """

    path: Path
    manifest: dict[str, Any]
    flat: dict[str, ShardedTensor]
    replicated: dict[str, Any]
    per_rank: dict[str, Any] | None
    meta: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def step(self) -> int:
        """The step it was saved at."""
        return int(self.manifest["step"])

    @property
    def epoch(self) -> int | None:
        """The epoch it was saved at."""
        return self.manifest.get("epoch")

    @property
    def saved_world_size(self) -> int:
        """The number of ranks that wrote it."""
        return int(self.manifest["world_size"])


# ------------------------------------------------------------------------------ save


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
    from ddtk.checkpoint.retention import check_policy

    check_policy(keep_last, keep_every)
    meta = dict(state.meta, step=step, epoch=epoch, extra=dict(extra or {}))
    try:
        json.dumps(meta)
    except TypeError as exc:
        raise TypeError(f"state.meta and extra must be JSON-serialisable: {exc}") from None
    path = step_dir(directory, step)
    error = _share(ctx, _prepare_dir(path) if ctx.rank == 0 else None, _TAG_READY)
    if error is not None:
        raise CheckpointError(error)
    report = dict(_write_shard(ctx, path, state), layout=_layout(state))
    outcome = None
    if ctx.rank == 0:
        reports = [report] + [
            ctx.recv(r, tag=_TAG_REPORT).payload for r in range(1, ctx.world_size)
        ]
        layouts = [r.pop("layout") for r in reports]
        info = {"step": step, "epoch": epoch, "world_size": ctx.world_size, "meta": meta}
        outcome = _commit(path, reports, layouts, info)
        if outcome is None:
            _retain(directory, keep_last, keep_every)
    else:
        ctx.send(report, 0, tag=_TAG_REPORT)
    outcome = _share(ctx, outcome, _TAG_OUTCOME)
    if outcome is not None:
        raise ShardWriteError(outcome)
    ctx.barrier()
    return path


def _retain(directory: Any, keep_last: int | None, keep_every: int | None) -> None:
    """Apply the retention policy; a failure there must not fail the committed save."""
    if keep_last is None and keep_every is None:
        return
    from ddtk.checkpoint.retention import apply_retention

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


# ------------------------------------------------------------------------------ load


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
            ctx.send(problems, r, tag=_TAG_VERIFY)
        for r in others:
            problems = problems + ctx.recv(r, tag=_TAG_VERIFY).payload
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
    replicated = _clone(shard(0)["replicated"])
    per_rank = _clone(per_rank)
    files.clear()
    meta = dict(manifest["extra"].get("meta", {}))
    return ShardedCheckpoint(path, manifest, flat, replicated, per_rank, meta, notes)


def _clone(obj: Any) -> Any:
    """Copies of the tensors in nested dicts/lists/tuples, so no memory map stays open."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_clone(v) for v in obj)
    return obj


def _restore_rng(ckpt: ShardedCheckpoint, rng: bool) -> None:
    if not rng:
        return
    if ckpt.per_rank is None:
        return  # the note in ckpt.notes says why
    if "rng" not in ckpt.per_rank:
        raise CheckpointMismatchError("the checkpoint holds no RNG state (pass rng=False)")
    restore_rng(ckpt.per_rank["rng"])


# ------------------------------------------------------------------------------ ZeRO


def zero_state(
    opt: Any,
    *,
    rng: bool = True,
    replicated: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> ShardedState:
    """This rank's share of a :class:`~ddtk.parallel.zero.ZeroOptimizer`'s training state.

    Flat entries ``"params"`` (the unpadded flat parameters) and
    ``"optim.<key>"`` (each optimizer state tensor of the shard's size, e.g.
    Adam's ``exp_avg``); scalar state (Adam's ``step``) and the hyperparameters
    are replicated; the RNG states are per rank. Each rank saves the elements
    :func:`shard_range` gives it, which for stages 1 and 2 is the shard it owns.
    """
    ctx = opt.ctx
    lo, hi = shard_range(opt.numel, ctx.world_size, ctx.rank)
    own_lo = opt.shard_range[0]  # where the optimizer's state tensors start in the flat buffer
    flat = {"params": ShardedTensor(opt.flat[lo:hi].detach().clone(), lo, opt.numel)}
    scalars = {}
    sd = opt.optimizer.state_dict()
    for key, value in sd["state"].get(0, {}).items():
        if isinstance(value, torch.Tensor) and value.dim() == 1 and len(value) == opt.shard_numel:
            piece = value[lo - own_lo : hi - own_lo].detach().clone()
            flat[f"optim.{key}"] = ShardedTensor(piece, lo, opt.numel)
        else:
            scalars[key] = _clone(value)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    shapes = [list(p.shape) for p in opt.params]
    rep = {"optim_scalars": scalars, "optim_groups": groups, **dict(replicated or {})}
    return ShardedState(
        flat=flat,
        replicated=rep,
        per_rank={"rng": capture_rng()} if rng else {},
        meta={"zero": {"stage": opt.stage, "shapes": shapes}, **dict(meta or {})},
    )


def load_zero(
    ctx: Any, source: str | os.PathLike[str], opt: Any, *, rng: bool = True
) -> ShardedCheckpoint:
    """Load :func:`zero_state`'s checkpoint into ``opt`` (any world size and stage).

    Every rank reads the full parameters and the optimizer state of its own
    shard. :class:`~ddtk.checkpoint.state.CheckpointMismatchError` names the
    parameters whose shapes differ.
    """
    lo, hi = opt.shard_range
    lo, hi = min(lo, opt.numel), min(hi, opt.numel)

    def ranges(name: str, numel: int) -> Any:
        return "full" if name == "params" else (min(lo, numel), min(hi, numel))

    ckpt = load_sharded(ctx, source, ranges=ranges)
    if "zero" not in ckpt.meta:
        raise CheckpointMismatchError(
            f"{ckpt.path} was not saved from a ZeroOptimizer (zero_state)"
        )
    saved = ckpt.meta["zero"]["shapes"]
    own = [list(p.shape) for p in opt.params]
    if saved != own:
        diff = [
            f"parameter {i}: checkpoint {_shape(a)} vs model {_shape(b)}"
            for i, (a, b) in enumerate(_zip_longest(saved, own))
            if a != b
        ]
        raise CheckpointMismatchError(
            "the checkpoint does not fit the optimizer's parameters: " + "; ".join(diff)
        )
    with torch.no_grad():
        opt.flat[: opt.numel].copy_(ckpt.flat["params"].local)
    state = dict(ckpt.replicated["optim_scalars"])
    for name, piece in ckpt.flat.items():
        if name.startswith("optim."):
            padded = torch.zeros(opt.shard_numel, dtype=piece.local.dtype)
            padded[: hi - lo] = piece.local
            state[name.removeprefix("optim.")] = padded
    groups = [dict(g, params=[0]) for g in ckpt.replicated["optim_groups"]]
    opt.optimizer.load_state_dict({"state": {0: state} if state else {}, "param_groups": groups})
    _restore_rng(ckpt, rng)
    return ckpt


def _shape(shape: list[int] | None) -> str:
    return "absent" if shape is None else str(tuple(shape))


def _zip_longest(a: list[Any], b: list[Any]) -> list[tuple[Any, Any]]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else None, b[i] if i < len(b) else None) for i in range(n)]


# ------------------------------------------------------------------------------ plain DP


def dp_state(
    ctx: Any,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    sampler: ResumableSampler | None = None,
    *,
    rng: bool = True,
    meta: Mapping[str, Any] | None = None,
) -> ShardedState:
    """This rank's 1/N of a replicated (data-parallel) model and optimizer, for :func:`save_sharded`.

    Each tensor of the model's state dict becomes a flat entry ``"model.<key>"``
    and each optimizer state tensor shaped like its parameter ``"optim.<i>.<key>"``;
    rank ``r`` keeps only its :func:`shard_range` of each, so the N ranks write
    the model once between them. Scalar optimizer state, hyperparameters and the
    scheduler are replicated; the sampler position goes to ``meta``.
    """
    flat = {
        f"model.{k}": ShardedTensor.from_full(v, ctx.rank, ctx.world_size)
        for k, v in model.state_dict().items()
    }
    shapes = {f"model.{k}": list(v.shape) for k, v in model.state_dict().items()}
    rep: dict[str, Any] = {}
    if optimizer is not None:
        sd = optimizer.state_dict()
        scalars: dict[str, Any] = {}
        for i, st in sd["state"].items():
            for key, value in st.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    flat[f"optim.{i}.{key}"] = ShardedTensor.from_full(
                        value, ctx.rank, ctx.world_size
                    )
                    shapes[f"optim.{i}.{key}"] = list(value.shape)
                else:
                    scalars[f"{i}.{key}"] = _clone(value)
        rep["optim_scalars"] = scalars
        rep["optim_groups"] = _clone(sd["param_groups"])
    if scheduler is not None:
        rep["scheduler"] = _clone(scheduler.state_dict())
    extra_meta = {"dp": {"shapes": shapes}, **dict(meta or {})}
    if sampler is not None:
        extra_meta["sampler"] = sampler.state_dict()
    return ShardedState(flat, rep, {"rng": capture_rng()} if rng else {}, extra_meta)


def load_dp(
    ctx: Any,
    source: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    sampler: ResumableSampler | None = None,
    *,
    rng: bool = True,
) -> ShardedCheckpoint:
    """Reassemble :func:`dp_state`'s checkpoint on every rank and restore it (any world size).

    Shapes are checked before anything changes:
    :class:`~ddtk.checkpoint.state.CheckpointMismatchError` names the keys.
    """
    ckpt = load_sharded(ctx, source, ranges="full")
    shapes = ckpt.meta["dp"]["shapes"]
    full = {n: t.local.reshape(shapes[n]) for n, t in ckpt.flat.items()}
    model_sd = {n.removeprefix("model."): t for n, t in full.items() if n.startswith("model.")}
    check_model_compatible(model, model_sd)
    for name, obj in (("optim_groups", optimizer), ("scheduler", scheduler)):
        if obj is not None and name not in ckpt.replicated:
            raise CheckpointMismatchError(
                f"the checkpoint holds no {name.removesuffix('_groups')} state"
            )
    model.load_state_dict(model_sd)
    if optimizer is not None:
        state: dict[int, dict[str, Any]] = {}
        for name, t in full.items():
            if name.startswith("optim."):
                i, key = name.removeprefix("optim.").split(".", 1)
                state.setdefault(int(i), {})[key] = t
        for ik, value in ckpt.replicated["optim_scalars"].items():
            i, key = ik.split(".", 1)
            state.setdefault(int(i), {})[key] = value
        optimizer.load_state_dict({"state": state, "param_groups": ckpt.replicated["optim_groups"]})
    if scheduler is not None:
        scheduler.load_state_dict(ckpt.replicated["scheduler"])
    if sampler is not None:
        sampler.load_state_dict(ckpt.meta["sampler"])
    _restore_rng(ckpt, rng)
    return ckpt
