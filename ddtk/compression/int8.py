"""8-bit linear quantisation: one byte per element plus a per-tensor scale.

Two deterministic schemes (round to nearest, so the error is at most scale / 2):

* ``"absmax"`` (symmetric): ``scale = max|x| / 127``, ``q = round(x / scale)`` in
  [-127, 127] as int8; rebuild ``q * scale``. Zero is exact.
* ``"minmax"`` (asymmetric, scale and zero point): ``scale = (max - min) / 255``,
  ``q = round((x - min) / scale)`` in [0, 255] as uint8; rebuild ``min + q * scale``.
  The zero point is sent as the float ``min``; it uses all 256 codes when the
  values are not centred on zero.

As in Dettmers 2016 ("8-Bit Approximations for Parallelism in Deep Learning")
and the linear quantisation of Jacob et al. 2018. Rounding to nearest is biased
per element; QSGD (:mod:`ddtk.compression.qsgd`) is the unbiased alternative.

Bytes on the wire for n elements (``element_size`` = 4 for float32)::

    absmax:  n + element_size        # int8 codes + scale
    minmax:  n + 2 * element_size    # uint8 codes + scale + min

A tensor of zeros (or a constant) has scale 0: every code is 0 and the rebuild is exact.
Each rank has its own scale, so payloads are all-gathered, not summed.
"""

from __future__ import annotations

import torch

from ddtk.compression.base import Compressor, Payload

__all__ = ["Int8"]

MODES = ("absmax", "minmax")


class Int8(Compressor):
    """Round-to-nearest 8-bit quantisation with a per-tensor scale (``absmax`` or ``minmax``).

    >>> import ddtk, torch
    >>> from ddtk.compression import Int8
    >>> def work(ctx):
    ...     c = Int8("absmax")
    ...     return c.aggregate(ctx, torch.tensor([-1.27, 0.5, 1.27])), c.last_bytes
    >>> ddtk.launch(work, world_size=2)[0]    # scale 0.01: 0.5 is exact; 3 codes + 4-byte scale
    (tensor([-1.2700,  0.5000,  1.2700]), 7)
    """

    def __init__(self, mode: str = "absmax"):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"unknown int8 mode {mode!r}; choose one of {', '.join(MODES)}")
        self.mode = mode
        self.name = f"int8:{mode}"

    def compress(self, tensor: torch.Tensor, key: int = 0) -> Payload:
        self._check(tensor)
        flat = tensor.detach().reshape(-1)
        if self.mode == "absmax":
            amax = flat.abs().max() if flat.numel() else flat.new_zeros(())
            scale = amax / 127
            q = (flat / scale).round().clamp(-127, 127) if scale > 0 else torch.zeros_like(flat)
            tensors = {"scale": scale.reshape(1), "codes": q.to(torch.int8)}
        else:
            lo = flat.min() if flat.numel() else flat.new_zeros(())
            hi = flat.max() if flat.numel() else flat.new_zeros(())
            scale = (hi - lo) / 255
            q = ((flat - lo) / scale).round().clamp(0, 255) if scale > 0 else torch.zeros_like(flat)
            tensors = {"scale": scale.reshape(1), "min": lo.reshape(1), "codes": q.to(torch.uint8)}
        return Payload(tensors, tensor.shape, tensor.dtype)

    def decompress(self, payload: Payload) -> torch.Tensor:
        t = payload.tensors
        out = t["codes"].to(payload.dtype) * t["scale"]
        if self.mode == "minmax":
            out = out + t["min"]
        return out.reshape(payload.shape)

    def scale_of(self, payload: Payload) -> float:
        """The quantisation step of ``payload``: the rebuild error is at most half of it."""
        return float(payload.tensors["scale"])
