"""How much memory one rank needs to train a transformer, under DP, ZeRO, TP and PP.

Training memory has four parts, and each parallelism divides a different one:

* **parameters** ``P`` (bytes per parameter: 4 in fp32, 2 in mixed precision),
* **gradients** (the same size as the parameters),
* **optimiser state**: Adam keeps two moments (8 bytes per parameter in fp32;
  12 in mixed precision, with the fp32 master copy, as counted by the ZeRO
  paper), SGD with momentum one buffer, plain SGD none,
* **activations** kept for backward, which grow with the micro-batch and the
  sequence length.

Data parallelism (DP) replicates everything. ZeRO-1/2/3 shard the optimiser
state, then also the gradients, then also the parameters over the ``d`` DP
ranks. Tensor parallelism (TP, Megatron sharding) splits the attention heads
and the MLP's hidden width over ``t`` ranks, and the vocabulary of the
embedding and head; LayerNorms, the position embedding and the biases of the
row-parallel layers stay replicated. Pipeline parallelism (PP) gives each of
``p`` stages ``layers / p`` layers; a stage keeps the activations of every
micro-batch that is in flight: all ``m`` under GPipe, at most ``p - i`` on
stage ``i`` under 1F1B.

Activations per layer follow Korthikanti et al. (2022), "Reducing Activation
Recomputation in Large Transformer Models": with 16-bit activations and
dropout, ``sbh(34 + 5as/h)`` bytes (``s`` sequence, ``b`` micro-batch, ``h``
hidden, ``a`` heads). Written per tensor, so it holds for any element size
``e``, MLP width ``f*h`` and with or without dropout, a layer keeps

* ``4 sbh`` elements TP leaves replicated: the inputs of the two LayerNorms,
  of the QKV projection and of the first MLP layer,
* ``(4 + 2f) sbh`` elements TP shards: Q, K, V, the attention output (input
  of the output projection), the GELU input and the second MLP layer's input,
* ``a s^2 b`` elements of softmax output (sharded by heads),
* with dropout, 1-byte masks: ``2 sbh`` (replicated) and ``a s^2 b``, plus
  the ``a s^2 b`` dropout output,
* the LayerNorms' mean and inverse deviation, ``4 sb`` fp32 values (the paper
  leaves these out).

For ``e = 2``, ``f = 4`` and dropout this is the paper's ``sbh(34 + 5as/h)``;
with TP it is ``sbh(10 + 24/t + 5as/(ht))``, and with sequence parallelism
(SP) everything is divided by ``t``. :class:`ddtk.models.TinyTransformer`
(no dropout) saves exactly the tensors listed, which the tests check with
:func:`ddtk.memory.measure.saved_activation_bytes`. Outside the layers the
model keeps the token ids (int64), the final LayerNorm's input and output,
the log-softmax of the logits and the targets: :func:`head_activation_bytes`.

>>> from ddtk.memory.calculator import TransformerConfig, estimate
>>> cfg = TransformerConfig(layers=24, hidden=1024, heads=16, seq_len=1024, micro_batch=4,
...                         vocab=50304, mixed_precision=True)
>>> cfg.parameters
406382592
>>> dp = estimate(cfg)
>>> round(dp.total / 2**30, 2), round(dp.optimizer_bytes / 2**30, 2)
(12.84, 4.54)
>>> zero3 = estimate(cfg, dp=8, zero=3)
>>> round(zero3.params_bytes / 2**20, 1)
96.9
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

__all__ = [
    "OPTIMIZERS",
    "MemoryEstimate",
    "TransformerConfig",
    "cnn_parameter_count",
    "compare_strategies",
    "estimate",
    "head_activation_bytes",
    "layer_activation_bytes",
    "mlp_activation_bytes",
    "mlp_parameter_count",
    "table",
]

OPTIMIZERS = ("adam", "momentum", "sgd")
SCHEDULES = ("1f1b", "gpipe")
STAT_BYTES = 4  # LayerNorm mean / rstd are kept in fp32
INDEX_BYTES = 8  # int64 token ids and targets


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class TransformerConfig:
    """A GPT-like model (the shape of :class:`ddtk.models.TinyTransformer`) and how it is trained.

    ``micro_batch`` is the number of sequences one rank processes at once.
    ``dtype_bytes`` is the element size of parameters and activations without
    mixed precision; with ``mixed_precision`` they are 16-bit and Adam also
    keeps an fp32 master copy.
    """

    layers: int
    hidden: int
    heads: int
    seq_len: int
    micro_batch: int
    vocab: int
    ffn_mult: int = 4
    dtype_bytes: int = 4
    optimizer: str = "adam"
    mixed_precision: bool = False
    dropout: bool = False

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq_len", "micro_batch", "vocab", "ffn_mult",
                     "dtype_bytes"):  # fmt: skip
            _positive(name, getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}"
            )

    @property
    def layer_parameters(self) -> int:
        """Parameters of one block: QKV, output projection, two MLP layers (with biases), two LayerNorms."""
        h, f = self.hidden, self.ffn_mult
        return (4 + 2 * f) * h * h + (9 + f) * h

    @property
    def parameters(self) -> int:
        """All parameters: token and position embeddings, blocks, final LayerNorm, untied head."""
        h = self.hidden
        return 2 * self.vocab * h + self.seq_len * h + 2 * h + self.layers * self.layer_parameters

    @property
    def activation_element_bytes(self) -> int:
        """Bytes of one activation element: 2 in mixed precision, else ``dtype_bytes``."""
        return 2 if self.mixed_precision else self.dtype_bytes

    def bytes_per_parameter(self) -> tuple[int, int, int]:
        """(parameter, gradient, optimiser-state) bytes per parameter."""
        if self.mixed_precision:
            return 2, 2, {"adam": 12, "momentum": 8, "sgd": 4}[self.optimizer]
        e = self.dtype_bytes
        return e, e, {"adam": 2 * e, "momentum": e, "sgd": 0}[self.optimizer]


@dataclass
class MemoryEstimate:
    """Bytes one rank holds; for pipeline parallelism, the busiest stage (``stage``)."""

    strategy: str
    parameters: int  # parameters held by this rank
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    stage: int | None = None
    details: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Parameters + gradients + optimiser state + activations."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activation_bytes

    def as_dict(self) -> dict:
        """A plain dict (JSON-ready), with ``total``."""
        return asdict(self) | {"total": self.total}

    def __rich__(self):
        return table([self])


def layer_activation_bytes(
    cfg: TransformerConfig, tp: int = 1, sequence_parallel: bool = False
) -> int:
    """Activation bytes one transformer layer keeps for backward on one rank (see the module doc)."""
    s, b, h, a, f = cfg.seq_len, cfg.micro_batch, cfg.hidden, cfg.heads, cfg.ffn_mult
    e = cfg.activation_element_bytes
    replicated = 4 * s * b * h * e + 4 * s * b * STAT_BYTES
    sharded = (4 + 2 * f) * s * b * h * e + a * s * s * b * e
    if cfg.dropout:
        replicated += 2 * s * b * h  # 1-byte masks after the projection and the MLP
        sharded += a * s * s * b * (1 + e)  # attention dropout: mask and output
    if sequence_parallel:
        return (replicated + sharded) // tp
    return replicated + sharded // tp


def head_activation_bytes(cfg: TransformerConfig, tp: int = 1) -> int:
    """Activation bytes outside the blocks: token ids, final LayerNorm, loss (logits split by TP).

    Token ids (int64), the final LayerNorm's input, mean and rstd, the head's input,
    the log-softmax of the logits (fp32) and the targets (int64) with the loss's
    4-byte total weight.
    """
    s, b, h = cfg.seq_len, cfg.micro_batch, cfg.hidden
    e = cfg.activation_element_bytes
    tokens = 2 * s * b * INDEX_BYTES + 4  # inputs and targets, total weight
    final = 2 * s * b * h * e + 2 * s * b * STAT_BYTES
    logits = s * b * math.ceil(cfg.vocab / tp) * 4
    return tokens + final + logits


def _tp_parameters(cfg: TransformerConfig, tp: int) -> tuple[int, int, int]:
    """(first-stage extras, per layer, last-stage extras) parameters on one TP rank."""
    h, f = cfg.hidden, cfg.ffn_mult
    layer = 6 * h + ((4 + 2 * f) * h * h + (3 + f) * h) // tp
    first = math.ceil(cfg.vocab / tp) * h + cfg.seq_len * h  # vocab-parallel embedding, positions
    last = 2 * h + math.ceil(cfg.vocab / tp) * h  # final LayerNorm, vocab-parallel head
    return first, layer, last


def estimate(
    cfg: TransformerConfig,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    zero: int = 0,
    sequence_parallel: bool = False,
    schedule: str = "1f1b",
    microbatches: int = 1,
    recompute: bool = False,
    strategy: str | None = None,
) -> MemoryEstimate:
    """Memory per rank for ``dp x tp x pp`` ranks, ZeRO stage ``zero`` (0-3) over the DP ranks.

    ``microbatches`` is the number of micro-batches per step in flight through the
    pipeline (GPipe keeps all of them, 1F1B at most ``pp - stage``).
    ``recompute`` is full activation checkpointing: a layer keeps only its input,
    and one layer's activations are rebuilt at a time during backward.
    """
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("microbatches", microbatches)):
        _positive(name, value)
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {zero!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if cfg.heads % tp or (cfg.ffn_mult * cfg.hidden) % tp:
        raise ValueError(
            f"tp={tp} must divide the heads ({cfg.heads}) and the MLP width ({cfg.ffn_mult * cfg.hidden})"
        )
    if sequence_parallel and cfg.seq_len % tp:
        raise ValueError(f"sequence parallelism needs tp={tp} to divide seq_len={cfg.seq_len}")
    if pp > cfg.layers:
        raise ValueError(f"pp={pp} stages for {cfg.layers} layers leaves a stage empty")
    first, per_layer, last = _tp_parameters(cfg, tp)
    per_stage = [cfg.layers // pp + (i < cfg.layers % pp) for i in range(pp)]
    layer_act = layer_activation_bytes(cfg, tp, sequence_parallel)
    if recompute:
        e = cfg.activation_element_bytes
        kept = cfg.seq_len * cfg.micro_batch * cfg.hidden * e // (tp if sequence_parallel else 1)
    pb, gb, ob = cfg.bytes_per_parameter()
    best: MemoryEstimate | None = None
    for i, n_layers in enumerate(per_stage):
        params = n_layers * per_layer + (first if i == 0 else 0) + (last if i == pp - 1 else 0)
        in_flight = microbatches if schedule == "gpipe" else min(pp - i, microbatches)
        if recompute:
            acts = in_flight * n_layers * kept + layer_act
        else:
            acts = in_flight * n_layers * layer_act
        if i == pp - 1:
            acts += in_flight * head_activation_bytes(cfg, tp)
        shard = math.ceil(params / dp)
        est = MemoryEstimate(
            strategy=strategy or _label(dp, tp, pp, zero, sequence_parallel, schedule),
            parameters=shard if zero >= 3 else params,
            params_bytes=(shard if zero >= 3 else params) * pb,
            grads_bytes=(shard if zero >= 2 else params) * gb,
            optimizer_bytes=(shard if zero >= 1 else params) * ob,
            activation_bytes=acts,
            stage=i if pp > 1 else None,
            details={"dp": dp, "tp": tp, "pp": pp, "zero": zero, "in_flight": in_flight,
                     "layers": n_layers, "sequence_parallel": sequence_parallel,
                     "schedule": schedule, "microbatches": microbatches, "recompute": recompute},
        )  # fmt: skip
        if best is None or est.total > best.total:
            best = est
    assert best is not None
    return best


def _label(dp: int, tp: int, pp: int, zero: int, sp: bool, schedule: str) -> str:
    parts = []
    if dp > 1 or (tp == 1 and pp == 1):
        parts.append(f"ZeRO-{zero} x{dp}" if zero else f"DP x{dp}")
    if tp > 1:
        parts.append(f"TP{'+SP' if sp else ''} x{tp}")
    if pp > 1:
        parts.append(f"PP-{schedule} x{pp}")
    return " / ".join(parts)


def compare_strategies(
    cfg: TransformerConfig, degree: int, microbatches: int | None = None
) -> list[MemoryEstimate]:
    """Per-rank memory of each way to use ``degree`` ranks: DP, ZeRO-1/2/3, TP, TP+SP, PP (GPipe, 1F1B).

    ``microbatches`` (default ``2 * degree``) applies to the pipeline schedules.
    """
    m = 2 * degree if microbatches is None else microbatches
    rows = [
        estimate(cfg, dp=degree, strategy="DP"),
        estimate(cfg, dp=degree, zero=1, strategy="ZeRO-1"),
        estimate(cfg, dp=degree, zero=2, strategy="ZeRO-2"),
        estimate(cfg, dp=degree, zero=3, strategy="ZeRO-3"),
        estimate(cfg, tp=degree, strategy="TP"),
        estimate(cfg, tp=degree, sequence_parallel=True, strategy="TP+SP"),
        estimate(cfg, pp=degree, schedule="gpipe", microbatches=m, strategy=f"PP GPipe (m={m})"),
        estimate(cfg, pp=degree, schedule="1f1b", microbatches=m, strategy=f"PP 1F1B (m={m})"),
    ]
    return rows


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def table(estimates: Sequence[MemoryEstimate], title: str = "memory per rank"):
    """A rich table of estimates: parameters held, then bytes of each part and the total."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("strategy", "params/rank", "params", "grads", "optimizer", "activations", "total"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for e in estimates:
        name = e.strategy + ("" if e.stage is None else f" (stage {e.stage})")
        t.add_row(name, f"{e.parameters:,}", _fmt(e.params_bytes), _fmt(e.grads_bytes),
                  _fmt(e.optimizer_bytes), _fmt(e.activation_bytes), _fmt(e.total))  # fmt: skip
    return t


def scaled(cfg: TransformerConfig, **changes: object) -> TransformerConfig:
    """A copy of ``cfg`` with some fields changed (e.g. ``micro_batch=8``)."""
    return replace(cfg, **changes)


# -- the small non-transformer models of ddtk.models -------------------------------------------
def mlp_parameter_count(input_dim: int, hidden_dims: Sequence[int], output_dim: int) -> int:
    """Weights and biases of :class:`ddtk.models.MLP`: ``sum((a + 1) * b)`` over consecutive widths."""
    widths = [input_dim, *hidden_dims, output_dim]
    return sum((a + 1) * b for a, b in itertools.pairwise(widths))


def cnn_parameter_count(
    in_channels: int = 1, num_classes: int = 10, width: int = 16, side: int = 8
) -> int:
    """Parameters of :class:`ddtk.models.SmallCNN`: two 3x3 convolutions, two linear layers."""
    conv = (in_channels * 9 + 1) * width + (width * 9 + 1) * 2 * width
    flat = 2 * width * (side // 2) ** 2
    return conv + (flat + 1) * 64 + (64 + 1) * num_classes


def mlp_activation_bytes(
    batch: int, input_dim: int, hidden_dims: Sequence[int], output_dim: int, dtype_bytes: int = 4
) -> int:
    """Bytes an :class:`ddtk.models.MLP` with a cross-entropy loss saves for backward.

    The first Linear keeps the input; each ReLU keeps its output, which the next
    Linear keeps too (one storage, counted once); the loss keeps the log-softmax
    of the logits, the int64 targets and a 4-byte total weight.
    """
    kept = input_dim + sum(hidden_dims) + output_dim
    return batch * kept * dtype_bytes + batch * INDEX_BYTES + 4
