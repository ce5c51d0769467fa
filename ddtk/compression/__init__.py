"""Gradient compression: send fewer bytes per step, and know exactly how many.

Every compressor has ``compress(tensor) -> Payload``, ``decompress(payload) ->
tensor`` and ``aggregate(ctx, tensor, key)`` (the average over ranks of every
rank's decompressed contribution), and counts the bytes it puts on the wire
(``Payload.nbytes``, ``Compressor.last_bytes``, ``Compressor.stats``).

=================  =========================================  ==============================
spec               compressor                                 bytes on the wire (float32)
=================  =========================================  ==============================
``none``           :class:`NoCompression`                     4n
``topk:0.01``      :class:`TopK` (ratio; ``topk:100`` = k)    8k
``randomk:0.01``   :class:`RandomK` (shared random indices)   4k
``qsgd:16``        :class:`QSGD` (s levels)                   n + 4 (2n + 4 for s > 127)
``int8[:minmax]``  :class:`Int8` (``absmax`` or ``minmax``)   n + 4 / n + 8
``sign``           :class:`SignSGD` (1 bit + scale)           ceil(n/8) + 4
``powersgd:2``     :class:`PowerSGD` (rank r)                 4 r (rows + cols)
``ef+SPEC``        :class:`ErrorFeedback` around SPEC         as SPEC
=================  =========================================  ==============================

>>> from ddtk.compression import get_compressor
>>> get_compressor("ef+topk:0.01")
ErrorFeedback('ef+topk:0.01')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddtk.compression.base import CompressionStats, Compressor, Exchanged, NoCompression, Payload
from ddtk.compression.error_feedback import ErrorFeedback
from ddtk.compression.int8 import Int8
from ddtk.compression.powersgd import PowerSGD
from ddtk.compression.qsgd import QSGD
from ddtk.compression.randomk import RandomK
from ddtk.compression.sign import SignSGD
from ddtk.compression.topk import TopK

__all__ = [
    "COMPRESSORS",
    "QSGD",
    "CompressionStats",
    "Compressor",
    "ErrorFeedback",
    "Exchanged",
    "Int8",
    "NoCompression",
    "Payload",
    "PowerSGD",
    "RandomK",
    "SignSGD",
    "TopK",
    "get_compressor",
]


def _sparse(cls: type[Compressor]) -> Callable[..., Compressor]:
    """``topk:100`` means k = 100; ``topk:0.01`` (a number with a point or exponent) a ratio."""

    def build(arg: str | None = None, **kwargs: Any) -> Compressor:
        if arg is None:
            return cls(**kwargs)
        if arg.isdigit():
            return cls(k=int(arg), **kwargs)
        return cls(ratio=_number(arg, cls.__name__), **kwargs)

    return build


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{what} expects a number after ':', got {text!r}") from None


def _integer(cls: type[Compressor], param: str) -> Callable[..., Compressor]:
    def build(arg: str | None = None, **kwargs: Any) -> Compressor:
        if arg is not None:
            try:
                kwargs[param] = int(arg)
            except ValueError:
                raise ValueError(
                    f"{cls.__name__} expects an integer {param} after ':', got {arg!r}"
                ) from None
        return cls(**kwargs)

    return build


def _plain(cls: type[Compressor], param: str | None = None) -> Callable[..., Compressor]:
    def build(arg: str | None = None, **kwargs: Any) -> Compressor:
        if arg is not None:
            if param is None:
                raise ValueError(f"{cls.__name__} takes no ':' argument, got {arg!r}")
            kwargs[param] = arg
        return cls(**kwargs)

    return build


COMPRESSORS: dict[str, Callable[..., Compressor]] = {
    "none": _plain(NoCompression),
    "topk": _sparse(TopK),
    "randomk": _sparse(RandomK),
    "qsgd": _integer(QSGD, "s"),
    "int8": _plain(Int8, "mode"),
    "sign": _plain(SignSGD),
    "powersgd": _integer(PowerSGD, "rank"),
}


def get_compressor(spec: str | Compressor | None, **kwargs: Any) -> Compressor | None:
    """Build a compressor from a name or CLI spec; pass a Compressor or None through.

    ``spec`` is a name from :data:`COMPRESSORS`, optionally ``:ARG`` (``"topk:0.01"``,
    ``"qsgd:16"``, ``"int8:minmax"``, ``"powersgd:2"``), optionally prefixed by
    ``"ef+"`` for error feedback. ``kwargs`` go to the constructor
    (``get_compressor("topk", ratio=0.01, seed=1)``).
    """
    if spec is None or isinstance(spec, Compressor):
        if kwargs:
            raise ValueError("keyword arguments need a compressor name, not an instance or None")
        return spec
    if not isinstance(spec, str):
        raise TypeError(
            f"compression must be a name, a Compressor or None, got {type(spec).__name__}"
        )
    text = spec.strip().lower()
    if text.startswith("ef+"):
        inner = get_compressor(text[3:], **kwargs)
        if inner is None:
            raise ValueError(f"nothing to wrap with error feedback in {spec!r}")
        return ErrorFeedback(inner)
    name, _, arg = text.partition(":")
    if name not in COMPRESSORS:
        raise ValueError(
            f"unknown compressor {name!r} in {spec!r}; choose one of {', '.join(COMPRESSORS)}"
            " (prefix 'ef+' for error feedback)"
        )
    if _ and not arg:
        raise ValueError(f"missing value after ':' in {spec!r}")
    return COMPRESSORS[name](arg or None, **kwargs)
