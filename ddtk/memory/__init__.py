"""Memory of a training step: measure it, predict it, and trade it for compute.

* :mod:`ddtk.memory.measure`: saved activations, tensor and optimiser-state bytes, peak on CPU/CUDA.
* :mod:`ddtk.memory.calculator`: per-rank memory of a transformer under DP, ZeRO, TP and PP.
* :mod:`ddtk.memory.activation_checkpointing`: recompute instead of keeping activations.

>>> from ddtk.memory import TransformerConfig, estimate
>>> estimate(TransformerConfig(layers=2, hidden=32, heads=4, seq_len=16, micro_batch=3, vocab=64)).parameters
30080
"""

from ddtk.memory.calculator import MemoryEstimate, TransformerConfig, compare_strategies, estimate
from ddtk.memory.measure import (
    optimizer_state_bytes,
    peak_memory_bytes,
    retained_bytes,
    saved_activation_bytes,
    tensor_bytes,
)

__all__ = [
    "MemoryEstimate",
    "TransformerConfig",
    "compare_strategies",
    "estimate",
    "optimizer_state_bytes",
    "peak_memory_bytes",
    "retained_bytes",
    "saved_activation_bytes",
    "tensor_bytes",
]
