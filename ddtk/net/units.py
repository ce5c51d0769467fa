"""Rates, sizes and durations written the way network people write them.

Vendors quote links in bits per second (``"400Gbit"``, ``"200 Gb/s"``), GPU
interconnects in bytes per second (``"450GB/s"``), and latencies in ``us`` or
``ns``. Everything in :mod:`ddtk.net` is stored in SI base units: **bytes per
second** and **seconds**. These helpers turn text into those units, with a clear
error for anything else, and back into short text for tables.

>>> parse_rate("400Gbit") == 50e9
True
>>> parse_rate("450GB/s") == 450e9
True
>>> parse_time("2.5us")
2.5e-06
"""

from __future__ import annotations

import re

_PREFIX = {"": 0, "k": 3, "K": 3, "m": 6, "M": 6, "g": 9, "G": 9, "t": 12, "T": 12}  # powers of ten
_RATE = re.compile(
    r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMgGtT]?)\s*"
    r"(bit|bits|bps|b/s|Bps|B/s|byte/s|bytes/s)\s*$"
)
_TIME_UNITS = {"s": 0, "ms": -3, "us": -6, "µs": -6, "ns": -9}  # powers of ten
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us|µs|ns)\s*$")


def _scaled(number: str, exponent: int) -> float:
    """``number`` times ten to ``exponent``, rounded once (``5us`` is exactly ``5e-6``)."""
    return (
        float(f"{float(number)!r}e{exponent}")
        if "e" not in number.lower()
        else float(number) * 10.0**exponent
    )


def parse_rate(value: float | int | str) -> float:
    """Bytes per second from a number (already bytes/s) or text such as ``"10Gbit"``, ``"1.25GB/s"``.

    ``bit``, ``bits``, ``bps`` and ``b/s`` are bits; ``B/s``, ``Bps`` and ``bytes/s`` are bytes.
    Prefixes are decimal (k = 1e3, G = 1e9), as on every datasheet.
    """
    if isinstance(value, bool):
        raise TypeError(f"a rate must be a number of bytes/s or text like '10Gbit', got {value!r}")
    if isinstance(value, (int, float)):
        rate = float(value)
    elif isinstance(value, str):
        m = _RATE.match(value)
        if not m:
            raise ValueError(
                f"cannot read the rate {value!r}: write a number with a unit, such as "
                "'10Gbit', '100 Gb/s' (bits) or '1.25GB/s', '450 GB/s' (bytes)"
            )
        number, prefix, unit = m.groups()
        bits = unit in ("bit", "bits", "bps", "b/s")
        rate = _scaled(number, _PREFIX[prefix]) / (8.0 if bits else 1.0)
    else:
        raise TypeError(f"a rate must be a number of bytes/s or text like '10Gbit', got {value!r}")
    if not rate > 0 or rate == float("inf"):
        raise ValueError(f"a rate must be positive and finite, got {value!r}")
    return rate


def parse_time(value: float | int | str) -> float:
    """Seconds from a number (already seconds) or text such as ``"5us"``, ``"1.5 ms"``, ``"800ns"``."""
    if isinstance(value, bool):
        raise TypeError(f"a duration must be seconds or text like '5us', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        m = _TIME.match(value)
        if not m:
            raise ValueError(
                f"cannot read the duration {value!r}: write a number with a unit: s, ms, us or ns"
            )
        seconds = _scaled(m.group(1), _TIME_UNITS[m.group(2)])
    else:
        raise TypeError(f"a duration must be seconds or text like '5us', got {value!r}")
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"a duration must be >= 0 and finite, got {value!r}")
    return seconds


def format_rate(bytes_per_s: float) -> str:
    """``"12.5 GB/s"``: bytes per second, three significant figures."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"


def format_time(seconds: float) -> str:
    """``"2.5 µs"``, ``"13.1 ms"``: three significant figures in the unit that fits."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"
