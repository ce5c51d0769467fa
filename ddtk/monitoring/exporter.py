"""What a training rank tells Prometheus: step time, throughput, loss, progress, health.

Each rank of a job serves its own ``/metrics`` page (Prometheus's text format) on its
own HTTP port, from a thread of ``prometheus_client``; Prometheus scrapes every rank and
adds ``job`` and ``instance``. A training loop calls three or four methods::

    metrics = TrainingMetrics(rank, world_size, port=0, targets_dir="/shared/targets")
    for batch in loader:
        t0 = time.perf_counter()
        loss = train_step(batch)
        metrics.step(time.perf_counter() - t0, samples=len(batch), loss=float(loss))
    metrics.close()

What it exports (every series labelled ``rank`` and ``world_size``):

===========================================  =========  ==============================================
``ddtk_step_seconds``                        histogram  wall time of each step, buckets 1 ms to 60 s
``ddtk_samples_total``                       counter    samples this rank trained on
``ddtk_steps_total``                         counter    steps this rank finished
``ddtk_loss``                                gauge      the last loss this rank reported (none before)
``ddtk_last_step_timestamp_seconds``         gauge      Unix time of the last step (hang detection)
``ddtk_step_share_ratio{part}``              gauge      data, compute, communication (exposed),
                                                        optimizer and idle shares of a profiled
                                                        window (:mod:`ddtk.profiling`)
``ddtk_last_checkpoint_timestamp_seconds``   gauge      Unix time of the last committed checkpoint
``ddtk_checkpoint_interval_seconds``         gauge      the Young/Daly interval the job aims at
``ddtk_restarts_total``                      counter    restarts of the job before this process
===========================================  =========  ==============================================

**Where the ranks are.** Two ways, one per kind of cluster:

* ``port=0`` with ``targets_dir``: the rank binds a free port and writes
  ``<targets_dir>/rank<r>.json``, a Prometheus ``file_sd`` entry with its
  ``host:port`` (atomically, removed by :meth:`TrainingMetrics.close`). A Prometheus
  with ``file_sd_configs: [{files: [<targets_dir>/*.json]}]`` finds every rank by
  itself: the laptop (:class:`~ddtk.monitoring.prometheus.ScrapeJob` with ``file_sd``),
  or a Slurm cluster whose head node runs Prometheus over a shared folder.
* a fixed port ``base + LOCAL_RANK``: on Kubernetes each pod has its own address, so
  every pod's ranks listen on the same few ports and a ``PodMonitor`` scrapes them
  (``deploy/monitoring/podmonitor.yaml``).

:meth:`TrainingMetrics.from_env` picks between them from ``DDTK_METRICS_PORT`` and
``DDTK_METRICS_DIR`` (and returns None when neither is set: export off), so a job started
by ``torchrun``, a Kubeflow ``TrainJob`` or Ray Train turns it on without code changes.

>>> with TrainingMetrics(rank=1, world_size=2) as m:
...     m.step(0.12, samples=64, loss=2.5)
...     m.shares({"compute": 0.7, "communication": 0.3})
...     page = m.exposition()
>>> for line in page.splitlines():
...     if line.startswith(("ddtk_steps", "ddtk_loss", "ddtk_step_share")):
...         print(line)
ddtk_steps_total{rank="1",world_size="2"} 1.0
ddtk_loss{rank="1",world_size="2"} 2.5
ddtk_step_share_ratio{part="compute",rank="1",world_size="2"} 0.7
ddtk_step_share_ratio{part="communication",rank="1",world_size="2"} 0.3
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "PARTS",
    "STEP_BUCKETS",
    "TrainingMetrics",
    "shares_from_trace",
]

# Step-time buckets from 1 ms (a small model on a GPU) to 60 s (a large step with
# accumulation); roughly 1-2.5-5 per decade, so a quantile is good to a factor of about 2.
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0, 60.0)  # fmt: skip
PARTS = ("data", "compute", "communication", "optimizer", "idle")
ENV_PORT, ENV_DIR, ENV_ADDR, ENV_TB = (
    "DDTK_METRICS_PORT",
    "DDTK_METRICS_DIR",
    "DDTK_METRICS_ADDR",
    "DDTK_TENSORBOARD_DIR",
)


def _non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _finite(name: str, value: object, minimum: float = 0.0) -> float:
    """``value`` as a float; a clear error for strings, NaN, infinities and values below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")) or value < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum:g}, got {value!r}")
    return value


def shares_from_trace(path: str | Path) -> dict[str, float]:
    """The five step shares of one rank's profiled window (a ``StepProfiler`` trace), via
    :func:`ddtk.profiling.breakdown`: ``{"data": .., "compute": .., "communication": ..,
    "optimizer": .., "idle": ..}``, summing to 1."""
    from ddtk.profiling.breakdown import breakdown
    from ddtk.profiling.trace import load_trace

    trace = load_trace(path)
    bd = breakdown([trace])
    return {part: bd.share(trace.rank, part) for part in PARTS}


def _serve(registry: Any, addr: str, port: int) -> tuple[Any, threading.Thread]:
    """``registry``'s page over HTTP from a daemon thread, as ``prometheus_client.start_http_server``
    does, but polling for shutdown every 50 ms instead of 500 ms, so closing is quick."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # no line per scrape
            pass

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    httpd = make_server(addr, port, make_wsgi_app(registry), Server, handler_class=Quiet)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              name=f"ddtk-metrics-{httpd.server_port}", daemon=True)  # fmt: skip
    thread.start()
    return httpd, thread


class TrainingMetrics:
    """One rank's metrics, served on ``http://<addr>:<port>/metrics`` until :meth:`close`.

    Args:
        rank, world_size: become the ``rank`` and ``world_size`` labels.
        port: the port to listen on; 0 picks a free one (read it back from ``.port``).
        addr: the address to bind: ``127.0.0.1`` (this machine only) or ``0.0.0.0``
            (a pod or node that a Prometheus elsewhere scrapes).
        targets_dir: where to write this rank's ``file_sd`` entry (``rank<r>.json``).
        target_host: the host name written there (default: ``127.0.0.1`` when bound to
            it, else this machine's fully qualified name).
        tensorboard_dir: also write loss, step time and samples/s as TensorBoard scalars
            under ``<tensorboard_dir>/rank<r>`` (:class:`~ddtk.monitoring.tensorboard.ScalarWriter`).
        restarts: restarts of the job before this process; default: torchrun's
            ``TORCHELASTIC_RESTART_COUNT`` (0 without torchrun).
    """

    def __init__(
        self,
        rank: int,
        world_size: int = 1,
        *,
        port: int = 0,
        addr: str = "127.0.0.1",
        targets_dir: str | Path | None = None,
        target_host: str | None = None,
        tensorboard_dir: str | Path | None = None,
        restarts: int | None = None,
    ) -> None:
        from prometheus_client import CollectorRegistry

        self.rank = _non_negative_int("rank", rank)
        self.world_size = _non_negative_int("world_size", world_size)
        if self.world_size < 1 or self.rank >= self.world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size} ranks")
        port = _non_negative_int("port", port)
        if port > 65535:
            raise ValueError(f"port must be at most 65535, got {port}")
        if restarts is None:
            restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        self.registry = CollectorRegistry()
        self._define(self.registry)
        self._restarts.inc(_non_negative_int("restarts", restarts))
        self._last_step.set(time.time())  # a job stuck before its first step is a hang too
        try:
            self._server, self._thread = _serve(self.registry, addr, port)
        except OSError as exc:
            raise OSError(f"rank {rank}: cannot serve metrics on {addr}:{port}: {exc}") from exc
        self.addr, self.port = addr, int(self._server.server_port)
        self.target_file: Path | None = None
        if targets_dir is not None:
            host = target_host or ("127.0.0.1" if addr == "127.0.0.1" else socket.getfqdn())
            self.target_file = self._register(Path(targets_dir), f"{host}:{self.port}")
        self._tensorboard = None
        if tensorboard_dir is not None:
            from ddtk.monitoring.tensorboard import ScalarWriter

            self._tensorboard = ScalarWriter(Path(tensorboard_dir) / f"rank{self.rank}")
        self._steps_done, self._checkpointed = 0, False

    # ------------------------------------------------------------ definitions

    def _define(self, registry: Any) -> None:
        """The metrics, each bound to this rank's labels once.

        Without ``_created`` series: in Prometheus's text format each counter and histogram
        would add a gauge ``<name>_created`` (its creation time) that no query here needs.
        ``disable_created_metrics`` is process-wide; a rank's process exports only these.
        """
        from prometheus_client import (
            Counter,
            Gauge,
            Histogram,
            ProcessCollector,
            disable_created_metrics,
        )

        disable_created_metrics()

        ProcessCollector(registry=registry)  # process_cpu_seconds_total, resident memory, ...
        names = ("rank", "world_size")
        labels = {"rank": str(self.rank), "world_size": str(self.world_size)}

        def bind(metric: Any) -> Any:
            return metric.labels(**labels)

        self._step_seconds = bind(Histogram("ddtk_step_seconds", "Wall time of one training step.",
                                            names, buckets=STEP_BUCKETS, registry=registry))  # fmt: skip
        self._samples = bind(Counter("ddtk_samples", "Samples this rank trained on.", names, registry=registry))
        self._steps = bind(Counter("ddtk_steps", "Training steps this rank finished.", names, registry=registry))
        # unbound until the first loss: a gauge bound now would report a loss of 0 before it
        self._loss = Gauge("ddtk_loss", "The last training loss this rank reported.", names, registry=registry)
        self._last_step = bind(Gauge("ddtk_last_step_timestamp_seconds",
                                     "Unix time of the last finished step (or of the start).",
                                     names, registry=registry))  # fmt: skip
        self._restarts = bind(Counter("ddtk_restarts", "Restarts of the job before this process.",
                                      names, registry=registry))  # fmt: skip
        self._share = Gauge("ddtk_step_share_ratio",
                            "Share of a profiled step spent in each part (ddtk.profiling).",
                            (*names, "part"), registry=registry)  # fmt: skip
        self._last_checkpoint = Gauge("ddtk_last_checkpoint_timestamp_seconds",
                                      "Unix time of the last committed checkpoint.",
                                      names, registry=registry)  # fmt: skip
        self._interval = Gauge("ddtk_checkpoint_interval_seconds",
                               "Checkpoint interval the job aims at (Young/Daly).",
                               names, registry=registry)  # fmt: skip
        self._labels = labels

    def _register(self, folder: Path, target: str) -> Path:
        """Write ``rank<r>.json`` for Prometheus's file service discovery, atomically."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}.json"
        tmp = path.with_suffix(f".json.{os.getpid()}.tmp")  # Prometheus reads *.json only
        tmp.write_text(json.dumps([{"targets": [target], "labels": {}}]))
        os.replace(tmp, path)
        return path

    # ------------------------------------------------------------ what the loop calls

    @property
    def url(self) -> str:
        """The metrics page of this rank."""
        host = "127.0.0.1" if self.addr in ("0.0.0.0", "") else self.addr
        return f"http://{host}:{self.port}/metrics"

    def step(self, seconds: float, samples: int, loss: float | None = None) -> None:
        """Record one finished step: its wall time, its samples on this rank, its loss."""
        seconds = _finite("seconds", seconds)
        samples = _non_negative_int("samples", samples)
        self._step_seconds.observe(seconds)
        self._samples.inc(samples)
        self._steps.inc()
        if loss is not None:
            self._loss.labels(**self._labels).set(_finite("loss", float(loss), minimum=float("-inf")))
        self._last_step.set(time.time())
        self._steps_done += 1
        if self._tensorboard is not None:
            self._tensorboard.step(self._steps_done, seconds, samples, loss)

    def shares(self, shares: Mapping[str, float]) -> None:
        """Publish the parts of a profiled step (fractions of the step, e.g. from
        :func:`shares_from_trace`); unknown part names are an error."""
        for part, value in shares.items():
            if part not in PARTS:
                raise ValueError(f"unknown part {part!r}; parts are {', '.join(PARTS)}")
            self._share.labels(**self._labels, part=part).set(_finite(f"share of {part}", value))

    def shares_from_trace(self, path: str | Path) -> dict[str, float]:
        """Analyse this rank's profiler trace with :mod:`ddtk.profiling` and publish its shares."""
        found = shares_from_trace(path)
        self.shares(found)
        return found

    def checkpoint_interval(self, seconds: float) -> None:
        """Declare the interval the job checkpoints at (``ddtk.checkpoint.interval``'s Young or
        Daly interval); the age of the last checkpoint counts from now until the first commit."""
        self._interval.labels(**self._labels).set(_finite("checkpoint interval", seconds, 1e-9))
        if not self._checkpointed:  # no commit yet: from now on the age counts
            self.checkpoint()
            self._checkpointed = False

    def checkpoint(self, when: float | None = None) -> None:
        """A checkpoint was committed (now, or at Unix time ``when``)."""
        stamp = time.time() if when is None else _finite("when", when)
        self._last_checkpoint.labels(**self._labels).set(stamp)
        self._checkpointed = True

    def restart(self) -> None:
        """The job restarted inside this process (an in-process recovery)."""
        self._restarts.inc()

    # ------------------------------------------------------------ text and shutdown

    def exposition(self) -> str:
        """The page Prometheus scrapes, as text (what ``GET /metrics`` returns)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

    def close(self) -> None:
        """Stop serving, free the port, remove the target file, flush TensorBoard. Safe twice."""
        server, self._server = getattr(self, "_server", None), None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(timeout=5)
        if self.target_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.target_file.unlink()
        if self._tensorboard is not None:
            self._tensorboard.close()

    def __enter__(self) -> TrainingMetrics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def from_env(cls, rank: int, world_size: int) -> TrainingMetrics | None:
        """Metrics as the environment asks, or None (export off) when it does not.

        ``DDTK_METRICS_PORT=BASE``: listen on ``BASE + LOCAL_RANK`` (``LOCAL_RANK`` from
        torchrun; the rank without it), on ``DDTK_METRICS_ADDR`` (default ``0.0.0.0``);
        ``0`` picks a free port. ``DDTK_METRICS_DIR=DIR``: write the ``file_sd`` entry
        there (with no port given, a free port on ``127.0.0.1``).
        ``DDTK_TENSORBOARD_DIR=DIR``: TensorBoard scalars too.
        """
        base, folder = os.environ.get(ENV_PORT, "").strip(), os.environ.get(ENV_DIR, "").strip()
        if not base and not folder:
            return None
        if base and not base.isdigit():
            raise ValueError(f"{ENV_PORT} must be a port number, got {base!r}")
        local = int(os.environ.get("LOCAL_RANK", rank) or rank)
        port = int(base) + local if base and int(base) else 0
        addr = os.environ.get(ENV_ADDR) or ("0.0.0.0" if base else "127.0.0.1")
        return cls(rank, world_size, port=port, addr=addr, targets_dir=folder or None,
                   tensorboard_dir=os.environ.get(ENV_TB) or None)  # fmt: skip
