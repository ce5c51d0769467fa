"""ddtk.monitoring.exporter: a rank's /metrics page, its file_sd entry, its shutdown, its inputs.

Each test starts real exporters (prometheus_client's HTTP server in a thread) on free ports
and reads the page the way Prometheus does, parsed with ``prometheus_client.parser``.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import nothing_listens_on

from ddtk.monitoring.exporter import PARTS, TrainingMetrics, shares_from_trace


def _families(metrics: TrainingMetrics) -> dict:
    """The page as Prometheus reads it, fetched over HTTP: {family name: family}."""
    with urllib.request.urlopen(metrics.url, timeout=5) as response:
        text = response.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(family, suffix: str = "", **labels: str) -> float:
    [sample] = [s for s in family.samples
                if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())]  # fmt: skip
    return sample.value


def test_the_page_has_every_metric_with_its_type_unit_and_labels(tmp_path: Path) -> None:
    with TrainingMetrics(1, 4, targets_dir=tmp_path) as m:
        m.step(0.004, 32, loss=2.5)
        m.step(0.2, 32, loss=1.5)
        m.shares({"data": 0.1, "compute": 0.6, "communication": 0.3})
        m.checkpoint_interval(600.0)
        m.checkpoint(when=1_700_000_000.0)
        m.restart()
        fam = _families(m)
    types = {name: fam[name].type for name in fam if name.startswith("ddtk_")}
    assert types == {
        "ddtk_step_seconds": "histogram", "ddtk_samples": "counter", "ddtk_steps": "counter",
        "ddtk_loss": "gauge", "ddtk_last_step_timestamp_seconds": "gauge", "ddtk_restarts": "counter",
        "ddtk_step_share_ratio": "gauge", "ddtk_last_checkpoint_timestamp_seconds": "gauge",
        "ddtk_checkpoint_interval_seconds": "gauge",
    }  # fmt: skip
    step = fam["ddtk_step_seconds"]
    assert _value(step, "_count") == 2 and _value(step, "_sum") == pytest.approx(0.204)
    assert _value(step, "_bucket", le="0.005") == 1 and _value(step, "_bucket", le="0.25") == 2
    assert _value(step, "_bucket", le="60.0") == 2 and _value(step, "_bucket", le="0.001") == 0
    assert _value(fam["ddtk_samples"], "_total") == 64 and _value(fam["ddtk_steps"], "_total") == 2
    assert _value(fam["ddtk_loss"]) == 1.5 and _value(fam["ddtk_restarts"], "_total") == 1
    assert _value(fam["ddtk_step_share_ratio"], part="communication") == 0.3
    assert _value(fam["ddtk_last_checkpoint_timestamp_seconds"]) == 1_700_000_000.0
    assert _value(fam["ddtk_checkpoint_interval_seconds"]) == 600.0
    for family in (fam[n] for n in types):
        for sample in family.samples:
            assert sample.labels["rank"] == "1" and sample.labels["world_size"] == "4", sample


def test_the_rank_registers_for_file_sd_and_leaves_nothing_behind(tmp_path: Path) -> None:
    m = TrainingMetrics(0, 2, targets_dir=tmp_path / "targets")
    entry = json.loads((tmp_path / "targets" / "rank0.json").read_text())
    assert entry == [{"targets": [f"127.0.0.1:{m.port}"], "labels": {}}]
    assert sorted(p.name for p in (tmp_path / "targets").iterdir()) == ["rank0.json"]  # no temp file
    port = m.port
    assert not nothing_listens_on(port)
    m.close()
    m.close()  # twice is fine
    assert nothing_listens_on(port) and not (tmp_path / "targets" / "rank0.json").exists()


def test_a_checkpoint_age_starts_when_the_interval_is_declared() -> None:
    with TrainingMetrics(0, 1) as m:
        assert "ddtk_checkpoint_interval_seconds{" not in m.exposition()  # undeclared: no series
        m.checkpoint_interval(120.0)
        first = _value(_families(m)["ddtk_last_checkpoint_timestamp_seconds"])
        assert first > 1.6e9  # the start counts as the reference until the first commit


def test_no_loss_series_before_the_first_loss() -> None:
    with TrainingMetrics(0, 1) as m:
        m.step(0.1, 8)  # a step without a loss
        assert "ddtk_loss{" not in m.exposition()  # no series rather than a loss of 0
        m.step(0.1, 8, loss=0.75)
        assert _value(_families(m)["ddtk_loss"]) == 0.75


def test_restarts_default_to_torchruns_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    with TrainingMetrics(0, 1) as m:
        assert _value(_families(m)["ddtk_restarts"], "_total") == 3


def test_from_env_is_off_unless_asked_and_follows_local_rank(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:  # fmt: skip
    for var in ("DDTK_METRICS_PORT", "DDTK_METRICS_DIR", "DDTK_METRICS_ADDR", "DDTK_TENSORBOARD_DIR"):
        monkeypatch.delenv(var, raising=False)
    assert TrainingMetrics.from_env(0, 2) is None
    monkeypatch.setenv("DDTK_METRICS_DIR", str(tmp_path))
    with TrainingMetrics.from_env(1, 2) as m:
        assert m.addr == "127.0.0.1" and (tmp_path / "rank1.json").exists()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
    monkeypatch.setenv("DDTK_METRICS_PORT", str(base))
    monkeypatch.setenv("DDTK_METRICS_ADDR", "127.0.0.1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with TrainingMetrics.from_env(5, 8) as m:
        assert m.port == base + 1
    monkeypatch.setenv("DDTK_METRICS_PORT", "nine")
    with pytest.raises(ValueError, match="DDTK_METRICS_PORT must be a port number, got 'nine'"):
        TrainingMetrics.from_env(0, 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rank": 2, "world_size": 2}, "rank 2 is not in a world of 2 ranks"),
        ({"rank": -1, "world_size": 2}, "rank must be an integer >= 0"),
        ({"rank": 0, "world_size": 1, "port": 70000}, "port must be at most 65535"),
    ],
)
def test_bad_construction_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainingMetrics(**kwargs)


def test_bad_values_are_refused_by_name() -> None:
    with TrainingMetrics(0, 1) as m:
        with pytest.raises(ValueError, match="seconds must be a finite number >= 0"):
            m.step(float("nan"), 8)
        with pytest.raises(ValueError, match="samples must be an integer >= 0"):
            m.step(0.1, 8.5)
        with pytest.raises(ValueError, match="unknown part 'network'"):
            m.shares({"network": 0.2})
        with pytest.raises(ValueError, match="checkpoint interval must be a finite number"):
            m.checkpoint_interval(0)


def test_a_taken_port_is_named(tmp_path: Path) -> None:
    with TrainingMetrics(0, 1) as first, pytest.raises(OSError, match=f"127.0.0.1:{first.port}"):
        TrainingMetrics(0, 1, port=first.port)


def test_shares_come_from_a_real_profiler_trace(tmp_path: Path) -> None:
    import torch

    from ddtk.profiling import StepProfiler, region

    layer = torch.nn.Linear(64, 64)
    with StepProfiler(tmp_path, wait=0, warmup=1, active=2, rank=0, record_shapes=False) as prof:
        for _ in range(prof.steps_needed):
            with region("data"):
                x = torch.randn(128, 64)
            layer(x).square().mean().backward()
            prof.step()
    shares = shares_from_trace(prof.written[0])
    assert set(shares) == set(PARTS) and sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
    assert shares["data"] > 0 and shares["compute"] > 0 and shares["communication"] == 0
    with TrainingMetrics(0, 1) as m:
        m.shares_from_trace(prof.written[0])
        assert _value(_families(m)["ddtk_step_share_ratio"], part="compute") == pytest.approx(shares["compute"])


def test_run_jobs_metrics_arguments_are_checked_before_any_rank_starts(tmp_path: Path) -> None:
    from ddtk.monitoring.watch import free_ports
    from ddtk.profiling.jobs import run_job

    with pytest.raises(ValueError, match="metrics_port must be a port from 1 to 65534"):
        run_job("baseline", 2, metrics_port=65535)
    with pytest.raises(ValueError, match="tensorboard_dir is written by each rank's exporter"):
        run_job("baseline", 2, tensorboard_dir=tmp_path)
    base = free_ports(3)
    for port in range(base, base + 3):
        assert nothing_listens_on(port)
    with pytest.raises(ValueError, match="count must be an integer >= 1"):
        free_ports(0)
