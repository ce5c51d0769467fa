"""Bit layouts of the floating-point formats of lecture 05, with the ranges they imply.

Field widths are the formats' definitions (IEEE 754 binary32/binary16; bfloat16; NVIDIA's
TensorFloat-32 tensor-core mode; the OCP 8-bit formats E4M3 and E5M2 of Micikevicius et
al., "FP8 Formats for Deep Learning", 2022). The printed ranges are computed here, from
``torch.finfo`` where torch has the dtype, and from the IEEE formula for tf32, which is a
matmul mode rather than a storage dtype.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

# name: (exponent bits, mantissa bits, torch dtype or None)
FORMATS: dict[str, tuple[int, int, torch.dtype | None]] = {
    "fp32": (8, 23, torch.float32),
    "tf32 (matmul mode)": (8, 10, None),
    "bf16": (8, 7, torch.bfloat16),
    "fp16": (5, 10, torch.float16),
    "fp8 e5m2": (5, 2, torch.float8_e5m2),
    "fp8 e4m3fn": (4, 3, torch.float8_e4m3fn),
}
_FIELD_COLORS = {"sign": "#c44e52", "exponent": "#4c72b0", "mantissa": "#55a868"}


def format_range(exp_bits: int, man_bits: int, dtype: torch.dtype | None) -> dict[str, float]:
    """Largest finite value, smallest normal, smallest subnormal and machine epsilon."""
    if dtype is not None:
        fi = torch.finfo(dtype)
        return {"max": fi.max, "normal": fi.smallest_normal,
                "subnormal": fi.smallest_normal * fi.eps, "eps": fi.eps}  # fmt: skip
    bias = 2 ** (exp_bits - 1) - 1
    eps = 2.0**-man_bits
    return {"max": (2 - eps) * 2.0**bias, "normal": 2.0 ** (1 - bias),
            "subnormal": 2.0 ** (1 - bias) * eps, "eps": eps}  # fmt: skip


def draw_float_formats(cell_width: float = 0.32) -> Figure:
    """One row per format: sign, exponent and mantissa bits as boxes, and the range beside them.

    Rows are right-aligned at the binary point's side so that the exponent fields line
    up: bf16 is visibly fp32 with the low 16 mantissa bits cut off, and tf32 sits between.
    """
    fig, ax = plt.subplots(figsize=(13, 0.62 * len(FORMATS) + 1.2))
    widest = 1 + max(e for e, _, _ in FORMATS.values())
    for row, (name, (exp_bits, man_bits, dtype)) in enumerate(FORMATS.items()):
        y = -row
        x = (widest - 1 - exp_bits) * cell_width  # align the sign bits left of the exponents
        fields = (("sign", 1), ("exponent", exp_bits), ("mantissa", man_bits))
        for field, bits in fields:
            for _ in range(bits):
                ax.add_patch(Rectangle((x, y - 0.35), cell_width, 0.7,
                                       facecolor=_FIELD_COLORS[field], edgecolor="white", lw=0.8))  # fmt: skip
                x += cell_width
        ax.text(-0.2, y, f"{name}\n{1 + exp_bits + man_bits} bits", ha="right", va="center",
                fontsize=9)  # fmt: skip
        r = format_range(exp_bits, man_bits, dtype)
        ax.text(x + 0.3, y, f"1/{exp_bits}/{man_bits}   max {r['max']:.4g}   min normal "
                f"{r['normal']:.3g}   min subnormal {r['subnormal']:.3g}   eps 2^{-man_bits}",
                va="center", fontsize=8.5, family="monospace")  # fmt: skip
    for field, color in _FIELD_COLORS.items():
        ax.add_patch(Rectangle((0, 0), 0, 0, facecolor=color, label=field))
    ax.legend(loc="upper right", ncol=3, fontsize=8, frameon=False, bbox_to_anchor=(1.0, 1.12))
    ax.set_xlim(-2.2, (widest + 23) * cell_width + 9.5)
    ax.set_ylim(-len(FORMATS) + 0.4, 0.6)
    ax.axis("off")
    ax.set_title(
        "sign / exponent / mantissa bits of the training formats, and their ranges "
        "(torch.finfo; tf32 from the IEEE formula)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
