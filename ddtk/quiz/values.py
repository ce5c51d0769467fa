"""Exact numbers in quiz files: points, answers, tolerances and pass marks as Fractions.

>>> parse_fraction("7/4"), parse_pass_mark("80%")
(Fraction(7, 4), Fraction(4, 5))
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

__all__ = ["parse_fraction", "parse_pass_mark"]


def parse_fraction(value: Any) -> Fraction:
    """Read an exact number: int, float (by its shortest repr), ``"7/4"``, ``"1.75e0"``.

    >>> parse_fraction(" 7/4 "), parse_fraction(0.8), parse_fraction("1.75e0")
    (Fraction(7, 4), Fraction(4, 5), Fraction(7, 4))
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, int | Fraction):
        return Fraction(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"expected a finite number, got {value!r}")
        return Fraction(repr(value))
    if isinstance(value, str):
        text = value.strip()
        try:
            return Fraction(text)
        except (ValueError, ZeroDivisionError):
            pass
        raise ValueError(f"expected a unit-free number such as 1.75 or 7/4, got {value!r}")
    raise ValueError(f"expected a number, got {type(value).__name__} {value!r}")


def parse_pass_mark(value: Any) -> Fraction:
    """Read a pass mark: ``"4/5"``, ``0.8`` or ``"80%"``; it must lie in (0, 1].

    >>> parse_pass_mark("80%"), parse_pass_mark(0.8), parse_pass_mark("4/5")
    (Fraction(4, 5), Fraction(4, 5), Fraction(4, 5))
    """
    if isinstance(value, str) and value.strip().endswith("%"):
        mark = parse_fraction(value.strip()[:-1]) / 100
    else:
        mark = parse_fraction(value)
    if not 0 < mark <= 1:
        raise ValueError(f"must be a fraction in (0, 1], got {value!r}")
    return mark
