"""Watching a training job: what it exports, the Prometheus that scrapes it, what reads it back.

- :mod:`ddtk.monitoring.prometheus`: a real Prometheus server (generated config, free
  port, PromQL over its HTTP API, targets and alerts), for notebooks and tests;
- :mod:`ddtk.monitoring.scrape`: a thread that fetches Prometheus endpoints (a Ray
  cluster's metrics agents) without a server, and :func:`read_scalars` for TensorBoard
  event files.
"""

from __future__ import annotations

from ddtk._lazy import lazy_exports

_EXPORTS = {
    "Alert": "prometheus",
    "PrometheusError": "prometheus",
    "PrometheusNotInstalled": "prometheus",
    "PrometheusServer": "prometheus",
    "Sample": "prometheus",
    "ScrapeJob": "prometheus",
    "Series": "prometheus",
    "MetricsScraper": "scrape",
    "Snapshot": "scrape",
    "metrics_urls": "scrape",
    "read_scalars": "scrape",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
