"""The messages lecture 7's troubleshooting section quotes, pinned so that a PyTorch upgrade shows.

- ``torch.profiler.profile`` with a schedule whose ``prof.step()`` is never called
  records nothing and refuses ``key_averages()`` with an AssertionError;
- ``torch._logging.set_logs`` (the in-process form of ``TORCH_LOGS``; its module is
  private, so its behaviour is pinned here) makes Dynamo log why it recompiled.
"""

from __future__ import annotations

import io
import logging

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def test_profiler_without_step_writes_nothing_and_refuses_key_averages(tmp_path) -> None:
    out = tmp_path / "trace"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=tensorboard_trace_handler(str(out))) as prof:  # fmt: skip
        for _ in range(5):
            torch.randn(16, 16).sum()
    assert not out.exists() or not any(out.iterdir())
    with pytest.raises(
        AssertionError, match="Profiler must be initialized before getting key averages"
    ):
        prof.key_averages()


def test_set_logs_recompiles_names_the_failed_guard() -> None:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(handler)
    torch._logging.set_logs(recompiles=True)
    try:

        @torch.compile(backend="eager")
        def doubled(x):
            return x * 2

        for n in (4, 8, 16):
            doubled(torch.randn(n))
    finally:
        torch._logging.set_logs()
        logger.removeHandler(handler)
        torch._dynamo.reset()
    text = buf.getvalue()
    assert "Recompiling function doubled" in text, text
    assert "size mismatch at index 0. expected 4, actual 8" in text, text
    assert text.count("Recompiling function") == 1, "after one recompile the size is dynamic"
