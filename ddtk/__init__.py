"""ddtk: the Distributed Training at Scale course kit.

The public face of the package is small:

- :func:`launch` starts N local ranks (real processes) and runs a function in each;
- :class:`DistributedContext` is what each rank receives: point-to-point messages
  and collectives implemented from send and recv, one algorithm per file;
- :class:`ReduceOp` names the reductions;
- :class:`RankError` is raised by :func:`launch` when a rank fails;
- :class:`CollectiveTimeoutError` and :class:`PeerLostError` are raised inside a rank
  when a peer hangs or dies (with ``launch(..., op_timeout=...)``).
"""

from ddtk._version import __version__
from ddtk.comm.context import DistributedContext
from ddtk.comm.ops import ReduceOp
from ddtk.comm.transport import CollectiveTimeoutError, PeerLostError
from ddtk.launch import RankError, launch

__all__ = [
    "CollectiveTimeoutError",
    "DistributedContext",
    "PeerLostError",
    "RankError",
    "ReduceOp",
    "__version__",
    "launch",
]
