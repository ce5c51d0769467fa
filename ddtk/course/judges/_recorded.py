r"""A real Prometheus over series a judge wrote: PromQL answers checked without waiting for scrapes.

A judge that checks a learner's PromQL needs a server holding data whose every value it
chose. Scraping a live exporter would cost the service-discovery delay (about 5 s) plus a
whole rate window of scrapes, and would make the values depend on scrape timing on a busy
machine. Instead the judge writes its series, with timestamps, in the OpenMetrics text
format; ``promtool tsdb create-blocks-from openmetrics`` turns them into TSDB blocks (the
backfilling Prometheus documents for importing history), and
:class:`~ddtk.monitoring.prometheus.PrometheusServer` starts on that data folder with no
scrape targets. Queries at a fixed time then give the same answer on every run::

    now = int(time.time())
    text = f"# TYPE demo counter\ndemo_total 1 {now - 2}\ndemo_total 5 {now - 1}\n# EOF\n"
    with recorded_prometheus(text) as prom:
        prom.query("demo_total", at=now - 1)  # one Sample, value 5.0
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ddtk.monitoring.prometheus import PrometheusError, PrometheusServer, ScrapeJob, find_binary

__all__ = ["recorded_prometheus"]


def _backfill(source: Path, data: Path) -> None:
    """``promtool tsdb create-blocks-from openmetrics source data``, or a clear error."""
    done = subprocess.run(
        [find_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0:
        raise PrometheusError(f"promtool could not import the recorded series: {done.stderr[-1500:]}")


@contextlib.contextmanager
def recorded_prometheus(openmetrics: str) -> Iterator[PrometheusServer]:
    """A running Prometheus whose TSDB holds exactly the series of ``openmetrics``.

    ``openmetrics`` is OpenMetrics text with a timestamp (seconds) on every sample and a
    final ``# EOF``; samples must lie within the server's retention (one day). The server
    scrapes nothing, and it and its folder are gone when the block ends.
    """
    with tempfile.TemporaryDirectory(prefix="ddtk-recorded-") as folder:
        work = Path(folder)
        source = work / "series.om"
        source.write_text(openmetrics)
        _backfill(source, work / "data")
        no_targets = work / "no-targets.json"
        no_targets.write_text("[]")
        with PrometheusServer([ScrapeJob("recorded", file_sd=no_targets)], workdir=work) as server:
            yield server
