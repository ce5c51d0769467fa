"""The log formats that :mod:`ddtk.recovery.phases` parses, pinned against the installed sources.

No public API gives the times at which torchrun's agent, Horovod's driver or Ray Train's
controller acted on a failure, so lecture 06 reads them from the launchers' logs. These
tests read the installed torch and Ray sources (no process is started): an upgrade that
changes a message, a file name or the JSON fields fails here, not silently in the lecture.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest

from ddtk.recovery import phases


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} is not installed"
    return Path(spec.origin).read_text()


def test_torchrun_agent_logs_failed_exitcode() -> None:
    src = _source("torch.distributed.elastic.multiprocessing.api")
    assert "failed (exitcode: " in src
    line = "E1127 13:56:38.985000 8858 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1"
    assert phases.torchrun_failure_time(line, 2026) is not None


def test_horovod_error_line_parses() -> None:
    assert (
        phases.horovod_error_time("[2026-11-27 13:56:38.985123: E /horovod/common/x.cc:1] lost")
        is not None
    )


def test_ray_controller_log_format_is_what_phases_parses(tmp_path: Path) -> None:
    pytest.importorskip("ray.train.v2")
    assert "ray-train-sys-controller-" in _source("ray.train.v2._internal.logging.logging")
    assert '"logs", "train"' in _source("ray.train.v2._internal.logging.logging")
    assert "[FailurePolicy] {decision.value}" in _source(
        "ray.train.v2._internal.execution.failure_handling.default"
    )
    from ray.train.v2._internal.execution.failure_handling import FailureDecision

    assert f"[FailurePolicy] {FailureDecision.RETRY.value}" == phases.RAY_RETRY_PREFIX
    assert phases.RAY_STARTED_PREFIX in _source(
        "ray.train.v2._internal.execution.worker_group.worker_group"
    )
    # the controller's JSON records carry "asctime" and "message" in the format phases reads
    from ray._common.formatters import JSONFormatter

    record = logging.LogRecord(
        "ray.train", logging.INFO, __file__, 1, phases.RAY_RETRY_PREFIX + "\n x", None, None
    )
    fields = json.loads(JSONFormatter().format(record))
    log = tmp_path / "logs" / "train" / "ray-train-sys-controller-1.log"
    log.parent.mkdir(parents=True)
    log.write_text(json.dumps(fields) + "\n")
    events = phases.ray_controller_events(tmp_path, after=0.0)
    assert events["retry"] is not None and events["started"] is None


def test_ray_init_context_names_the_session_dir() -> None:
    pytest.importorskip("ray")
    assert '"session_dir": self._session_dir' in _source("ray._private.node")
