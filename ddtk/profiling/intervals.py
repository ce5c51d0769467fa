"""Arithmetic on sets of time intervals: the one tool a trace breakdown needs.

A set of intervals is a sorted list of disjoint ``(start, end)`` pairs. Trace events
nest and overlap (an operator inside a module inside a step; a collective on gloo's
thread while autograd runs on the main thread), so every question of the form "how
long was the rank doing X and not Y" becomes union, intersection and difference.

>>> a = union([(0, 4), (2, 6), (8, 9)])
>>> a
[(0, 6), (8, 9)]
>>> intersect(a, [(5, 8.5)])
[(5, 6), (8, 8.5)]
>>> subtract(a, [(1, 2)])
[(0, 1), (2, 6), (8, 9)]
>>> length(a)
7
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Span", "clip", "intersect", "length", "subtract", "union"]

Span = tuple[float, float]


def union(spans: Iterable[Span]) -> list[Span]:
    """The disjoint, sorted union of ``spans`` (empty and reversed spans are dropped)."""
    merged: list[Span] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def intersect(a: list[Span], b: list[Span]) -> list[Span]:
    """Where both disjoint sorted sets are covered (a two-pointer sweep, linear time)."""
    out: list[Span] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Span], b: list[Span]) -> list[Span]:
    """The part of ``a`` not covered by ``b`` (both disjoint and sorted)."""
    out: list[Span] = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k, cur = j, start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def clip(spans: list[Span], lo: float, hi: float) -> list[Span]:
    """``spans`` cut to the window ``[lo, hi]``."""
    return intersect(spans, [(lo, hi)]) if hi > lo else []


def length(spans: Iterable[Span]) -> float:
    """Total covered time of a disjoint set."""
    return sum(end - start for start, end in spans)
