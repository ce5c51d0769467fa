"""Helpers shared by test modules (importable by name: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os

import pytest


def require_or_skip(name: str, reason: str) -> None:
    """Skip for ``reason``, unless DDTK_REQUIRE (comma-separated) names ``name``: then fail.

    ``make test`` sets DDTK_REQUIRE=horovod so CI can never pass by skipping them.
    """
    required = {s.strip() for s in os.environ.get("DDTK_REQUIRE", "").split(",") if s.strip()}
    if name in required:
        pytest.fail(f"{name} is required here (DDTK_REQUIRE={os.environ['DDTK_REQUIRE']}) but {reason}")
    pytest.skip(reason)
