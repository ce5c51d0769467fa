"""ddtk.frameworks.deepspeed_ops: DeepSpeed's CPU shared-memory op is built ahead of use,
with the ninja the ranks will use.

``make test`` runs the real build in the background (lecture 03's DeepSpeed job then
loads it); here DeepSpeed's ``build_shm_op`` is replaced, so the test checks what the
module does around it without waiting on that build's lock.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")


def test_the_build_runs_with_this_interpreters_bin_first_on_path(monkeypatch) -> None:
    import importlib

    from ddtk.frameworks import deepspeed_ops

    ds_torch = importlib.import_module("deepspeed.comm.torch")  # not deepspeed.comm's `torch`

    seen = {}

    def fake_build():
        seen["path"] = os.environ["PATH"]
        return types.SimpleNamespace(__name__="deepspeed_shm_comm", __file__="/cache/op.so")

    monkeypatch.setattr(ds_torch, "build_shm_op", fake_build)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    said = deepspeed_ops.build()
    assert said.startswith("deepspeed_shm_comm ready in") and "/cache/op.so" in said
    assert seen["path"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    monkeypatch.setattr(ds_torch, "build_shm_op", lambda: None)
    assert "needs no shared-memory op" in deepspeed_ops.build()
