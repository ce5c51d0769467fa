"""Single-process baseline: a byte-level GPT trained on the Python standard library's source.

This is where the final project starts. It trains, in one process, a small
GPT-style model (token and position embeddings, pre-norm causal self-attention
blocks, a byte head) on the ``.py`` files of the standard library of the Python
that runs it: real text, shipped with Python, no download. The file list is
sorted, so every run (and every rank) reads the same bytes.

The batch of step ``s`` is a pure function of ``(seed, s)``: a run that restarts
at step ``s`` sees exactly the batches an uninterrupted run would have seen.

It already writes the metrics file ``ddtk project check`` reads
(``<out>/metrics/rank-<RANK>.json``), but it does not distribute anything,
never checkpoints and cannot resume: that is the project.

    python train.py --steps 40 --out /tmp/run
    torchrun --standalone --nproc-per-node 2 train.py --steps 40 --out /tmp/run   # 2 independent copies
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sysconfig
import time
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/baseline"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train, then write ``<out>/metrics/rank-<RANK>.json``."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    cfg = GPTConfig()
    data = stdlib_bytes()
    model = TinyGPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for step in range(args.steps):
        x, y = batch(data, step, args.batch, cfg.block, args.seed)
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    seconds = time.perf_counter() - start
    rank = int(os.environ.get("RANK", "0"))
    metrics = {
        "rank": rank,
        "world_size": 1,
        "steps": args.steps,
        "start_step": 0,
        "final_step": args.steps,
        "committed_steps": [],
        "param_checksum": checksum(model),
        "throughput": args.steps * args.batch / seconds,
        "parameters": sum(p.numel() for p in model.parameters()),
        "loss": loss.item(),
    }
    path = args.out / "metrics" / f"rank-{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
