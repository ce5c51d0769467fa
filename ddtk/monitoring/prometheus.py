"""A real Prometheus server for a notebook or a test: generated config, free port, HTTP API.

On a cluster Prometheus runs as a service (kube-prometheus-stack, or a systemd unit on a
Slurm head node) and finds its targets through Kubernetes service discovery. Here
:class:`PrometheusServer` starts the same binary (Debian's ``prometheus`` package; any
``prometheus`` on ``PATH``, or ``$DDTK_PROMETHEUS``) as a child process on a free local
port, with a configuration written from :class:`ScrapeJob` objects: fixed
``host:port`` targets (the ranks of a ``ddtk.launch`` or ``torchrun`` job) or a
``file_sd`` file (the one a Ray head writes for its nodes' metrics agents). It reads
the server back through the HTTP API (``/api/v1/query``, ``query_range``, ``targets``,
``alerts``), the API Grafana itself uses, and stops the server on :meth:`stop`, at exit,
or when the Python process that started it dies (``PR_SET_PDEATHSIG``).

Usage::

    with PrometheusServer([ScrapeJob("train", ["127.0.0.1:9101", "127.0.0.1:9102"])]) as prom:
        prom.wait_for_targets(2)
        prom.query('rate(ddtk_samples_total[30s])')

A server is ready in well under a second and answers PromQL at once; its targets appear
about 5 s after the start (Prometheus hands discovered targets to its scrapers on a
5-second tick):

>>> with PrometheusServer([ScrapeJob("nobody", ["127.0.0.1:9"])]) as prom:
...     [sample] = prom.query("vector(6) * 7")
...     targets_now = prom.targets()
>>> sample.value, targets_now
(42.0, [])
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ddtk.frameworks.launchers import free_port

__all__ = [
    "Alert",
    "PrometheusError",
    "PrometheusNotInstalled",
    "PrometheusServer",
    "Sample",
    "ScrapeJob",
    "Series",
    "find_binary",
]

INSTALL_HINT = (
    "install it with `sudo apt-get install --no-install-recommends prometheus` (Debian, Ubuntu; "
    "it brings promtool too), or download it from https://prometheus.io/download/ and set "
    "DDTK_PROMETHEUS=/path/to/prometheus"
)


class PrometheusError(RuntimeError):
    """The server failed to start, or a query came back with an error (the message says which)."""


class PrometheusNotInstalled(PrometheusError):
    """No ``prometheus`` (or ``promtool``) binary on this machine."""


def find_binary(name: str = "prometheus") -> str:
    """The path of ``prometheus`` or ``promtool``: from ``$DDTK_PROMETHEUS``'s folder when it
    is set (and nowhere else: a path set on purpose that is wrong is an error, not a reason to
    run another binary), else from PATH."""
    override = os.environ.get("DDTK_PROMETHEUS")
    if override:
        path = Path(override).with_name(name)
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        raise PrometheusNotInstalled(
            f"DDTK_PROMETHEUS={override}, but {path} is not an executable file: point it at "
            f"the prometheus binary of a Prometheus release (promtool beside it), or unset it"
        )
    found = shutil.which(name)
    if found:
        return found
    raise PrometheusNotInstalled(f"`{name}` was not found on PATH: {INSTALL_HINT}")


@dataclass(frozen=True)
class ScrapeJob:
    """One ``scrape_configs`` entry: a job name and its targets, or a ``file_sd`` file of them.

    ``labels`` are added to every series of the job (``cluster="laptop"``).
    """

    name: str
    targets: Sequence[str] = ()
    file_sd: str | Path | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics_path: str = "/metrics"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a scrape job needs a name (it becomes the `job` label)")
        if not self.targets and self.file_sd is None:
            raise ValueError(f"scrape job {self.name!r} has neither targets nor a file_sd file")
        for target in self.targets:
            host, _, port = target.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"scrape target {target!r} of job {self.name!r} is not host:port")

    def config(self) -> dict[str, Any]:
        """The job as Prometheus's YAML wants it."""
        job: dict[str, Any] = {"job_name": self.name, "metrics_path": self.metrics_path}
        if self.targets:
            job["static_configs"] = [{"targets": list(self.targets), "labels": dict(self.labels)}]
        if self.file_sd is not None:
            job["file_sd_configs"] = [{"files": [str(self.file_sd)], "refresh_interval": "1s"}]
            if self.labels:
                job["relabel_configs"] = [
                    {"target_label": key, "replacement": value} for key, value in self.labels.items()
                ]
        return job


@dataclass(frozen=True)
class Sample:
    """One series of an instant query: its labels and its value."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    """One series of a range query: its labels and its ``(unix time, value)`` points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


@dataclass(frozen=True)
class Alert:
    """One alert the server's rules produce now: ``pending`` (condition true, ``for`` not yet over) or ``firing``."""

    name: str
    state: str
    labels: dict[str, str]
    annotations: dict[str, str]
    active_at: str


def _seconds(value: float) -> str:
    """A Prometheus duration: ``1s``, ``250ms``."""
    if value <= 0:
        raise ValueError(f"an interval must be positive seconds, got {value}")
    return f"{round(value * 1000)}ms"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM Prometheus if the process that started it dies."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class PrometheusServer:
    """Start ``prometheus`` with a generated config; query it; stop it (context manager).

    ``scrape_interval`` and ``evaluation_interval`` default to 1 s, so a short run has
    series to query (a cluster uses 15–30 s). ``rule_files`` are alerting or recording
    rule files (see :mod:`ddtk.monitoring.alerts`). ``workdir`` keeps the config and the
    TSDB (a temporary folder, removed on stop, when not given).
    """

    def __init__(
        self,
        jobs: Iterable[ScrapeJob],
        *,
        rule_files: Iterable[str | Path] = (),
        scrape_interval: float = 1.0,
        evaluation_interval: float = 1.0,
        workdir: str | Path | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        self.jobs = list(jobs)
        if not self.jobs:
            raise ValueError("PrometheusServer needs at least one ScrapeJob")
        names = [job.name for job in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"scrape job names must be unique, got {names}")
        self.rule_files = [Path(p).resolve() for p in rule_files]
        for path in self.rule_files:
            if not path.is_file():
                raise FileNotFoundError(f"rule file {path} does not exist")
        self.scrape_interval = _seconds(scrape_interval)
        self.evaluation_interval = _seconds(evaluation_interval)
        self.startup_timeout = startup_timeout
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="ddtk-prometheus-"))
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the web UI and the HTTP API."""
        if not self.port:
            raise PrometheusError("the server is not running: call start() or use `with`")
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        """The prometheus.yml this server runs with."""
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [job.config() for job in self.jobs],
        }

    def start(self) -> PrometheusServer:
        """Write the config, start the server on a free port and wait until it is ready."""
        binary = find_binary("prometheus")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        for _attempt in range(3):  # a free port can be taken between the check and the bind
            self.port = free_port()
            log = (self.workdir / "prometheus.log").open("wb")
            self._process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1d",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
            log.close()
            if self._wait_ready():
                atexit.register(self.stop)
                return self
            if "address already in use" not in self.log():
                break
        self._kill()
        raise PrometheusError(f"prometheus did not start; its log:\n{self.log()[-2000:]}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def log(self) -> str:
        """What the server wrote to its log (warnings and errors only)."""
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        """Stop the server and, when the folder was temporary, remove it. Safe to call twice."""
        self._kill()
        self.port = 0
        atexit.unregister(self.stop)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ the HTTP API

    def api(self, path: str, **params: Any) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; a PromQL error names the query."""
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:  # 400/422: a bad query, with Prometheus's reason
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            what = params.get("query", path)
            raise PrometheusError(f"{what}: {body.get('errorType', 'error')}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant query: every series of ``expr`` now (or at unix time ``at``)."""
        data = self.api("query", query=expr, time=at)
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        return [Sample(r["metric"], float(r["value"][1])) for r in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[Series]:
        """A range query: every series of ``expr`` between unix times ``start`` and ``end``."""
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        return [
            Series(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]
        ]

    def targets(self) -> list[dict[str, Any]]:
        """The active targets, each with its ``labels``, ``health`` (up, down, unknown) and ``lastError``."""
        return self.api("targets", state="active")["activeTargets"]

    def alerts(self) -> list[Alert]:
        """The alerts pending or firing now."""
        return [
            Alert(a["labels"].get("alertname", ""), a["state"], a["labels"], a.get("annotations", {}), a.get("activeAt", ""))
            for a in self.api("alerts")["alerts"]
        ]

    def wait_for_targets(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Wait until ``count`` targets are up (scraped successfully); say which are not, on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            targets = self.targets()
            if sum(t["health"] == "up" for t in targets) >= count:
                return targets
            if time.monotonic() > deadline:
                states = [f"{t['scrapeUrl']}: {t['health']} {t.get('lastError', '')}".strip() for t in targets]
                raise PrometheusError(f"{count} targets not up after {timeout:.0f} s: {states or 'no targets'}")
            time.sleep(0.2)

    def wait_for_alert(self, name: str, state: str = "firing", timeout: float = 30.0) -> Alert:
        """Wait until alert ``name`` is in ``state``; return it."""
        deadline = time.monotonic() + timeout
        while True:
            for alert in self.alerts():
                if alert.name == name and alert.state == state:
                    return alert
            if time.monotonic() > deadline:
                raise PrometheusError(f"alert {name} not {state} after {timeout:.0f} s; alerts now: {self.alerts()}")
            time.sleep(0.2)
