"""A real training job watched by a real Prometheus, end to end, in one call.

:func:`watch_job` starts :class:`~ddtk.monitoring.prometheus.PrometheusServer` with the
rules of :mod:`ddtk.monitoring.alerts`, then runs :mod:`ddtk.profiling.jobs`'s
data-parallel job on local ranks, each rank exporting its metrics
(:class:`~ddtk.monitoring.exporter.TrainingMetrics`) and TensorBoard scalars. While the
job runs it polls the server's alerts, the way Alertmanager would be told; after the job
it hands back the server, still running, with the job's result and what fired, so the
caller can query what Prometheus recorded. Lecture 07 and
``tests/test_monitoring_live.py`` use it.

**Why the targets are fixed ports.** Prometheus (2.42 here) passes discovered targets
from its service discovery to its scrape manager on a 5-second tick, fixed in the code,
and the first tick comes 5 s after the start. Targets announced later (the ``file_sd``
files a rank writes when it is up) wait for a later tick: up to 10 s more. So the server
starts first, with the ranks' addresses (``127.0.0.1:<base + rank>``) as static targets;
the job starts at once and the ranks begin to listen while the server waits for its first
tick. Until a rank listens its target is ``down`` and has no series, which no rule
mistakes for a hang. On a cluster the targets come from Kubernetes (``PodMonitor``) or a
shared ``file_sd`` folder, and seconds do not matter.
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtk.monitoring.alerts import RuleParams, rule_file
from ddtk.monitoring.prometheus import Alert, PrometheusError, PrometheusServer, ScrapeJob

__all__ = ["DEMO_RULES", "WatchedRun", "free_ports", "watch_job"]

# The rules with windows and `for` durations of seconds, since a demo job runs for seconds,
# not hours. The straggler factor is 1.25 rather than 1.5: with two ranks the median is the
# mean of the two, so a rank busy r times as long as the other stands at 2r/(1+r) of it, and
# 1.25 means r > 1.67 (1.5 would need r > 3).
DEMO_RULES = RuleParams(window="5s", hang_after_s=5.0, hang_for="1s", straggler_factor=1.25,
                        straggler_for="1s", restarts_window="1m", ecc_window="1m")  # fmt: skip


@dataclass
class WatchedRun:
    """What :func:`watch_job` saw in the job's last run: the live server, the job's result,
    when each alert first fired and when the targets were first up (seconds after the
    server started); ``start`` is when that run began."""

    prom: PrometheusServer
    job: Any  # ddtk.profiling.jobs.JobResult
    fired: dict[str, Alert]  # alert name -> the alert as first seen firing
    seconds: dict[str, float]  # "targets up", "<alert> firing", "job done": seconds after start
    start: float  # Unix time the server started
    end: float  # Unix time the job ended
    work_dir: Path = Path(".")
    job_name: str = "ddtk-demo"
    ports: list[int] = field(default_factory=list)
    config: Any = None  # the JobConfig the last run ran (its timed_steps scaled on a rerun)
    runs: int = 1  # runs of the job until the expected alerts fired

    @property
    def tensorboard_dir(self) -> Path:
        """Where the ranks wrote their TensorBoard scalars (``rank<r>`` under it)."""
        return self.work_dir / "tensorboard"

    @property
    def trace_dir(self) -> Path:
        """The profiled window of every rank (``rank<r>.json``)."""
        return self.work_dir / "traces"


def free_ports(count: int, host: str = "127.0.0.1", attempts: int = 50) -> int:
    """A port ``base`` such that ``base .. base + count - 1`` are free now (rank r takes base + r)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an integer >= 1, got {count!r}")
    for _ in range(attempts):
        with contextlib.ExitStack() as held:
            first = held.enter_context(socket.socket())
            first.bind((host, 0))
            base = first.getsockname()[1]
            if base + count > 65536:
                continue
            try:
                for port in range(base + 1, base + count):
                    held.enter_context(socket.socket()).bind((host, port))
            except OSError:
                continue
            return base
    raise OSError(f"no {count} consecutive free ports on {host} after {attempts} attempts")


class _Job(threading.Thread):
    """The job in a thread, so this thread can watch it; its error, if any, is kept."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(name="ddtk-watched-job", daemon=True)
        self.kwargs, self.result, self.error = kwargs, None, None

    def run(self) -> None:
        from ddtk.profiling.jobs import run_job

        try:
            self.result = run_job(**self.kwargs)
        except BaseException as exc:  # handed to the caller by check()
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the watched job failed: {self.error}") from self.error


def _seconds(duration: str) -> float:
    """A Prometheus duration (``5s``, ``1m``, ``1h``) in seconds."""
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h|d)", duration):
        total += int(number) * units[unit]
    return total


def _watch_once(prom: PrometheusServer, job: _Job, job_name: str, world_size: int, t0: float,
                timeout: float) -> tuple[dict[str, Alert], dict[str, float]]:  # fmt: skip
    """Poll targets and alerts while ``job`` runs; what fired and when (seconds after ``t0``)."""
    fired: dict[str, Alert] = {}
    seconds: dict[str, float] = {"job start": time.monotonic() - t0}
    job.start()
    try:
        while job.is_alive():
            if "targets up" not in seconds:
                up = [t for t in prom.targets() if t["labels"].get("job") == job_name and t["health"] == "up"]
                if len(up) == world_size:
                    seconds["targets up"] = time.monotonic() - t0
            for alert in prom.alerts():
                if alert.state == "firing" and alert.name not in fired:
                    fired[alert.name] = alert
                    seconds[f"{alert.name} firing"] = time.monotonic() - t0
            if time.monotonic() - t0 - seconds["job start"] > timeout:
                raise PrometheusError(f"the watched job did not end within {timeout:.0f} s")
            time.sleep(0.1)
    finally:
        job.join(timeout)
    seconds["job done"] = time.monotonic() - t0
    job.check()
    return fired, seconds


def _wait_for_quiet(prom: PrometheusServer, job_name: str, timeout: float) -> None:
    """Wait until no alert about ``job_name`` is pending or firing: the last run's samples
    have left the rules' windows, so an alert of the next run is that run's own."""
    deadline = time.monotonic() + timeout
    while any(a.labels.get("job") == job_name for a in prom.alerts()):
        if time.monotonic() > deadline:
            raise PrometheusError(f"the alerts about {job_name} stayed active {timeout:.0f} s after its run ended")
        time.sleep(0.2)


@contextlib.contextmanager
def watch_job(
    config: Any,
    work_dir: str | Path,
    world_size: int = 2,
    rules: RuleParams = DEMO_RULES,
    expect: Sequence[str] = ("TrainingStraggler",),
    job_name: str = "ddtk-demo",
    scrape_interval: float = 0.5,
    extra_jobs: Sequence[ScrapeJob] = (),
    backend: str = "auto",
    timeout: float = 120.0,
    attempts: int = 3,
) -> Iterator[WatchedRun]:
    """Run ``config`` (a :class:`~ddtk.profiling.jobs.JobConfig` or a preset name) on
    ``world_size`` ranks under a Prometheus scraping and evaluating every
    ``scrape_interval`` seconds; yield a :class:`WatchedRun` once the job has ended, with
    the server still running (stopped on leaving the block).

    ``expect``: alerts that must fire while the job runs. The rules need a span of scraped
    data (their window and ``for``), and a fast machine may finish the job's steps sooner:
    then the job runs again on the same ports, with its timed steps scaled to last that
    span, up to ``attempts`` runs in all (the :class:`WatchedRun` says which steps the last
    one ran). If an alert has still not fired, the error says which did. ``extra_jobs`` are
    scraped beside the job (a planted hung exporter, say). Traces, the rule file and
    TensorBoard files go under ``work_dir``.
    """
    from ddtk.profiling.jobs import job_config

    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts must be an integer >= 1, got {attempts!r}")
    cfg = job_config(config) if isinstance(config, str) else config
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    rule_path = work / "ddtk-training.rules"
    rule_path.write_text(rule_file(rules))
    span = (_seconds(rules.window) + max(_seconds(rules.straggler_for), _seconds(rules.hang_for))
            + 4 * scrape_interval + 1.0)  # fmt: skip
    base = free_ports(world_size)
    ports = list(range(base, base + world_size))
    scrape = ScrapeJob(job_name, [f"127.0.0.1:{p}" for p in ports])
    with PrometheusServer([scrape, *extra_jobs], rule_files=[rule_path], scrape_interval=scrape_interval,
                          evaluation_interval=scrape_interval) as prom:  # fmt: skip
        t0 = time.monotonic()
        for attempt in range(1, attempts + 1):
            shutil.rmtree(work / "tensorboard", ignore_errors=True)  # one run's scalars only
            start = time.time()
            job = _Job(config=cfg, world_size=world_size, trace_dir=work / "traces", metrics_port=base,
                       tensorboard_dir=work / "tensorboard", backend=backend, timeout=timeout)  # fmt: skip
            fired, seconds = _watch_once(prom, job, job_name, world_size, t0, timeout)
            missing = [name for name in expect if name not in fired]
            scraped = seconds["job done"] - seconds.get("targets up", seconds["job done"])
            if not missing or attempt == attempts or scraped >= span:
                break
            _wait_for_quiet(prom, job_name, 2 * span)  # what fires next comes from the next run
            # the targets are known now, so the next run is scraped from its ranks' start:
            # enough steps of the measured step time to fill the span, with a margin
            step_s = job.result.step_ms / 1e3 if job.result and job.result.step_ms > 0 else 0.0
            steps = math.ceil(1.3 * span / step_s) if step_s else 2 * cfg.timed_steps
            cfg = cfg.replace(timed_steps=max(steps, cfg.timed_steps + 1))
        end = time.time()
        if missing:
            raise PrometheusError(
                f"alert(s) {', '.join(missing)} did not fire while the job ran ({attempt} run(s), the last "
                f"{cfg.timed_steps} timed steps, scraped for {scraped:.1f} s of the {span:.1f} s the rules "
                f"need); fired: {sorted(fired) or 'none'}"
            )
        yield WatchedRun(prom, job.result, fired, seconds, start, end, work, job_name, ports, cfg, attempt)
