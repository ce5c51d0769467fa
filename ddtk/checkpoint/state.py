"""Training state for a bitwise-identical resume: capture it, restore it, and no more.

A resumed run repeats the uninterrupted one exactly when it gets back the
model and optimizer state (momentum buffers included), the LR scheduler, the
step and epoch counters, every random number generator that training draws
from (Python, NumPy, torch CPU, and CUDA when present: dropout and
augmentation), and the data order with the position inside the epoch
(:class:`ResumableSampler`). :func:`capture` puts the tensors and plain
numbers into :attr:`CheckpointState.tensors` (saved as a ``.pt`` that loads
with ``torch.load(weights_only=True)``) and the JSON-friendly rest into
:attr:`CheckpointState.meta`; :func:`restore` puts everything back.

>>> import torch
>>> from ddtk.checkpoint.state import ResumableSampler, capture, restore
>>> s = ResumableSampler(5, seed=0)
>>> s.next_batch(2).tolist()
[4, 0]
>>> model = torch.nn.Linear(2, 1)
>>> st = capture(model, sampler=s, step=1, epoch=0)
>>> rest = s.next_batch(3).tolist()
>>> fresh = ResumableSampler(5, seed=0)
>>> meta = restore(st, torch.nn.Linear(2, 1), sampler=fresh)
>>> fresh.next_batch(3).tolist() == rest, meta["step"]
(True, 1)
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ddtk.checkpoint.atomic import CheckpointError

__all__ = [
    "CheckpointMismatchError",
    "CheckpointState",
    "ResumableSampler",
    "capture",
    "capture_rng",
    "check_model_compatible",
    "restore",
    "restore_rng",
]


class CheckpointMismatchError(CheckpointError, ValueError):
    """A checkpoint does not fit the model or optimizer it is loaded into."""


class ResumableSampler:
    """Indices ``0..n-1`` in a per-epoch order that can be saved and resumed mid-epoch.

    The order of epoch ``e`` is a permutation drawn from its own generator seeded
    with ``(seed, e)``, so it does not touch (or depend on) the global RNGs and
    can be recomputed after a restart. ``state_dict()`` records the epoch and
    the position inside it. :meth:`next_batch` is the exact way to consume it;
    iterating (``for i in sampler``, or as a ``DataLoader`` sampler) advances the
    position as indices are handed out, which with a prefetching loader is ahead
    of what training has used.

    >>> s = ResumableSampler(4, seed=1, shuffle=False)
    >>> s.next_batch(3).tolist(), s.next_batch(3).tolist(), s.next_batch(3).tolist()
    ([0, 1, 2], [3], [0, 1, 2])
    >>> s.state_dict()
    {'n': 4, 'seed': 1, 'shuffle': False, 'epoch': 1, 'position': 3}
    """

    def __init__(self, n: int, seed: int = 0, shuffle: bool = True):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.n, self.seed, self.shuffle = n, seed, bool(shuffle)
        self.epoch = 0
        self.position = 0
        self._order: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.n

    def order(self, epoch: int | None = None) -> torch.Tensor:
        """The index order of ``epoch`` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        if not self.shuffle:
            return torch.arange(self.n)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=gen)

    def _current(self) -> torch.Tensor:
        if self._order is None:
            self._order = self.order()
        return self._order

    def _advance_epoch_if_done(self) -> None:
        if self.position >= self.n:
            self.epoch += 1
            self.position = 0
            self._order = None

    def next_batch(self, batch_size: int) -> torch.Tensor:
        """Up to ``batch_size`` next indices; the last batch of an epoch may be shorter."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self._advance_epoch_if_done()
        batch = self._current()[self.position : self.position + batch_size]
        self.position += len(batch)
        return batch.clone()

    def __iter__(self) -> Iterator[int]:
        """The rest of the current epoch (all of it at a fresh epoch), advancing the position."""
        self._advance_epoch_if_done()
        order = self._current()
        while self.position < self.n:
            self.position += 1
            yield int(order[self.position - 1])

    def state_dict(self) -> dict[str, Any]:
        """The position to resume from (JSON-friendly)."""
        return {
            "n": self.n,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self.epoch,
            "position": self.position,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the data size, seed and shuffle flag must match."""
        for key in ("n", "seed", "shuffle"):
            if state.get(key) != getattr(self, key):
                raise CheckpointMismatchError(
                    f"sampler {key} differs: checkpoint has {state.get(key)!r}, "
                    f"this sampler has {getattr(self, key)!r}"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.n:
            raise CheckpointMismatchError(f"sampler state out of range: {dict(state)!r}")
        self.epoch, self.position, self._order = epoch, position, None


def capture_rng() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's (CPU and CUDA) global generators, as tensors."""
    version, py_state, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    rng: dict[str, Any] = {
        "python": {
            "version": version,
            "state": torch.tensor(py_state, dtype=torch.int64),
            "gauss": gauss,
        },
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: Mapping[str, Any]) -> None:
    """Set the global generators back to :func:`capture_rng`'s states."""
    py = rng["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    npr = rng["numpy"]
    keys = npr["keys"].numpy().astype(np.uint32)
    np.random.set_state((npr["name"], keys, npr["pos"], npr["has_gauss"], npr["gauss"]))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


@dataclass
class CheckpointState:
    """What a checkpoint holds: ``tensors`` (weights-only loadable) and ``meta`` (JSON)."""

    tensors: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def step(self) -> int:
        """The training step the state was captured at."""
        return int(self.meta["step"])

    @property
    def epoch(self) -> int | None:
        """The epoch counter the state was captured at."""
        return self.meta.get("epoch")


def capture(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    sampler: ResumableSampler | None = None,
    *,
    step: int,
    epoch: int | None = None,
    rng: bool = True,
    extra: Mapping[str, Any] | None = None,
    copy: bool = True,
) -> CheckpointState:
    """Snapshot the training state (copies, so training may go on while it is written).

    ``extra`` is small JSON-serialisable user metadata stored in ``meta``.
    ``copy=False`` keeps references to the live tensors instead: right for a
    synchronous :func:`~ddtk.checkpoint.store.save` that finishes before the next
    optimizer step, and one copy of the whole state cheaper; wrong for anything
    written in the background while training goes on.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    keep = _clone if copy else _detach
    tensors: dict[str, Any] = {"model": keep(dict(model.state_dict()))}
    if optimizer is not None:
        tensors["optimizer"] = keep(optimizer.state_dict())
    if scheduler is not None:
        tensors["scheduler"] = keep(scheduler.state_dict())
    if rng:
        tensors["rng"] = capture_rng()
    meta: dict[str, Any] = {"step": step, "epoch": epoch, "extra": dict(extra or {})}
    if sampler is not None:
        meta["sampler"] = sampler.state_dict()
    return CheckpointState(tensors, meta)


def _clone(obj: Any, copy: bool = True) -> Any:
    """Deep copy of nested dicts/lists with tensors cloned (state dicts share storage with training).

    With ``copy=False`` the containers are new but the tensors are the live ones, detached.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone() if copy else obj.detach()
    if isinstance(obj, dict):
        return {k: _clone(v, copy) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_clone(v, copy) for v in obj)
    return obj


def _detach(obj: Any) -> Any:
    """:func:`_clone` without copying tensors."""
    return _clone(obj, copy=False)


def check_model_compatible(model: nn.Module, saved: Mapping[str, torch.Tensor]) -> None:
    """Raise :class:`CheckpointMismatchError` naming missing/unexpected keys and shape mismatches."""
    own = model.state_dict()
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(saved[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in saved and tuple(saved[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append("keys missing from the checkpoint: " + ", ".join(missing))
        if unexpected:
            parts.append("keys in the checkpoint but not in the model: " + ", ".join(unexpected))
        if shapes:
            parts.append("shape mismatches: " + "; ".join(shapes))
        raise CheckpointMismatchError(
            f"the checkpoint does not fit {type(model).__name__}: " + "; ".join(parts)
        )


def restore(
    state: CheckpointState,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    sampler: ResumableSampler | None = None,
    *,
    rng: bool = True,
) -> dict[str, Any]:
    """Put ``state`` back into the given objects; returns ``state.meta``.

    Everything is checked before anything is changed, so a mismatch leaves the
    model untouched. The RNGs are restored last, after any construction work.
    """
    t = state.tensors
    for name, obj in (("optimizer", optimizer), ("scheduler", scheduler)):
        if obj is not None and name not in t:
            raise CheckpointMismatchError(f"the checkpoint holds no {name} state")
    if sampler is not None and "sampler" not in state.meta:
        raise CheckpointMismatchError("the checkpoint holds no sampler state")
    if rng and "rng" not in t:
        raise CheckpointMismatchError("the checkpoint holds no RNG state (pass rng=False)")
    if model is not None:
        check_model_compatible(model, t["model"])
    if optimizer is not None:
        _check_optimizer(optimizer, t["optimizer"])
    if model is not None:
        model.load_state_dict(t["model"])
    if optimizer is not None:
        optimizer.load_state_dict(t["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(t["scheduler"])
    if sampler is not None:
        sampler.load_state_dict(state.meta["sampler"])
    if rng:
        restore_rng(t["rng"])
    return state.meta


def _check_optimizer(optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]) -> None:
    """The saved optimizer must have the same parameter groups with the same sizes."""
    own = [len(g["params"]) for g in optimizer.param_groups]
    theirs = [len(g["params"]) for g in saved.get("param_groups", [])]
    if own != theirs:
        raise CheckpointMismatchError(
            f"optimizer parameter groups differ: checkpoint has group sizes {theirs}, "
            f"the optimizer has {own}"
        )
    params = [p for g in optimizer.param_groups for p in g["params"]]
    ids = [i for g in saved["param_groups"] for i in g["params"]]
    for p, i in zip(params, ids):
        for key, value in saved.get("state", {}).get(i, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != p.shape:
                raise CheckpointMismatchError(
                    f"optimizer state {key!r} of parameter {i}: checkpoint {tuple(value.shape)} "
                    f"vs parameter {tuple(p.shape)}"
                )
