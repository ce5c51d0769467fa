"""Model FLOPs utilisation (MFU), and what it buys: a training run in GPU-hours, days and money.

**Model FLOPs.** Training a dense transformer of ``N`` parameters on ``D`` tokens costs
about ``C = 6·N·D`` floating-point operations (Kaplan et al., *Scaling Laws for Neural
Language Models*, 2020, §2.1). Forward, each parameter takes part in one multiply and one
add per token: ``2·N·D``. Backward computes two gradients per weight use, one with
respect to the layer's input (to pass back) and one with respect to the weight, each as
many FLOPs as the forward: ``4·N·D``. Attention over long sequences adds ``12·L·h·s``
per token (PaLM, Chowdhery et al. 2022, appendix B), which this rule leaves out.

**MFU** is the model FLOPs a job achieves per second over the hardware's peak
(Chowdhery et al. 2022). It counts what training requires, not what the hardware ran:
a forward recomputed by activation checkpointing is not model FLOPs.

**Compute-optimal tokens.** Hoffmann et al. (*Training Compute-Optimal Large Language
Models*, 2022, "Chinchilla") found that for a fixed compute budget, parameters and
tokens should grow in equal proportion, about :data:`CHINCHILLA_TOKENS_PER_PARAM` tokens
per parameter.

:func:`size_run` puts these together: from a parameter count, a token multiplier, one
GPU's peak, an MFU, a GPU count and a price, the tokens, FLOPs, GPU-hours, wall-clock
days and cost of the run. Pure arithmetic: no torch, nothing measured here.

>>> run = size_run(7e9, tokens_per_param=20, peak_tflops=989, mfu=0.4, gpus=1024,
...                usd_per_gpu_hour=4.0)
>>> f"{run.tokens:.2e} tokens, {run.flops:.2e} FLOPs, {run.gpu_hours:,.0f} GPU-hours"
'1.40e+11 tokens, 5.88e+21 FLOPs, 4,129 GPU-hours'
>>> f"{run.days:.2f} days on 1,024 GPUs, {run.cost_usd:,.0f} USD"
'0.17 days on 1,024 GPUs, 16,515 USD'
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = [
    "CHINCHILLA_TOKENS_PER_PARAM",
    "FLOPS_PER_PARAM_TOKEN",
    "H100_SXM_BF16_DENSE_TFLOPS",
    "RunSize",
    "model_flops_utilization",
    "size_run",
    "training_flops",
]

FLOPS_PER_PARAM_TOKEN = 6  # 2 forward (multiply, add) + 4 backward (input and weight gradients)
CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: compute-optimal tokens per parameter
# NVIDIA H100 Tensor Core GPU datasheet (2023): H100 SXM BF16 Tensor Core 1,979 TFLOP/s
# with 2:4 structured sparsity, so 989 TFLOP/s dense.
H100_SXM_BF16_DENSE_TFLOPS = 989.0


def _positive(name: str, value: float) -> float:
    """``value`` as a float when it is a finite number above zero; ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number above 0, got {value!r}")
    return float(value)


def _fraction(name: str, value: float) -> float:
    """``value`` when it lies in (0, 1]; a percentage such as 40 is the usual slip."""
    value = _positive(name, value)
    if value > 1:
        raise ValueError(f"{name} is a fraction in (0, 1], got {value!r} (40% is 0.4, not 40)")
    return value


def training_flops(params: float, tokens: float) -> float:
    """Model FLOPs to train ``params`` parameters on ``tokens`` tokens: ``6·N·D``."""
    return FLOPS_PER_PARAM_TOKEN * _positive("params", params) * _positive("tokens", tokens)


def model_flops_utilization(
    flops_per_token: float, tokens_per_s: float, peak_tflops: float, devices: int = 1
) -> float:
    """MFU of a job doing ``flops_per_token`` model FLOPs per token at ``tokens_per_s`` on
    ``devices`` devices of ``peak_tflops`` TFLOP/s each: achieved FLOP/s over the peak.

    ``flops_per_token`` is what training needs per token (or per sample, for a model
    that sees each sample once per step): ``training_flops(N, 1)`` = 6·N for a dense
    transformer, plus attention's 12·L·h·s at long sequences, or a count from
    ``torch.utils.flop_counter.FlopCounterMode`` where the rule does not hold (a shallow
    MLP's first layer computes no input gradient). ``tokens_per_s`` is the whole job's
    throughput. A result above 1 is returned as it is: it says that ``peak_tflops`` is
    not the device's peak (a measured stand-in beaten by a later measurement), which
    the caller should report rather than hide.
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a whole number of at least 1, got {devices!r}")
    achieved = _positive("flops_per_token", flops_per_token) * _positive("tokens_per_s", tokens_per_s)
    return achieved / (devices * _positive("peak_tflops", peak_tflops) * 1e12)


@dataclass(frozen=True)
class RunSize:
    """A sized training run: ``tokens`` trained on, model ``flops``, ``gpu_hours`` of compute,
    wall-clock ``days`` on the run's GPUs, and ``cost_usd`` at the given price."""

    tokens: float
    flops: float
    gpu_hours: float
    days: float
    cost_usd: float

    def as_dict(self) -> dict[str, float]:
        """The fields as a plain dict (what the lecture's exercise returns)."""
        return asdict(self)


def size_run(
    params: float,
    *,
    tokens_per_param: float = CHINCHILLA_TOKENS_PER_PARAM,
    peak_tflops: float = H100_SXM_BF16_DENSE_TFLOPS,
    mfu: float,
    gpus: int,
    usd_per_gpu_hour: float,
) -> RunSize:
    """Size the run that trains ``params`` parameters on ``tokens_per_param`` tokens each.

    ``peak_tflops`` is one GPU's peak in TFLOP/s in the precision trained in (the
    default: an H100 SXM, dense BF16, from NVIDIA's datasheet); ``mfu`` the fraction of
    it the whole job achieves, in (0, 1], losses to communication, stragglers and
    overheads included, which is why wall-clock days are simply GPU-hours spread over
    ``gpus``. ``usd_per_gpu_hour`` is a price the caller assumes (0 for hardware already
    paid for). Every input is checked: ValueError names the one that is wrong.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a whole number of at least 1, got {gpus!r}")
    if isinstance(usd_per_gpu_hour, bool) or not isinstance(usd_per_gpu_hour, int | float):
        raise ValueError(f"usd_per_gpu_hour must be a number, got {usd_per_gpu_hour!r}")
    if not math.isfinite(usd_per_gpu_hour) or usd_per_gpu_hour < 0:
        raise ValueError(f"usd_per_gpu_hour must be finite and at least 0, got {usd_per_gpu_hour!r}")
    tokens = _positive("params", params) * _positive("tokens_per_param", tokens_per_param)
    flops = training_flops(params, tokens)
    achieved = _positive("peak_tflops", peak_tflops) * 1e12 * _fraction("mfu", mfu)  # FLOP/s per GPU
    gpu_hours = flops / achieved / 3600
    return RunSize(
        tokens=tokens,
        flops=flops,
        gpu_hours=gpu_hours,
        days=gpu_hours / gpus / 24,
        cost_usd=gpu_hours * usd_per_gpu_hour,
    )
