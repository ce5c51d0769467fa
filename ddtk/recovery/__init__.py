"""Automatic recovery from a lost worker: torchrun elastic, Horovod Elastic and Ray Train.

Each driver trains the same tiny problem (:mod:`ddtk.recovery.common`), commits
its state every few steps, and when a worker dies the launcher restarts (or
shrinks) the group, which resumes from the last commit: at most the steps since
that commit are computed again.

* :mod:`ddtk.recovery.common`: model, data, fingerprint, recovery clock, reference;
* :mod:`ddtk.recovery.torchrun_train`: ``torchrun --max-restarts`` with DDP and
  :mod:`ddtk.checkpoint`;
* :mod:`ddtk.recovery.horovod_elastic_train`: ``horovodrun`` with ``hvd.elastic.run``;
* :mod:`ddtk.recovery.ray_train`: Ray Train with ``FailureConfig``.

>>> from ddtk.recovery import build, fingerprint
>>> len(fingerprint(build()[0]))
64
"""

from ddtk.recovery.common import (
    RecoveryClock,
    build,
    fingerprint,
    global_batch,
    kill_self_once,
    local_batch,
    loss_fn,
    reference,
)

__all__ = [
    "RecoveryClock",
    "build",
    "fingerprint",
    "global_batch",
    "kill_self_once",
    "local_batch",
    "loss_fn",
    "reference",
]
