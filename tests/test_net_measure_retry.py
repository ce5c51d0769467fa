"""timed_together drops a sample that a late rank spoiled and widens its margin, on every rank alike."""

from __future__ import annotations

import pytest

import ddtk
from ddtk.net.measure import timed_together

pytestmark = pytest.mark.distributed


def _zero_margin(ctx, max_margin_s):
    try:
        return timed_together(ctx, lambda: None, reps=2, margin_s=0.0, max_margin_s=max_margin_s)
    except RuntimeError as exc:
        return str(exc)


def test_a_late_start_is_retried_with_a_wider_margin_and_raises_only_past_the_cap() -> None:
    # margin 0: rank 0 names "now" as the start, so some rank is always late at first
    ok = ddtk.launch(_zero_margin, 2, args=(0.64,), validate=False)
    assert all(isinstance(r, list) and len(r) == 2 for r in ok), ok
    capped = ddtk.launch(_zero_margin, 2, args=(0.0,), validate=False)
    assert all(isinstance(r, str) and "reached the agreed start late" in r for r in capped), capped
