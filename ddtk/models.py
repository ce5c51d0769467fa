"""Small models shared by the notebooks, tests and benchmarks.

They are sized for a laptop: a training step on digits takes milliseconds on
one core, so a 4-rank run finishes in seconds and still shows the real
behaviour (communication, stragglers, convergence).

>>> from ddtk.models import build_model
>>> model = build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=0)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = [
    "MLP",
    "MODELS",
    "LinearModel",
    "ResNetSmall",
    "ResidualBlock",
    "SmallCNN",
    "TinyTransformer",
    "TransformerBlock",
    "build_model",
    "count_parameters",
]


class MLP(nn.Sequential):
    """Flatten, then ``Linear -> ReLU`` per hidden layer, then a linear head."""

    def __init__(self, input_dim: int, hidden_dims: Sequence[int] = (64, 32), output_dim: int = 10):
        layers: list[nn.Module] = [nn.Flatten()]
        widths = [input_dim, *hidden_dims]
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], output_dim))
        super().__init__(*layers)


class SmallCNN(nn.Sequential):
    """Two 3x3 convolutions and two linear layers, for 1x8x8 digits (38,282 parameters at the defaults)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 16, side: int = 8):
        super().__init__(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * width * (side // 2) ** 2, 64),
            nn.ReLU(),
            nn.Linear(64, num_classes),
        )


class LinearModel(nn.Sequential):
    """Flatten and one linear layer: logistic or linear regression, with a convex loss."""

    def __init__(self, input_dim: int, output_dim: int):
        super().__init__(nn.Flatten(), nn.Linear(input_dim, output_dim))


class ResidualBlock(nn.Module):
    """Two 3x3 conv + BatchNorm layers and a shortcut: ``relu(f(x) + shortcut(x))`` (He et al., 2016).

    The shortcut is the identity, or a strided 1x1 convolution with BatchNorm when
    the block changes the width or the resolution.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNetSmall(nn.Sequential):
    """A ResNet-style CNN for small images: a conv stem, two residual stages, global pooling.

    At the defaults (1x8x8 digits, ``width=16``) it has 19,706 parameters and
    BatchNorm buffers, which data-parallel frameworks must broadcast or sync.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 16):
        super().__init__(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            ResidualBlock(width, width),
            ResidualBlock(width, 2 * width, stride=2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(2 * width, num_classes),
        )


MODELS = ("mlp", "cnn", "linear", "resnet")


def build_model(
    name: str,
    input_shape: Sequence[int] = (1, 8, 8),
    num_classes: int = 10,
    seed: int | None = 0,
    hidden_dims: Sequence[int] = (64, 32),
) -> nn.Module:
    """Build a model by name with seeded initial weights (the same on every rank for the same seed).

    ``name`` is ``"mlp"``, ``"cnn"`` (needs a ``(C, H, W)`` input shape),
    ``"resnet"`` (:class:`ResNetSmall`, any ``(C, H, W)`` with H, W >= 2) or ``"linear"``. ``num_classes`` is the output width (1 for regression).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    if seed is not None:
        torch.manual_seed(seed)
    input_dim = math.prod(input_shape)
    if name == "mlp":
        return MLP(input_dim, hidden_dims, num_classes)
    if name == "linear":
        return LinearModel(input_dim, num_classes)
    if name == "resnet":
        if len(input_shape) != 3 or min(input_shape[1:]) < 2:
            raise ValueError(
                f"the resnet needs a (channels, height, width) input shape with sides >= 2, got {tuple(input_shape)}"
            )
        return ResNetSmall(input_shape[0], num_classes)
    if len(input_shape) != 3 or input_shape[1] != input_shape[2] or input_shape[1] < 2:
        raise ValueError(
            "the cnn needs a square (channels, side, side) input shape with side >= 2, "
            f"got {tuple(input_shape)}"
        )
    return SmallCNN(input_shape[0], num_classes, side=input_shape[1])


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class TransformerBlock(nn.Module):
    """A pre-LayerNorm GPT block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``.

    Attention is written out (``softmax(q k^T / sqrt(d) + causal) v``) rather than
    calling a fused kernel, so the tensors it keeps for backward are the ones the
    activation-memory formula of Korthikanti et al. (2022) counts; see
    :mod:`ddtk.memory.calculator`.
    """

    def __init__(self, hidden: int, heads: int, ffn_mult: int = 4):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn_mult * hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn_mult * hidden, hidden)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Causal multi-head self-attention of a ``(batch, seq, hidden)`` tensor."""
        b, s, h = x.shape
        d = h // self.heads
        # contiguous copies: backward then keeps q, k and v (3 sbh), whatever the batch size,
        # rather than sometimes a view of the whole QKV output
        q, k, v = (
            t.contiguous() for t in self.qkv(x).view(b, s, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        )
        scores = (q * d**-0.5) @ k.transpose(-2, -1)
        causal = torch.full((s, s), float("-inf"), dtype=scores.dtype, device=x.device).triu(1)
        probs = (scores + causal).softmax(-1)
        out = (probs @ v).transpose(1, 2).reshape(b, s, h)
        return self.proj(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    """A GPT-like language model: token and learned position embeddings, pre-LN blocks, LM head.

    ``forward(tokens)`` maps ``(batch, seq)`` token ids to ``(batch, seq, vocab)`` logits.
    The head is not tied to the embedding, so the parameter count is
    ``2*vocab*hidden + seq_len*hidden + 2*hidden + layers*((4 + 2*ffn_mult)*hidden**2 + (9 + ffn_mult)*hidden)``.

    >>> model = TinyTransformer(vocab=64, seq_len=16, hidden=32, heads=4, layers=2)
    >>> count_parameters(model)
    30080
    >>> model(torch.zeros(3, 16, dtype=torch.long)).shape
    torch.Size([3, 16, 64])
    """

    def __init__(
        self, vocab: int, seq_len: int, hidden: int, heads: int, layers: int, ffn_mult: int = 4
    ):
        super().__init__()
        for name, value in (("vocab", vocab), ("seq_len", seq_len), ("hidden", hidden),
                            ("heads", heads), ("layers", layers), ("ffn_mult", ffn_mult)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(vocab, hidden)
        self.pos_emb = nn.Parameter(torch.randn(seq_len, hidden) * 0.02)
        self.blocks = nn.ModuleList(
            TransformerBlock(hidden, heads, ffn_mult) for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[-1]
        if s > self.seq_len:
            raise ValueError(f"sequence of {s} tokens is longer than seq_len={self.seq_len}")
        x = self.tok_emb(tokens) + self.pos_emb[:s]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
