"""Error feedback: remember what compression dropped and send it later.

Algorithm (Seide et al. 2014, "1-Bit Stochastic Gradient Descent and its
Application to Data-Parallel Distributed Training of Speech DNNs"; Karimireddy
et al. 2019, "Error Feedback Fixes SignSGD and other Gradient Compression
Schemes", EF-SGD). Each rank keeps a residual e per bucket, starting at 0::

    corrected = g + e
    send compress(corrected)
    e = corrected - decompress(what this rank sent)

Summed over steps the residuals telescope: everything transmitted equals the sum
of the gradients minus the final residual, so nothing is lost, only delayed. This
is what lets biased compressors (top-k, sign, PowerSGD) reach the accuracy of
dense SGD.

Bytes on the wire: exactly those of the wrapped compressor (the residual stays local).
"""

from __future__ import annotations

from typing import Any

import torch

from ddtk.compression.base import Compressor, Exchanged, Payload

__all__ = ["ErrorFeedback"]


class ErrorFeedback(Compressor):
    """Wrap any compressor with a per-bucket residual (EF-SGD).

    >>> import ddtk, torch
    >>> from ddtk.compression import ErrorFeedback, TopK
    >>> def work(ctx):
    ...     ef = ErrorFeedback(TopK(k=1))
    ...     g = torch.tensor([3.0, 2.0])
    ...     return [ef.aggregate(ctx, g) for _ in range(2)]   # the dropped 2.0 goes out next step
    >>> ddtk.launch(work, world_size=2)[0]
    [tensor([3., 0.]), tensor([0., 4.])]
    """

    def __init__(self, inner: Compressor):
        if not isinstance(inner, Compressor):
            raise TypeError(f"ErrorFeedback wraps a Compressor, got {type(inner).__name__}")
        if isinstance(inner, ErrorFeedback):
            raise ValueError("ErrorFeedback is already applied; do not wrap it twice")
        super().__init__(inner.seed)
        self.inner = inner
        self.name = f"ef+{inner.name}"
        self.residuals: dict[int, torch.Tensor] = {}

    def residual(self, key: int = 0) -> torch.Tensor | None:
        """What bucket ``key`` has not transmitted yet (None before its first step)."""
        return self.residuals.get(key)

    def _corrected(self, tensor: torch.Tensor, key: int) -> torch.Tensor:
        self._check(tensor)
        e = self.residuals.get(key)
        if e is not None and e.shape != tensor.shape:
            raise ValueError(
                f"bucket {key} changed shape from {tuple(e.shape)} to {tuple(tensor.shape)}; "
                "error feedback keeps one residual per bucket key"
            )
        return tensor.detach().clone() if e is None else tensor.detach() + e

    def compress(self, tensor: torch.Tensor, key: int = 0) -> Payload:
        corrected = self._corrected(tensor, key)
        self.inner.rank = self.rank
        payload = self.inner.compress(corrected, key)
        self.residuals[key] = corrected - self.inner.decompress(payload)
        return payload

    def decompress(self, payload: Payload) -> torch.Tensor:
        return self.inner.decompress(payload)

    def exchange(self, ctx: Any, tensor: torch.Tensor, key: int = 0) -> Exchanged:
        corrected = self._corrected(tensor, key)
        self.inner.rank = ctx.rank
        mean, own, nbytes = self.inner.exchange(ctx, corrected, key)
        self.residuals[key] = corrected - own
        return Exchanged(mean, own, nbytes)
