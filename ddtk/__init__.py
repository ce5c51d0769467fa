"""ddtk: the Distributed Training at Scale course kit.

The public face of the package is small:

- :func:`launch` starts N local ranks (real processes) and runs a function in each;
  :func:`close_zygote` stops the preloaded interpreter it forks them from;
- :class:`DistributedContext` is what each rank receives: point-to-point messages
  and collectives implemented from send and recv, one algorithm per file;
- :class:`ReduceOp` names the reductions;
- :class:`RankError` is raised by :func:`launch` when a rank fails;
- :class:`CollectiveTimeoutError` and :class:`PeerLostError` are raised inside a rank
  when a peer dies, or hangs for ``op_timeout`` (300 s unless ``launch(..., op_timeout=)``
  or ``DDTK_OP_TIMEOUT`` says otherwise).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ddtk._version import __version__
from ddtk.launch import (  # light (no torch); eager, since ddtk.launch is also a module
    RankError,
    close_zygote,
    launch,
)

# Loaded on first use (PEP 562), so that `ddtk --help`, `ddtk quiz ...` and the
# course tools start without importing torch.
_LAZY = {
    "DistributedContext": "ddtk.comm.context",
    "ReduceOp": "ddtk.comm.ops",
    "CollectiveTimeoutError": "ddtk.comm.transport",
    "PeerLostError": "ddtk.comm.transport",
}

if TYPE_CHECKING:
    from ddtk.comm.context import DistributedContext
    from ddtk.comm.ops import ReduceOp
    from ddtk.comm.transport import CollectiveTimeoutError, PeerLostError


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ddtk' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "CollectiveTimeoutError",
    "DistributedContext",
    "PeerLostError",
    "RankError",
    "ReduceOp",
    "__version__",
    "close_zygote",
    "launch",
]
