"""Activation checkpointing: keep fewer activations, recompute them in backward.

A transformer's blocks save most of the memory of a training step for backward
(see :mod:`ddtk.memory.calculator`). With checkpointing, the blocks are cut into
segments of ``every`` consecutive blocks; a segment runs under
``torch.utils.checkpoint.checkpoint`` (``use_reentrant=False``), which keeps
only the segment's input in forward and runs the segment's forward again during
backward to rebuild what it needs. Memory falls from ``L`` blocks' activations
to ``L / every`` segment inputs plus one segment's activations while it is
recomputed; the price is one extra forward of the checkpointed blocks (about a
third more compute for a step whose backward costs twice its forward).

:func:`sweep` measures both sides on CPU for several ``every``: the bytes a
forward leaves alive for backward (:func:`ddtk.memory.measure.retained_bytes`),
the peak of forward + backward (:func:`ddtk.memory.measure.peak_memory_bytes`),
and the median step time, each as a ratio to no checkpointing.

>>> import torch
>>> from ddtk.models import TinyTransformer
>>> from ddtk.memory.activation_checkpointing import CheckpointedTransformer
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> model = TinyTransformer(vocab=32, seq_len=8, hidden=16, heads=2, layers=4)
>>> tokens = torch.randint(0, 32, (2, 8))
>>> plain = model(tokens)
>>> ckpt = CheckpointedTransformer(model, every=2)(tokens)   # same weights, same outputs
>>> torch.equal(plain, ckpt)
True
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from ddtk.memory.measure import peak_memory_bytes, retained_bytes, timed
from ddtk.models import TinyTransformer

__all__ = ["CheckpointedTransformer", "checkpoint_blocks", "sweep"]


def checkpoint_blocks(blocks: Sequence[nn.Module], x: torch.Tensor, every: int) -> torch.Tensor:
    """Run ``x`` through ``blocks`` in order, checkpointing each segment of ``every`` blocks.

    ``every=0`` runs them plainly (every activation kept).
    """
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValueError(f"every must be an integer >= 0, got {every!r}")
    if every == 0:
        for block in blocks:
            x = block(x)
        return x
    for start in range(0, len(blocks), every):
        segment = blocks[start : start + every]
        x = checkpoint(_run_segment, segment, x, use_reentrant=False)
    return x


def _run_segment(segment: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for block in segment:
        x = block(x)
    return x


class CheckpointedTransformer(nn.Module):
    """A :class:`~ddtk.models.TinyTransformer` (its very modules, not a copy) whose blocks are checkpointed.

    ``every`` blocks make one checkpointed segment; ``every=0`` turns checkpointing off.
    """

    def __init__(self, model: TinyTransformer, every: int = 1):
        super().__init__()
        if not isinstance(model, TinyTransformer):
            raise TypeError(f"expected a TinyTransformer, got {type(model).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"every must be an integer >= 0, got {every!r}")
        self.model, self.every = model, every

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = m.tok_emb(tokens) + m.pos_emb[: tokens.shape[-1]]
        x = checkpoint_blocks(list(m.blocks), x, self.every)
        return m.head(m.ln_f(x))


def _loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def sweep(
    everies: Sequence[int] = (0, 1, 2, 4),
    layers: int = 8,
    hidden: int = 64,
    heads: int = 4,
    seq_len: int = 64,
    batch: int = 8,
    vocab: int = 128,
    repeats: int = 5,
    seed: int = 0,
) -> list[dict]:
    """Measure a TinyTransformer step for each checkpoint segment length in ``everies`` (0 = none).

    Each row: ``every``, ``retained_bytes`` (alive after forward, for backward),
    ``peak_bytes`` (forward + backward), ``step_s`` (median forward + backward),
    and the ratios of the three to the ``every=0`` row (when it is in the sweep).
    """
    if not everies or any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in everies):
        raise ValueError(f"everies must be integers >= 0, got {list(everies)!r}")
    torch.manual_seed(seed)
    model = TinyTransformer(vocab, seq_len, hidden, heads, layers)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq_len), generator=g)
    targets = torch.randint(0, vocab, (batch, seq_len), generator=g)
    rows = []
    for every in everies:
        wrapped = CheckpointedTransformer(model, every)

        def step(wrapped: nn.Module = wrapped) -> None:
            model.zero_grad(set_to_none=True)
            _loss(wrapped, tokens, targets).backward()

        step()  # warm-up
        model.zero_grad(set_to_none=True)
        loss, kept = retained_bytes(lambda wrapped=wrapped: _loss(wrapped, tokens, targets))
        del loss
        peak = peak_memory_bytes(step)
        rows.append({"every": every, "layers": layers, "retained_bytes": kept,
                     "peak_bytes": peak, "step_s": timed(step, repeats=repeats)})  # fmt: skip
    base = next((r for r in rows if r["every"] == 0), None)
    for r in rows:
        for key in ("retained_bytes", "peak_bytes", "step_s"):
            r[f"{key}_ratio"] = r[key] / base[key] if base else None
    return rows
