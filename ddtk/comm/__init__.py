"""Message passing and collectives built from point-to-point send and recv.

One algorithm per module: :mod:`~ddtk.comm.ring`, :mod:`~ddtk.comm.tree`,
:mod:`~ddtk.comm.recursive_doubling`, :mod:`~ddtk.comm.naive`,
:mod:`~ddtk.comm.hierarchical` (reduce to a leader), :mod:`~ddtk.comm.hierarchical_rs`
(reduce-scatter, cross-group all-reduce, all-gather), :mod:`~ddtk.comm.barrier`; the reference
``torch.distributed`` path in :mod:`~ddtk.comm.reference`; their alpha-beta
costs in :mod:`~ddtk.comm.costmodel`.
"""

from ddtk.comm.context import ALL_REDUCE_ALGORITHMS, DistributedContext
from ddtk.comm.ops import ReduceOp
from ddtk.comm.stats import CollectiveStats, CommStats
from ddtk.comm.transport import Message
from ddtk.comm.validation import CollectiveMismatchError

__all__ = [
    "ALL_REDUCE_ALGORITHMS",
    "CollectiveMismatchError",
    "CollectiveStats",
    "CommStats",
    "DistributedContext",
    "Message",
    "ReduceOp",
]
