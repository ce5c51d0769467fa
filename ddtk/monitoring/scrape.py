"""Watching a running Ray cluster: Prometheus snapshots of every node, and TensorBoard scalars.

Every Ray node runs a metrics agent that serves the node's metrics (Ray's own, Ray
Train's and any ``ray.util.metrics`` a program defines) in Prometheus text format
at ``http://<node ip>:<MetricsExportPort>/metrics``; a Prometheus server scrapes
those endpoints, Grafana plots them. Here a :class:`MetricsScraper` thread plays the
Prometheus server: it fetches every endpoint every ``interval`` seconds and keeps the
raw text with a timestamp, for a parser to turn into time series afterwards.

:func:`read_scalars` reads the event files a ``tensorboardX.SummaryWriter`` wrote
(the TFRecord framing: length, CRC, record, CRC), so a notebook can show what
TensorBoard would plot without starting TensorBoard.

>>> import tempfile
>>> from tensorboardX import SummaryWriter
>>> folder = tempfile.mkdtemp()
>>> with SummaryWriter(folder) as w:
...     w.add_scalar("train/loss", 0.5, 1)
>>> read_scalars(folder)["train/loss"]
[(1, 0.5)]
"""

from __future__ import annotations

import struct
import threading
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MetricsScraper", "Snapshot", "metrics_urls", "read_scalars"]


@dataclass(frozen=True)
class Snapshot:
    """One scrape of one endpoint: when (seconds since the scraper started), where, the text."""

    t: float
    url: str
    text: str


def metrics_urls() -> list[str]:
    """The Prometheus endpoint of every live node of the connected Ray cluster."""
    import ray

    return [
        f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
        for n in ray.nodes()
        if n.get("Alive") and n.get("MetricsExportPort")
    ]


class MetricsScraper:
    """Scrape ``urls`` every ``interval`` seconds in a background thread until :meth:`stop`.

    Use it as a context manager around the work to watch. An endpoint that does not
    answer is skipped for that round and counted in ``errors``: a node may be
    starting or gone, and monitoring must not stop the training it watches.
    """

    def __init__(self, urls: list[str], interval: float = 1.0, timeout: float = 2.0) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive seconds, got {interval}")
        self.urls, self.interval, self.timeout = list(urls), interval, timeout
        self.snapshots: list[Snapshot] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)
        self._start = 0.0

    def _scrape_once(self) -> None:
        for url in self.urls:
            try:
                with urllib.request.urlopen(url, timeout=self.timeout) as response:
                    text = response.read().decode("utf-8", "replace")
            except OSError:
                self.errors += 1
                continue
            self.snapshots.append(Snapshot(time.monotonic() - self._start, url, text))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._scrape_once()
            self._stop.wait(self.interval)

    def start(self) -> MetricsScraper:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> list[Snapshot]:
        """Stop after a last scrape; return every snapshot taken."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self._scrape_once()
        return self.snapshots

    def __enter__(self) -> MetricsScraper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _records(path: Path) -> list[bytes]:
    """The records of one TFRecord file (length-prefixed, each with CRCs that are not checked)."""
    data, records, pos = path.read_bytes(), [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        start = pos + 12
        records.append(data[start : start + length])
        pos = start + length + 4
    return records


def read_scalars(logdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under ``logdir``: tag -> [(step, value)]."""
    from tensorboardX.proto import event_pb2

    files = sorted(Path(logdir).rglob("events.out.tfevents.*"))
    if not files:
        raise FileNotFoundError(f"no TensorBoard event files under {logdir}")
    scalars: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for path in files:
        for record in _records(path):
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars[value.tag].append((int(event.step), float(value.simple_value)))
    return {tag: sorted(points) for tag, points in scalars.items()}
