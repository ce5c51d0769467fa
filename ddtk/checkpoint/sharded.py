"""Sharded checkpoints: every rank writes its own piece, and any world size can load them.

A sharded checkpoint is a ``step-000123/`` directory (found by
:func:`~ddtk.checkpoint.store.latest` and pruned by retention like any other)
holding one file per rank, ``shard-00001-of-00004.pt``, and the manifest,
written last by rank 0 once every rank has reported its shard durable. What a
rank saves is a :class:`ShardedState` of three kinds of entries:

* **flat** entries (:class:`ShardedTensor`): a 1-D global tensor of known
  ``numel`` split into contiguous ranges, one per rank (DCP's chunk metadata).
  The layout goes into the manifest, so a run with another world size can find
  and read only the pieces that overlap the range it needs (files are memory
  mapped): a 4-rank checkpoint resumes on 2 or 3 ranks;
* **replicated** entries (scheduler state, optimizer hyperparameters, scalar
  counters): identical on every rank, written once, by rank 0;
* **per-rank** entries (RNG states): stored in each rank's own file and given
  back only when the world size is the same; at another world size they are
  left alone and :attr:`ShardedCheckpoint.notes` says so.

:func:`save_sharded` and :func:`load_sharded` are the generic pair;
:func:`zero_state`/:func:`load_zero` do it for a
:class:`~ddtk.parallel.zero.ZeroOptimizer` (each rank saves the part of the
parameters and optimizer state it owns), :func:`dp_state`/:func:`load_dp` for
plain data parallelism (each rank writes 1/N of the replicated model and
optimizer, which spreads the writes; a load reads it all back).

>>> import ddtk, tempfile, torch
>>> from ddtk.checkpoint.sharded import ShardedState, ShardedTensor, load_sharded, save_sharded
>>> def save(ctx, run):
...     full = torch.arange(10.0)
...     state = ShardedState(flat={"w": ShardedTensor.from_full(full, ctx.rank, ctx.world_size)})
...     return save_sharded(ctx, run, state, step=3).name
>>> def load(ctx, run):
...     return load_sharded(ctx, run).flat["w"].local.tolist()
>>> run = tempfile.mkdtemp()
>>> ddtk.launch(save, 2, args=(run,), echo=False, timeout=120)
['step-000003', 'step-000003']
>>> ddtk.launch(load, 3, args=(run,), echo=False, timeout=120)
[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
"""

from ddtk.checkpoint.sharded_load import load_sharded
from ddtk.checkpoint.sharded_save import save_sharded
from ddtk.checkpoint.sharded_states import dp_state, load_dp, load_zero, zero_state
from ddtk.checkpoint.shards import (
    KIND,
    ShardedCheckpoint,
    ShardedState,
    ShardedTensor,
    ShardWriteError,
    shard_name,
    shard_range,
)

__all__ = [
    "KIND",
    "ShardWriteError",
    "ShardedCheckpoint",
    "ShardedState",
    "ShardedTensor",
    "dp_state",
    "load_dp",
    "load_sharded",
    "load_zero",
    "save_sharded",
    "shard_name",
    "shard_range",
    "zero_state",
]
