"""Lazy exports for subpackages: names load their module on first use (PEP 562).

A subpackage such as :mod:`ddtk.parallel` offers ``from ddtk.parallel import
DataParallel`` without importing torch and every strategy when only the package is
imported: its ``__init__`` lists each public name with the submodule that defines
it, and :func:`lazy_exports` turns that table into the module's ``__getattr__``,
``__dir__`` and ``__all__``.

>>> getattr_, dir_, all_ = lazy_exports("ddtk.net", {"parse_rate": "units"})
>>> all_, getattr_("parse_rate").__name__
(['parse_rate'], 'parse_rate')
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``, whose names ``table`` maps to submodules."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *table})

    return __getattr__, __dir__, sorted(table)
