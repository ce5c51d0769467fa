"""ddtk.monitoring.prometheus: the real Prometheus server, started, queried and stopped.

One server serves the module's query tests; the lifecycle test starts its own, and checks
that the process, its port and its folder are gone after ``stop``. (Scraping a real job is
tests/test_monitoring_live.py's part: Prometheus's discovery delivers targets about 5 s
after start.) Tests that need the binary skip without it, or fail where ``make test`` sets
``DDTK_REQUIRE=prometheus``.
"""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest
from support import nothing_listens_on, require_or_skip

from ddtk.monitoring.prometheus import (
    PrometheusError,
    PrometheusNotInstalled,
    PrometheusServer,
    ScrapeJob,
    find_binary,
)


def _need_prometheus() -> None:
    try:
        find_binary("prometheus")
    except PrometheusNotInstalled as exc:
        require_or_skip("prometheus", str(exc))


@pytest.fixture(scope="module")
def served() -> PrometheusServer:
    """One server for the query tests of this module (its target need never be up)."""
    _need_prometheus()
    with PrometheusServer([ScrapeJob("unit", ["127.0.0.1:9"])]) as prom:
        yield prom


def _free(port: int) -> bool:
    """Nothing listens on ``port`` and a new server could bind it (with SO_REUSEADDR, as servers
    do: the closed connections of the queries may still sit in TIME_WAIT)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        pass
    return nothing_listens_on(port)


def test_start_and_stop_leave_nothing_behind(tmp_path: Path) -> None:
    _need_prometheus()
    prom = PrometheusServer([ScrapeJob("x", ["127.0.0.1:9"])], scrape_interval=0.5)
    prom.start()
    pid, port, workdir = prom._process.pid, prom.port, prom.workdir
    assert psutil.pid_exists(pid) and not _free(port)
    assert prom.config()["global"]["scrape_interval"] == "500ms"
    assert prom.query("1 + 1")[0].value == 2.0  # a scalar
    prom.stop()
    prom.stop()  # twice is fine
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert _free(port) and not workdir.exists()
    with pytest.raises(PrometheusError, match="not running"):
        _ = prom.url


def test_a_missing_binary_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DDTK_PROMETHEUS", str(tmp_path / "nowhere" / "prometheus"))
    with pytest.raises(PrometheusNotInstalled, match="nowhere/prometheus is not an executable file"):
        PrometheusServer([ScrapeJob("x", ["127.0.0.1:9"])]).start()
    with pytest.raises(PrometheusNotInstalled, match="nowhere/promtool"):
        find_binary("promtool")


def test_queries_and_their_errors(served: PrometheusServer) -> None:
    prom = served
    [sample] = prom.query('vector(3) * 2')
    assert sample.value == 6.0 and sample.labels == {}
    [series] = prom.query_range("vector(1)", 1_700_000_000, 1_700_000_004, step=2.0)
    assert [t for t, _ in series.points] == [1_700_000_000, 1_700_000_002, 1_700_000_004]
    with pytest.raises(PrometheusError, match=r"rate\(ddtk_steps_total\): bad_data"):
        prom.query("rate(ddtk_steps_total)")
    assert prom.alerts() == []  # no rule files: no alerts


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ScrapeJob("", ["127.0.0.1:1"]), "needs a name"),
        (lambda: ScrapeJob("x"), "neither targets nor a file_sd file"),
        (lambda: ScrapeJob("x", ["localhost"]), "'localhost' of job 'x' is not host:port"),
        (lambda: PrometheusServer([]), "at least one ScrapeJob"),
        (lambda: PrometheusServer([ScrapeJob("x", ["a:1"]), ScrapeJob("x", ["b:1"])]), "must be unique"),
        (lambda: PrometheusServer([ScrapeJob("x", ["a:1"])], scrape_interval=0), "must be positive"),
    ],
)
def test_bad_input_is_refused(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_missing_rule_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no\.rules"):
        PrometheusServer([ScrapeJob("x", ["a:1"])], rule_files=[tmp_path / "no.rules"])
