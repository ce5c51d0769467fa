"""Fault injection: break ranks and files on purpose, and turn hangs into errors.

The per-operation timeout lives in the communication layer: 300 s by default,
changed by ``DistributedContext(op_timeout=...)`` or the ``DDTK_OP_TIMEOUT``
environment variable (which :func:`ddtk.launch` passes on to its ranks), ``off``
or 0 to turn it off; its errors are re-exported here. The injectors are in
:mod:`ddtk.faults.injectors`; :func:`run_drill` (:mod:`ddtk.faults.drill`) SIGKILLs
a resumable training process at random moments and compares its end with an
uninterrupted run, bit for bit.

>>> from ddtk.faults import CollectiveTimeoutError
>>> issubclass(CollectiveTimeoutError, TimeoutError)
True
"""

from ddtk.comm.context import OP_TIMEOUT_ENV
from ddtk.comm.transport import CollectiveTimeoutError, CommunicationError, PeerLostError
from ddtk.faults.drill import DrillError, DrillReport, run_drill
from ddtk.faults.injectors import (
    FaultPlan,
    Hang,
    Injector,
    KillAtStep,
    RaiseAtStep,
    Straggler,
    corrupt_file,
    crash_during,
    hang,
    kill_at_step,
    raise_at_step,
    straggler,
    truncate_file,
)

__all__ = [
    "OP_TIMEOUT_ENV",
    "CollectiveTimeoutError",
    "CommunicationError",
    "DrillError",
    "DrillReport",
    "FaultPlan",
    "Hang",
    "Injector",
    "KillAtStep",
    "PeerLostError",
    "RaiseAtStep",
    "Straggler",
    "corrupt_file",
    "crash_during",
    "hang",
    "kill_at_step",
    "raise_at_step",
    "run_drill",
    "straggler",
    "truncate_file",
]
