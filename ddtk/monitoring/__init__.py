"""Watching a training job: what it exports, the Prometheus that scrapes it, what reads it back.

- :mod:`ddtk.monitoring.prometheus`: a real Prometheus server (generated config, free
  port, PromQL over its HTTP API, targets and alerts), for notebooks and tests;
- :mod:`ddtk.monitoring.exporter`: :class:`TrainingMetrics`, what each rank of a job serves
  to Prometheus (step time, samples, loss, progress, step shares, checkpoints, restarts);
- :mod:`ddtk.monitoring.alerts`: alerting and recording rules, written as a rule file and a
  ``PrometheusRule``, checked and unit-tested with ``promtool``;
- :mod:`ddtk.monitoring.dashboards`: Grafana dashboards built with grafana-foundation-sdk,
  validated, and their queries for drawing against a real Prometheus;
- :mod:`ddtk.monitoring.tensorboard`: TensorBoard scalars written and read back;
- :mod:`ddtk.monitoring.watch`: :func:`watch_job`, a real job under a real Prometheus with
  the rules loaded, its alerts collected as they fire (lecture 07);
- :mod:`ddtk.monitoring.scrape`: :func:`read_scalars`, the scalars of tensorboardX event
  files read without TensorBoard (lab 01).
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
    "RuleCheckError": "alerts",
    "RuleParams": "alerts",
    "check_rules": "alerts",
    "prometheus_rule": "alerts",
    "rule_file": "alerts",
    "unit_test_rules": "alerts",
    "panel_queries": "dashboards",
    "plot_panels": "dashboards",
    "TrainingMetrics": "exporter",
    "shares_from_trace": "exporter",
    "find_binary": "prometheus",
    "ScalarWriter": "tensorboard",
    "load_scalars": "tensorboard",
    "read_scalars": "scrape",
    "WatchedRun": "watch",
    "watch_job": "watch",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
