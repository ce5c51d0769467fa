"""What a lecture probe sends back: the learner's return value as plain data.

A probe's answer travels as ``torch.save`` data read back with ``weights_only=True``,
which refuses numpy scalars and other objects. An answer that returns such values
(``np.int64(3)``, ``np.True_``, a set) is still an answer, so :func:`plain` turns them
into Python numbers, lists and dicts; anything else becomes its ``repr``, which the
check reports as what came back instead of failing to read it.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as bools, ints, floats, strings, None, lists, tuples and dicts only."""
    if depth > 20:
        return "(nested too deeply)"
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return bool(value) if type(value).__name__ in ("bool_", "bool") else int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if type(value).__name__ in ("bool_", "bool"):  # numpy's bool is no Integral
        return bool(value)
    if isinstance(value, Mapping):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(plain(v, depth + 1) for v in value)
    if isinstance(value, list | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [plain(v, depth + 1) for v in items]
    return repr(value)[:200]


def outcome(call: Any) -> Any:
    """What ``call()`` returns as :func:`plain` data, or ``"ValueError"`` when it raises one
    (the exercises raise it for an impossible request)."""
    try:
        return plain(call())
    except ValueError:
        return "ValueError"


__all__ = ["outcome", "plain"]
