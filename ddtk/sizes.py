"""Byte sizes as people write them: ``"64M"`` in, ``"64 MiB"`` out (powers of 1024).

Command-line options, tables and plot axes of every part of ddtk read and show
sizes the same way; this module has no dependency, so the lightest module can use it.

>>> format_bytes(parse_size("64M"))
'64 MiB'
"""

from __future__ import annotations

__all__ = ["format_bytes", "parse_size"]


def parse_size(text: str) -> int:
    """``"4K"``, ``"64M"``, ``"1G"`` or a plain integer, in bytes (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        raise ValueError(
            f"cannot read size {text!r}; use bytes or a suffix K, M, G (e.g. 4K, 64M)"
        ) from None


def format_bytes(n: float) -> str:
    """1024 -> '1 KiB', 67108864 -> '64 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if float(n).is_integer() else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} GiB"
