"""The model and the data of the project: a byte-level GPT on the standard library's source.

Taken unchanged from ``project/starter/train.py`` so that the distributed
program and the single-process baseline train the same model on the same bytes.
The batch of step ``s`` is a pure function of ``(seed, s)``; :func:`rank_batch`
gives each rank its contiguous slice of that global batch, so the global batch,
and hence the training, is the same at every world size.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    """Model size; the defaults train in seconds on a laptop CPU."""

    block: int = 32  # context length in bytes
    d_model: int = 32
    layers: int = 2
    heads: int = 2
    vocab: int = 256  # bytes


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Byte-level GPT: embeddings, ``layers`` blocks, a final norm and the byte head."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.block, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of predicting each next byte."""
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def stdlib_bytes(max_bytes: int = 1 << 20) -> torch.Tensor:
    """The first ``max_bytes`` of the standard library's top-level ``*.py`` files, sorted by name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if not chunks:
        raise SystemExit(f"no .py files in the standard library folder {root}")
    raw = b"".join(chunks)[:max_bytes]
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()


def batch(
    data: torch.Tensor, step: int, size: int, block: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` random windows of the text for ``step``: inputs and the next bytes."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - block - 1, (size,), generator=gen)
    rows = starts[:, None] + torch.arange(block + 1)
    windows = data[rows]
    return windows[:, :-1], windows[:, 1:]


def checksum(model: nn.Module) -> str:
    """sha256 of every parameter's bytes, in order: equal checksums mean equal models."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def rank_batch(
    data: torch.Tensor, step: int, global_size: int, block: int, seed: int, rank: int, world: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows ``[rank * b, (rank + 1) * b)`` of step ``step``'s global batch."""
    if global_size % world:
        raise SystemExit(f"--batch {global_size} is not divisible by the world size {world}")
    x, y = batch(data, step, global_size, block, seed)
    b = global_size // world
    return x[rank * b : (rank + 1) * b], y[rank * b : (rank + 1) * b]
