"""Top-k sparsification: send only the k entries of largest magnitude.

Algorithm: flatten the tensor, pick the k indices with the largest ``|x_i|``
(``torch.topk``), send those values and their indices; the receiver scatters
them into zeros. Biased (small entries are always dropped), so it is normally
used with error feedback, which keeps what was dropped and sends it later
(Aji & Heafield 2017, "Sparse Communication for Distributed Gradient Descent";
Lin et al. 2018, "Deep Gradient Compression"; Stich et al. 2018, "Sparsified
SGD with Memory").

Bytes on the wire for n elements of ``element_size`` bytes (4 for float32)::

    k * element_size + k * 4          # values + int32 indices (int64, 8 bytes, past 2**31 - 1)

with ``k = min(k, n)``, or ``k = min(n, max(1, ceil(ratio * n)))`` when a ratio is
given. Float32 at ratio 1 % costs 8 bytes per kept entry: a 50x smaller message.
Each rank keeps different indices, so payloads are all-gathered, not summed.
"""

from __future__ import annotations

import torch

from ddtk.compression.base import KSparsifier, Payload, index_dtype

__all__ = ["TopK"]


class TopK(KSparsifier):
    """Keep the ``k`` (or ``ceil(ratio * n)``) largest-magnitude entries, zero elsewhere.

    >>> import ddtk, torch
    >>> from ddtk.compression import TopK
    >>> def work(ctx):
    ...     g = torch.arange(5.0) + ctx.rank
    ...     return TopK(ratio=0.4).aggregate(ctx, g)     # both ranks keep indices 3 and 4
    >>> ddtk.launch(work, world_size=2)[0]
    tensor([0.0000, 0.0000, 0.0000, 3.5000, 4.5000])
    """

    prefix = "topk"

    def compress(self, tensor: torch.Tensor, key: int = 0) -> Payload:
        self._check(tensor)
        flat = tensor.detach().reshape(-1)
        k = self.k_for(flat.numel())
        idx = torch.topk(flat.abs(), k, sorted=False).indices
        tensors = {"values": flat[idx], "indices": idx.to(index_dtype(flat.numel()))}
        return Payload(tensors, tensor.shape, tensor.dtype)

    def decompress(self, payload: Payload) -> torch.Tensor:
        t = payload.tensors
        out = torch.zeros(payload.numel, dtype=payload.dtype, device=t["values"].device)
        out[t["indices"].long()] = t["values"]
        return out.reshape(payload.shape)
