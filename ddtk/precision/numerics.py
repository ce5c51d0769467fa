"""What 16-bit floats do to training numbers: underflow, loss scaling, rounding, accumulation.

Every function returns plain numbers or lists of dicts, ready to print as a
table or plot. The three formats, as sign / exponent / significand bits:

* float32: 1 / 8 / 23: range about 1e-45 .. 3e38, about 7 significant digits,
* float16: 1 / 5 / 10: range about 6e-8 .. 65504, about 3-4 digits,
* bfloat16: 1 / 8 / 7: float32's range, about 2-3 digits.

So float16 loses small gradients (they flush to zero below 2**-24, its
smallest subnormal), which loss scaling fixes by shifting them up by 2**k
until the largest one would overflow 65504. bfloat16 has float32's exponent,
so nothing realistic underflows and no scaler is needed, but it rounds
coarsely: ``1 + 1e-3`` is ``1`` in bfloat16, and a long running sum of small
values stalls once each addend is below half a unit in the last place.

>>> import torch
>>> from ddtk.precision import numerics
>>> [(r["dtype"], r["exponent_bits"], r["mantissa_bits"]) for r in numerics.format_table()]
[('fp16', 5, 10), ('bf16', 8, 7), ('fp32', 8, 23)]
>>> numerics.one_plus(1e-3)
{'fp16': 1.0009765625, 'bf16': 1.0, 'fp32': 1.0010000467300415}
>>> g = torch.tensor([2.0**-30, 2.0**-20, 1e-3])
>>> {r["dtype"]: round(r["underflow_fraction"], 3) for r in numerics.underflow_table(g)}
{'fp16': 0.333, 'bf16': 0.0, 'fp32': 0.0}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

__all__ = [
    "DTYPES",
    "accumulation_error",
    "digits_gradients",
    "digits_underflow_demo",
    "first_overflow_exponent",
    "format_table",
    "log_uniform_gradients",
    "loss_scale_sweep",
    "one_plus",
    "underflow_fraction",
    "underflow_table",
]

DTYPES: dict[str, torch.dtype] = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
}


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _name(dtype: torch.dtype) -> str:
    return next((k for k, v in DTYPES.items() if v == dtype), str(dtype))


def format_table(names: Sequence[str] = ("fp16", "bf16", "fp32")) -> list[dict]:
    """Bits, exponent/significand bits, eps, max, smallest normal and subnormal of each format.

    All read from ``torch.finfo``: the significand bits are ``-log2(eps)``, the
    exponent bits what is left after the sign, and the smallest subnormal is
    ``smallest_normal * eps``.
    """
    rows = []
    for name in names:
        fi = torch.finfo(_dtype(name))
        mantissa = round(-math.log2(fi.eps))
        rows.append({
            "dtype": name, "bits": fi.bits, "exponent_bits": fi.bits - 1 - mantissa,
            "mantissa_bits": mantissa, "eps": fi.eps, "max": fi.max,
            "smallest_normal": fi.smallest_normal, "smallest_subnormal": fi.smallest_normal * fi.eps,
        })  # fmt: skip
    return rows


def log_uniform_gradients(
    n: int = 100_000, low: float = 1e-10, high: float = 1e-1, seed: int = 0
) -> torch.Tensor:
    """``n`` float32 values with random signs, log-uniform in magnitude between ``low`` and ``high``."""
    if n < 1 or not 0 < low < high:
        raise ValueError(f"need n >= 1 and 0 < low < high, got n={n}, low={low}, high={high}")
    g = torch.Generator().manual_seed(seed)
    log = torch.empty(n, dtype=torch.float64).uniform_(math.log(low), math.log(high), generator=g)
    sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
    return (sign * log.exp()).float()


def digits_gradients(scale: float = 1.0, batch: int = 64, seed: int = 0) -> torch.Tensor:
    """Real gradients: one float32 backward pass of the digits MLP on one batch, times ``scale``.

    ``scale < 1`` stands in for the smaller gradients of deeper or wider models
    (or of a loss averaged over more samples).
    """
    from ddtk.data import load_dataset
    from ddtk.models import build_model

    ds = load_dataset("digits")
    model = build_model("mlp", ds.input_shape, ds.num_classes, seed=seed)
    idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))[:batch]
    torch.nn.functional.cross_entropy(model(ds.x[idx]), ds.y[idx]).backward()
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    return flat * scale


def underflow_fraction(values: torch.Tensor, dtype: str | torch.dtype) -> float:
    """Fraction of the nonzero ``values`` that become exactly zero when cast to ``dtype``."""
    nonzero = values[values != 0]
    if nonzero.numel() == 0:
        return 0.0
    return float((nonzero.to(_dtype(dtype)) == 0).double().mean())


def underflow_table(
    values: torch.Tensor, names: Sequence[str] = ("fp16", "bf16", "fp32")
) -> list[dict]:
    """Per format: the fraction of ``values`` flushed to zero, and the threshold it flushes below."""
    facts = {r["dtype"]: r for r in format_table(names)}
    return [
        {"dtype": n, "underflow_fraction": underflow_fraction(values, n),
         "smallest_subnormal": facts[n]["smallest_subnormal"]}
        for n in names
    ]  # fmt: skip


def first_overflow_exponent(values: torch.Tensor, dtype: str | torch.dtype = "fp16") -> int:
    """The smallest ``k >= 0`` for which ``values * 2**k`` has an inf in ``dtype``.

    Multiplying by a power of two is exact in float64, so only the cast rounds.
    """
    peak = float(values.abs().max().double())
    if peak == 0:
        raise ValueError("all values are zero: no scale overflows them")
    target = _dtype(dtype)
    k = 0
    while not math.isinf(float(torch.tensor(peak * 2.0**k, dtype=torch.float64).to(target))):
        k += 1
    return k


def loss_scale_sweep(
    values: torch.Tensor, exponents: Iterable[int] = range(0, 33, 4), dtype: str = "fp16"
) -> list[dict]:
    """Scale ``values`` by ``2**k`` for each ``k``, cast to ``dtype``: what underflows, what overflows.

    ``underflow_fraction`` counts nonzero values that became 0, and
    ``overflow_fraction`` values that became inf; ``recovered_fraction`` is the
    rest, those that survive the round trip (cast, then divide by ``2**k``) as a
    nonzero finite number.
    """
    target = _dtype(dtype)
    v = values[values != 0].double()
    rows = []
    for k in exponents:
        cast = (v * 2.0**k).to(target)
        under = float((cast == 0).double().mean())
        over = float(cast.isinf().double().mean())
        rows.append({"k": k, "scale": 2.0**k, "underflow_fraction": under,
                     "overflow_fraction": over, "recovered_fraction": 1.0 - under - over})  # fmt: skip
    return rows


def one_plus(x: float = 1e-3, names: Sequence[str] = ("fp16", "bf16", "fp32")) -> dict[str, float]:
    """``1 + x`` computed in each format: bf16 cannot tell 1.001 from 1."""
    return {
        n: float(torch.tensor(1.0, dtype=_dtype(n)) + torch.tensor(x, dtype=_dtype(n)))
        for n in names
    }


def accumulation_error(
    n: int = 10_000,
    value: float = 1e-3,
    accumulators: Sequence[tuple[str, str]] = (
        ("bf16", "bf16"),
        ("bf16", "fp32"),
        ("fp16", "fp16"),
        ("fp32", "fp32"),
    ),
) -> list[dict]:
    """Add ``value`` ``n`` times, one addition at a time, as (addend format, running-sum format).

    The running sum is rounded to its format after every addition, as a naive
    loop would. ``exact`` is ``n`` times the addend as stored in its format
    (computed in float64), so the error is the accumulation's alone. A 16-bit
    running sum stalls once ``value`` is below half its unit in the last place;
    a float32 accumulator over bf16 addends (what matmul kernels do under
    autocast) stays accurate.
    """
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    rows = []
    for addend_name, acc_name in accumulators:
        addend = torch.tensor(value, dtype=_dtype(addend_name)).to(_dtype(acc_name))
        acc = torch.zeros((), dtype=_dtype(acc_name))
        for _ in range(n):
            acc = acc + addend
        exact = n * float(torch.tensor(value, dtype=_dtype(addend_name)).double())
        total = float(acc.double())
        rows.append({"addend": addend_name, "accumulator": acc_name, "n": n, "value": value,
                     "sum": total, "exact": exact, "relative_error": abs(total - exact) / exact})  # fmt: skip
    return rows


def digits_underflow_demo(scales: Sequence[float] = (1.0, 1e-2, 1e-4)) -> list[dict]:
    """Underflow of real digits-MLP gradients in each format, for gradients shrunk by ``scales``."""
    base = digits_gradients()
    return [
        {
            "grad_scale": s,
            **{r["dtype"]: r["underflow_fraction"] for r in underflow_table(base * s)},
        }
        for s in scales
    ]
