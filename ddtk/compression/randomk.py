"""Random-k sparsification: send k entries chosen uniformly at random, scaled by n/k.

Algorithm: draw k distinct indices uniformly from the n positions, send those
values; the receiver scatters ``values * n / k`` into zeros. Each entry is kept
with probability k/n, so the rescaled estimate is unbiased:
``E[x_hat_i] = (k/n) * (n/k) * x_i = x_i`` (Stich et al. 2018, "Sparsified SGD
with Memory"; Wangni et al. 2018, "Gradient Sparsification for
Communication-Efficient Distributed Optimization").

The indices come from a generator seeded with ``(seed, key, call number)`` and
not the rank, so every rank picks the same indices and they never travel.

Bytes on the wire for n elements of ``element_size`` bytes::

    k * element_size                  # the values only; k = min(k, n) or min(n, max(1, ceil(ratio * n)))

Because all ranks share the indices, the payload is a dense k-vector that can be
summed coordinate by coordinate: :meth:`RandomK.exchange` uses ``ctx.all_reduce``.
"""

from __future__ import annotations

from typing import Any

import torch

from ddtk.compression.base import Exchanged, KSparsifier, Payload

__all__ = ["RandomK"]


class RandomK(KSparsifier):
    """Keep ``k`` (or ``ceil(ratio * n)``) random entries, the same on every rank; unbiased.

    >>> import ddtk, torch
    >>> from ddtk.compression import RandomK
    >>> def work(ctx):
    ...     c = RandomK(ratio=0.5, seed=1)
    ...     return c.aggregate(ctx, torch.ones(4) * (ctx.rank + 1)), c.last_bytes
    >>> out, nbytes = ddtk.launch(work, world_size=2)[0]   # two entries of 3.0 (1.5 * 4/2), 8 bytes
    """

    prefix = "randomk"

    def compress(self, tensor: torch.Tensor, key: int = 0) -> Payload:
        self._check(tensor)
        flat = tensor.detach().reshape(-1)
        n = flat.numel()
        gen = self._generator(key, "randomk", per_rank=False)
        idx = torch.randperm(n, generator=gen)[: self.k_for(n)].to(flat.device)
        return Payload({"values": flat[idx]}, tensor.shape, tensor.dtype, {"indices": idx})

    def decompress(self, payload: Payload) -> torch.Tensor:
        return self._scatter(payload.tensors["values"], payload)

    def exchange(self, ctx: Any, tensor: torch.Tensor, key: int = 0) -> Exchanged:
        payload = self.compress(tensor, key)
        summed = ctx.all_reduce(payload.tensors["values"], op="sum")
        mean = self._scatter(summed / ctx.world_size, payload)
        return Exchanged(mean, self.decompress(payload), payload.nbytes)

    @staticmethod
    def _scatter(values: torch.Tensor, payload: Payload) -> torch.Tensor:
        """Zeros with ``values * n / k`` at the shared indices."""
        n, k = payload.numel, values.numel()
        out = torch.zeros(n, dtype=payload.dtype, device=values.device)
        if k:
            out[payload.shared["indices"]] = values * (n / k)
        return out.reshape(payload.shape)
