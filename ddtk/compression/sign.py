"""signSGD with a scale (1-bit compression): one bit per element plus one number.

Algorithm: send the sign of every entry, packed 8 to a byte, and one scale
``mean(|x|) = ||x||_1 / n``; the receiver rebuilds ``scale * sign(x)``. The
scale keeps the magnitude of the update (Bernstein et al. 2018, "signSGD:
Compressed Optimisation for Non-Convex Problems"; Seide et al. 2014, "1-Bit
Stochastic Gradient Descent"; Karimireddy et al. 2019, "Error Feedback Fixes
SignSGD", whose scaled sign compressor this is). Biased: use it with error
feedback.

One bit cannot say "zero": entries equal to 0 are sent as "+" (bit 1) and
rebuilt as ``+scale``. A tensor of zeros has scale 0, so it still rebuilds to zeros.

Bytes on the wire for n elements (``element_size`` = 4 for float32)::

    ceil(n / 8) + element_size       # packed sign bits (uint8) + scale

Bit i of the packed stream is byte ``i // 8``, bit ``7 - i % 8`` (most significant first,
like ``numpy.packbits``). Each rank has its own scale, so payloads are all-gathered.
"""

from __future__ import annotations

import torch

from ddtk.compression.base import Compressor, Payload

__all__ = ["SignSGD", "pack_bits", "unpack_bits"]

_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Pack a 1-D bool tensor into ``ceil(n / 8)`` uint8 bytes (most significant bit first)."""
    n = bits.numel()
    padded = torch.zeros(-(-n // 8) * 8, dtype=torch.uint8, device=bits.device)
    padded[:n] = bits.to(torch.uint8)
    return (padded.view(-1, 8) * _WEIGHTS.to(bits.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` bits of :func:`pack_bits`'s output, as a bool tensor."""
    bits = (packed.view(-1, 1) & _WEIGHTS.to(packed.device)) != 0
    return bits.reshape(-1)[:n]


class SignSGD(Compressor):
    """Scaled sign: ``mean(|x|) * sign(x)``, signs packed 8 per byte.

    >>> import ddtk, torch
    >>> from ddtk.compression import SignSGD
    >>> def work(ctx):
    ...     c = SignSGD()
    ...     return c.aggregate(ctx, torch.tensor([2.0, -1.0, 0.0])), c.last_bytes
    >>> ddtk.launch(work, world_size=2)[0]    # scale 1.0; 1 byte of signs + 4-byte scale
    (tensor([ 1., -1.,  1.]), 5)
    """

    name = "sign"

    def compress(self, tensor: torch.Tensor, key: int = 0) -> Payload:
        self._check(tensor)
        flat = tensor.detach().reshape(-1)
        scale = flat.abs().mean() if flat.numel() else flat.new_zeros(())
        tensors = {"scale": scale.reshape(1), "signs": pack_bits(flat >= 0)}
        return Payload(tensors, tensor.shape, tensor.dtype)

    def decompress(self, payload: Payload) -> torch.Tensor:
        t = payload.tensors
        positive = unpack_bits(t["signs"], payload.numel)
        out = torch.where(positive, t["scale"], -t["scale"]).to(payload.dtype)
        return out.reshape(payload.shape)
