"""QSGD: stochastic quantisation to s levels per sign (Alistarh et al. 2017).

Algorithm (Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient
SGD via Gradient Quantization and Encoding", NeurIPS 2017): with ``norm = ||x||_2``
and ``r_i = s * |x_i| / norm`` in [0, s], round ``r_i`` to ``l_i = floor(r_i) + 1``
with probability ``r_i - floor(r_i)`` and to ``floor(r_i)`` otherwise. Send the
norm and the integers ``sign(x_i) * l_i``; the receiver rebuilds
``norm * sign(x_i) * l_i / s``. Since ``E[l_i] = r_i`` the estimate is unbiased,
and every value lies on the grid ``norm * j / s`` for j in -s..s.

Bytes on the wire for n elements of ``element_size`` bytes::

    n * c + element_size             # codes + the norm; c = 1 (int8) for s <= 127, 2 (int16) up to 32767

The paper goes further and Elias-codes the integers (most are 0 for small s);
here they are sent at a fixed width, which keeps the byte count simple and exact.
Random draws differ per rank (seeded with seed, rank, bucket key and call number).
Each rank has its own norm, so payloads are all-gathered, not summed.
"""

from __future__ import annotations

import torch

from ddtk.compression.base import Compressor, Payload, positive_int

__all__ = ["QSGD"]


class QSGD(Compressor):
    """Unbiased stochastic quantisation of ``x / ||x||_2`` to ``s`` levels per sign.

    >>> import ddtk, torch
    >>> from ddtk.compression import QSGD
    >>> def work(ctx):
    ...     c = QSGD(s=4)
    ...     return c.aggregate(ctx, torch.tensor([3.0, -4.0])), c.last_bytes
    >>> ddtk.launch(work, world_size=2)[0]     # values on the grid 5 * j / 4; 2 codes + the norm
    (tensor([ 2.5000, -3.7500]), 6)
    """

    def __init__(self, s: int = 16, seed: int = 0):
        super().__init__(seed)
        self.s = positive_int(s, "s")
        if self.s > 32767:
            raise ValueError(f"s must be <= 32767 (levels are sent as int16), got {s}")
        self.code_dtype = torch.int8 if self.s <= 127 else torch.int16
        self.name = f"qsgd:{self.s}"

    def compress(self, tensor: torch.Tensor, key: int = 0) -> Payload:
        self._check(tensor)
        flat = tensor.detach().reshape(-1)
        gen = self._generator(key, "qsgd")
        norm = flat.norm() if flat.numel() else flat.new_zeros(())
        r = flat.abs() * (self.s / norm) if norm > 0 else torch.zeros_like(flat)
        low = r.floor()
        up = torch.rand(flat.shape, generator=gen, dtype=flat.dtype).to(flat.device) < (r - low)
        levels = (low + up).clamp_(max=self.s)  # floating rounding may nudge r past s
        codes = (levels * flat.sign()).to(self.code_dtype)
        return Payload({"norm": norm.reshape(1), "codes": codes}, tensor.shape, tensor.dtype)

    def decompress(self, payload: Payload) -> torch.Tensor:
        t = payload.tensors
        out = t["codes"].to(payload.dtype) * (t["norm"] / self.s)
        return out.reshape(payload.shape)
