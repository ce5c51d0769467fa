"""Grafana dashboards as code: built with grafana-foundation-sdk, checked, committed as JSON.

Three dashboards, each a function that returns Grafana's dashboard JSON (a dict):

* :func:`training_dashboard`: a ddtk training job (:mod:`ddtk.monitoring.exporter`):
  samples/s, step time p50/p99 by rank, loss, seconds since the last step, step shares,
  busy time by rank (stragglers), checkpoint age against its interval, restarts;
* :func:`ray_train_dashboard`: a Ray Train run, from the metrics Ray 2.60 itself exports
  (``ray_train_*`` from the Train controller and workers, ``ray_node_*`` from each node's
  metrics agent);
* :func:`gpu_fleet_dashboard`: the GPUs of a cluster from NVIDIA's dcgm-exporter
  (``DCGM_FI_*``): utilisation, tensor-core activity, memory, power, temperature, XID and
  ECC errors, NVLink and PCIe throughput.

They are built with the ``grafana-foundation-sdk`` package (``1769699379!11.6.0``, the
release generated for Grafana 11.6; its version numbers carry an epoch) and checked by
:func:`validate`: the JSON must survive a round trip through the SDK's model classes
unchanged, every field must have the type the model declares, every panel type must be
one Grafana knows and every query must be PromQL with a ``refId``. ``deploy/monitoring/
dashboards/`` holds the JSON (:func:`write_deploy`); a test checks it equals a fresh build.
Grafana itself is not run here: it has no Debian package and its tarball is a download.

:func:`panel_queries` lists each panel's PromQL with Grafana's variables filled in, so a
notebook can run them against a real Prometheus and draw what the panel would show
(:func:`plot_panels`).

>>> board = training_dashboard()
>>> validate(board)
[]
>>> first = panel_queries(board, {"job": "demo"}, rate_interval="10s")[0]
>>> first.title, first.unit, first.expr
('Samples per second', 'short', 'sum by (job) (rate(ddtk_samples_total{job=~"demo"}[10s]))')
"""

from __future__ import annotations

import enum
import json
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DASHBOARDS",
    "DashboardError",
    "PanelQuery",
    "check",
    "gpu_fleet_dashboard",
    "panel_queries",
    "plot_panels",
    "ray_train_dashboard",
    "to_json",
    "training_dashboard",
    "validate",
    "write_deploy",
]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "monitoring" / "dashboards"
DATASOURCE = "${datasource}"
GRID_COLUMNS = 24


class DashboardError(ValueError):
    """A dashboard's JSON does not match Grafana's model; the message lists every problem."""


# ---------------------------------------------------------------- building blocks


def _sdk() -> types.SimpleNamespace:
    """The SDK's builders and models, imported on first use (the package is optional), with
    its panel and query types registered (what decoding a dashboard's JSON needs)."""
    from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import common
    from grafana_foundation_sdk.models import dashboard as models

    register_default_plugins()
    return types.SimpleNamespace(dashboard=dashboard, prometheus=prometheus, stat=stat,
                                 timeseries=timeseries, common=common, models=models)  # fmt: skip


def _query(expr: str, legend: str, ref: str) -> Any:
    sdk = _sdk()
    return sdk.prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)


def _panel(kind: str, title: str, description: str, unit: str,
           queries: list[tuple[str, str]], width: int = 12, height: int = 8) -> Any:  # fmt: skip
    """A time series or stat panel of ``queries`` (expression, legend) on the Prometheus variable."""
    sdk = _sdk()
    builder = (sdk.timeseries.Panel() if kind == "timeseries" else sdk.stat.Panel())
    builder = (
        builder.title(title).description(description).unit(unit).span(width).height(height)
        .datasource(sdk.models.DataSourceRef(type_val="prometheus", uid=DATASOURCE))
    )  # fmt: skip
    for i, (expr, legend) in enumerate(queries):
        builder = builder.with_target(_query(expr, legend, chr(ord("A") + i)))
    return builder


def _dashboard(uid: str, title: str, description: str, tags: list[str],
               variables: list[tuple[str, str, str]], rows: list[tuple[str, list[Any]]]) -> dict[str, Any]:  # fmt: skip
    """A dashboard: a Prometheus data source variable, ``(name, label, label_values query)``
    variables, then rows of panels; returned as Grafana's JSON."""
    sdk = _sdk()
    board = (
        sdk.dashboard.Dashboard(title).uid(uid).description(description).tags(["ddtk", *tags])
        .refresh("30s").time("now-1h", "now").timezone("browser").readonly()
        .tooltip(sdk.models.DashboardCursorSync.CROSSHAIR)
        .with_variable(sdk.dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )  # fmt: skip
    source = sdk.models.DataSourceRef(type_val="prometheus", uid=DATASOURCE)
    for name, label, query in variables:
        board = board.with_variable(
            sdk.dashboard.QueryVariable(name).label(label).query(query).datasource(source)
            .refresh(sdk.models.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True).include_all(True).all_value(".+")
        )  # fmt: skip
    for row_title, panels in rows:
        board = board.with_row(sdk.dashboard.Row(row_title))
        for panel in panels:
            board = board.with_panel(panel)
    model = board.build()
    for number, panel in enumerate(model.panels, start=1):
        panel.id_val = number  # Grafana needs a unique id per panel; the builders leave it unset
    return to_json(model)


def to_json(model: Any) -> dict[str, Any]:
    """An SDK model object as plain JSON data (what Grafana stores and imports)."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.loads(json.dumps(model, cls=JSONEncoder))


# ---------------------------------------------------------------- the dashboards


def _rate(metric: str, sel: str) -> str:
    return f"rate({metric}{{{sel}}}[$__rate_interval])"


def training_dashboard() -> dict[str, Any]:
    """A ddtk training job: throughput, step time by rank, loss, progress, shares, faults."""
    sel = 'job=~"$job"'
    mean = (f"sum by (job, rank) ({_rate('ddtk_step_seconds_sum', sel)})\n"
            f"  / sum by (job, rank) ({_rate('ddtk_step_seconds_count', sel)})")  # fmt: skip
    buckets = f"sum by (job, rank, le) ({_rate('ddtk_step_seconds_bucket', sel)})"
    ts = "timeseries"
    rows = [
        ("Throughput and progress", [
            _panel(ts, "Samples per second", "All ranks of the job together.", "short",
                   [(f"sum by (job) ({_rate('ddtk_samples_total', sel)})", "{{job}}")]),
            _panel(ts, "Step time p50 and p99 by rank",
                   "From the ddtk_step_seconds histogram. Synchronous ranks have equal step times: "
                   "a straggler shows in the busy-time panel, not here.", "s",
                   [(f"histogram_quantile(0.5, {buckets})", "p50 rank {{rank}}"),
                    (f"histogram_quantile(0.99, {buckets})", "p99 rank {{rank}}")]),
            _panel(ts, "Loss by rank", "The last loss each rank reported.", "none",
                   [(f"ddtk_loss{{{sel}}}", "rank {{rank}}")]),
            _panel(ts, "Seconds since the last step",
                   "Grows without bound when the job hangs (alert TrainingJobHung).", "s",
                   [(f"time() - max by (job) (ddtk_last_step_timestamp_seconds{{{sel}}})", "{{job}}")]),
        ]),
        ("Where the step goes", [
            _panel(ts, "Step shares by rank (profiled window)",
                   "Data, compute, exposed communication, optimizer and idle shares of the last "
                   "profiled window (ddtk.profiling).", "percentunit",
                   [(f"ddtk_step_share_ratio{{{sel}}}", "rank {{rank}} {{part}}")]),
            _panel(ts, "Busy time per step by rank",
                   "Step time minus exposed communication: the straggler is the rank well above "
                   "the others (alert TrainingStraggler).", "s",
                   [(f"{mean}\n  * on (job, rank) (1 - max by (job, rank) "
                     f'(ddtk_step_share_ratio{{{sel}, part="communication"}}))', "rank {{rank}}")]),
        ]),
        ("Fault tolerance", [
            _panel(ts, "Checkpoint age and interval",
                   "Age of the newest committed checkpoint against the Young/Daly interval the "
                   "job declared (alert TrainingCheckpointOverdue at twice the interval).", "s",
                   [(f"min by (job) (time() - ddtk_last_checkpoint_timestamp_seconds{{{sel}}})", "age"),
                    (f"max by (job) (ddtk_checkpoint_interval_seconds{{{sel}}})", "interval")]),
            _panel("stat", "Restarts", "Restarts of the job so far (torchrun's restart count).", "none",
                   [(f"max by (job) (ddtk_restarts_total{{{sel}}})", "{{job}}")]),
        ]),
    ]  # fmt: skip
    return _dashboard("ddtk-training", "ddtk · training job",
                      "Metrics of ddtk.monitoring.TrainingMetrics, one series per rank.", ["training"],
                      [("job", "Job", "label_values(ddtk_steps_total, job)")], rows)  # fmt: skip


def ray_train_dashboard() -> dict[str, Any]:
    """A Ray Train run: the controller's state, the workers' reporting and checkpointing time,
    and the nodes' CPU, memory, GPUs and network (metric names of Ray 2.60)."""
    run = 'ray_train_run_name=~"$run"'
    ts = "timeseries"
    rows = [
        ("Ray Train", [
            _panel(ts, "Controller state", "1 while the run's controller is in that state.", "none",
                   [(f"sum by (ray_train_run_name, ray_train_controller_state) (ray_train_controller_state{{{run}}})",
                     "{{ray_train_controller_state}}")]),
            _panel(ts, "Worker group start and shutdown", "Cumulative seconds.", "s",
                   [(f"sum by (ray_train_run_name) (ray_train_worker_group_start_total_time_s{{{run}}})", "start"),
                    (f"sum by (ray_train_run_name) (ray_train_worker_group_shutdown_total_time_s{{{run}}})",
                     "shutdown")]),
            _panel(ts, "Time blocked in train.report, by rank", "Cumulative seconds per worker.", "s",
                   [(f"sum by (ray_train_worker_world_rank) (ray_train_report_total_blocked_time_s{{{run}}})",
                     "rank {{ray_train_worker_world_rank}}")]),
            _panel(ts, "Checkpoint sync and transfer time, by rank", "Cumulative seconds per worker.", "s",
                   [(f"sum by (ray_train_worker_world_rank) (ray_train_checkpoint_sync_total_time_s{{{run}}})",
                     "sync rank {{ray_train_worker_world_rank}}"),
                    (f"sum by (ray_train_worker_world_rank) (ray_train_checkpoint_transfer_total_time_s{{{run}}})",
                     "transfer rank {{ray_train_worker_world_rank}}")]),
        ]),
        ("Nodes", [
            _panel(ts, "CPU utilisation", "Per node, percent of its CPUs.", "percent",
                   [("ray_node_cpu_utilization", "{{instance}}")]),
            _panel(ts, "Memory used", "Per node.", "bytes", [("ray_node_mem_used", "{{instance}}")]),
            _panel(ts, "GPU utilisation", "Per GPU, percent.", "percent",
                   [("ray_node_gpus_utilization", "{{instance}} GPU {{GpuIndex}}")]),
            _panel(ts, "GPU memory used", "Per GPU (Ray reports MiB).", "bytes",
                   [("ray_node_gram_used * 1024 * 1024", "{{instance}} GPU {{GpuIndex}}")]),
            _panel(ts, "Network", "Per node.", "Bps",
                   [("ray_node_network_receive_speed", "{{instance}} in"),
                    ("ray_node_network_send_speed", "{{instance}} out")]),
        ]),
    ]  # fmt: skip
    return _dashboard("ddtk-ray-train", "ddtk · Ray Train run",
                      "Ray Train's own metrics (ray_train_*) and its nodes' (ray_node_*).", ["ray"],
                      [("run", "Run", "label_values(ray_train_controller_state, ray_train_run_name)")],
                      rows)  # fmt: skip


def gpu_fleet_dashboard() -> dict[str, Any]:
    """The GPUs of a cluster from dcgm-exporter: load, memory, power, heat, errors, links."""
    host = 'Hostname=~"$host"'
    ts = "timeseries"
    legend = "{{Hostname}} GPU {{gpu}}"
    rows = [
        ("Load", [
            _panel(ts, "GPU utilisation", "DCGM_FI_DEV_GPU_UTIL: time a kernel ran, percent.", "percent",
                   [(f"DCGM_FI_DEV_GPU_UTIL{{{host}}}", legend)]),
            _panel(ts, "Tensor cores and graphics engine active",
                   "Profiling fields: the ratio of cycles the tensor pipe and the engine were busy, "
                   "a better measure of useful work than utilisation.", "percentunit",
                   [(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{host}}}", "tensor " + legend),
                    (f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{host}}}", "engine " + legend)]),
            _panel(ts, "Memory used", "Framebuffer memory (dcgm-exporter reports MiB).", "mbytes",
                   [(f"DCGM_FI_DEV_FB_USED{{{host}}}", legend)]),
            _panel(ts, "Power", "Board power draw.", "watt", [(f"DCGM_FI_DEV_POWER_USAGE{{{host}}}", legend)]),
            _panel(ts, "Temperature", "GPU die temperature.", "celsius",
                   [(f"DCGM_FI_DEV_GPU_TEMP{{{host}}}", legend)]),
        ]),
        ("Errors", [
            _panel("stat", "Last XID by GPU", "Nonzero: the GPU reported that XID (alerts GpuXid*).", "none",
                   [(f"DCGM_FI_DEV_XID_ERRORS{{{host}}} > 0", legend)]),
            _panel(ts, "ECC errors per hour",
                   "Volatile double-bit (uncorrectable) and single-bit (corrected) errors; add the "
                   "ECC fields to dcgm-exporter's counters (deploy/monitoring/dcgm-counters.csv).", "short",
                   [(f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{host}}}[1h])", "DBE " + legend),
                    (f"increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{host}}}[1h])", "SBE " + legend)]),
        ]),
        ("Links", [
            _panel(ts, "NVLink throughput", "Profiling fields, bytes per second (headers included).", "Bps",
                   [(f"DCGM_FI_PROF_NVLINK_TX_BYTES{{{host}}}", "tx " + legend),
                    (f"DCGM_FI_PROF_NVLINK_RX_BYTES{{{host}}}", "rx " + legend)]),
            _panel(ts, "PCIe throughput", "Profiling fields, bytes per second (headers included).", "Bps",
                   [(f"DCGM_FI_PROF_PCIE_TX_BYTES{{{host}}}", "tx " + legend),
                    (f"DCGM_FI_PROF_PCIE_RX_BYTES{{{host}}}", "rx " + legend)]),
        ]),
    ]  # fmt: skip
    return _dashboard("ddtk-gpu-fleet", "ddtk · GPU fleet (DCGM)",
                      "NVIDIA dcgm-exporter metrics of every GPU node.", ["gpu", "dcgm"],
                      [("host", "Host", "label_values(DCGM_FI_DEV_GPU_UTIL, Hostname)")], rows)  # fmt: skip


DASHBOARDS = {
    "training.json": training_dashboard,
    "ray-train.json": ray_train_dashboard,
    "gpu-fleet.json": gpu_fleet_dashboard,
}


def dump(dashboard: dict[str, Any]) -> str:
    """The JSON text committed for a dashboard: sorted keys, two-space indent."""
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_deploy(folder: str | Path = DEPLOY) -> list[Path]:
    """Build, check and write every dashboard to ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in DASHBOARDS.items():
        board = build()
        check(board)
        (folder / name).write_text(dump(board))
        written.append(folder / name)
    return written


# ---------------------------------------------------------------- validation


def _type_problems(value: Any, hint: Any, where: str) -> list[str]:
    """Where ``value`` does not have the type ``hint`` (a model's field annotation)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any or hint is object:
        return []
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return [] if type(None) in args else [f"{where}: must not be null"]
        exact = [a for a in args if isinstance(a, type) and type(value) is a]
        tries = [_type_problems(value, a, where) for a in exact or [a for a in args if a is not type(None)]]
        return [] if any(not t for t in tries) else min(tries, key=len)
    if hint is type(None):
        return [] if value is None else [f"{where}: expected null, got {value!r}"]
    if origin is typing.Literal:
        return [] if value in args else [f"{where}: expected one of {list(args)}, got {value!r}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in _type_problems(v, args[0], f"{where}[{i}]")] if args else []
    if origin is dict:
        return [] if isinstance(value, dict) else [f"{where}: expected an object, got {type(value).__name__}"]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        allowed = [m.value for m in hint]
        ok = value in allowed and not isinstance(value, bool)
        return [] if ok else [f"{where}: expected one of {allowed}, got {value!r}"]
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return [] if ok else [f"{where}: expected a number, got {value!r}"]
    if hint in (int, str, bool):
        ok = isinstance(value, hint) and (hint is bool or not isinstance(value, bool))
        return [] if ok else [f"{where}: expected {hint.__name__}, got {value!r}"]
    if isinstance(hint, type) and hint.__module__.startswith("grafana_foundation_sdk"):
        if not isinstance(value, hint):
            return [f"{where}: expected {hint.__name__}, got {type(value).__name__}"]
        return _model_problems(value, where)  # the value's own class: a query's, a panel's
    return []


def _model_problems(model: Any, where: str) -> list[str]:
    """Type problems of every annotated field of an SDK model object, recursively."""
    try:
        hints = typing.get_type_hints(type(model))
    except Exception:  # a model whose annotations cannot be resolved: nothing to check
        return []
    out = []
    for name, hint in hints.items():
        if hasattr(model, name):
            out += _type_problems(getattr(model, name), hint, f"{where}.{name}")
    return out


def _diff(a: Any, b: Any, where: str) -> list[str]:
    """Paths where ``b`` (the round trip) differs from ``a`` (the input)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: not a field of Grafana's model (dropped)" for k in a if k not in b]
        return out + [p for k in a if k in b for p in _diff(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in _diff(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} comes back as {b!r}"]


def _panel_problems(panels: list[dict[str, Any]]) -> list[str]:
    from grafana_foundation_sdk.cog import runtime

    out, ids = [], []
    for i, panel in enumerate(panels):
        where = f"panels[{i}] ({panel.get('title', '?')})"
        kind = panel.get("type")
        ids.append(panel.get("id"))
        if kind != "row" and runtime.panelcfg_config(kind or "") is None:
            out.append(f"{where}: unknown panel type {kind!r}")
        grid = panel.get("gridPos") or {}
        if not grid or grid.get("x", 0) + grid.get("w", 0) > GRID_COLUMNS:
            out.append(f"{where}: gridPos {grid} does not fit Grafana's {GRID_COLUMNS} columns")
        refs = [t.get("refId") for t in panel.get("targets", [])]
        if len(set(refs)) != len(refs) or not all(refs):
            out.append(f"{where}: every query needs its own refId, got {refs}")
        for t in panel.get("targets", []):
            if not str(t.get("expr", "")).strip():
                out.append(f"{where}: query {t.get('refId')} has no PromQL expr")
    if len(set(ids)) != len(ids):
        out.append(f"panel ids are not unique: {ids}")
    return out


def validate(dashboard: dict[str, Any]) -> list[str]:
    """Every problem of a dashboard's JSON, as ``path: message`` strings (empty when valid)."""
    from grafana_foundation_sdk.models.dashboard import Dashboard

    _sdk()
    if not isinstance(dashboard, dict):
        return [f"dashboard: expected a JSON object, got {type(dashboard).__name__}"]
    try:
        model = Dashboard.from_json(dashboard)
        again = to_json(model)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        return [f"dashboard: Grafana's model cannot read it ({type(exc).__name__}: {exc})"]
    problems = _diff(dashboard, again, "dashboard") + _model_problems(model, "dashboard")
    if not dashboard.get("uid") or not dashboard.get("title"):
        problems.append("dashboard: needs a uid and a title")
    return problems + _panel_problems(dashboard.get("panels") or [])


def check(dashboard: dict[str, Any]) -> None:
    """Raise :class:`DashboardError` listing every problem of ``dashboard``."""
    problems = validate(dashboard)
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise DashboardError(f"{len(problems)} problem(s) in dashboard "
                             f"{dashboard.get('uid', '?') if isinstance(dashboard, dict) else '?'}:\n{listed}")  # fmt: skip


# ---------------------------------------------------------------- reading the panels back


@dataclass(frozen=True)
class PanelQuery:
    """One query of one panel, with Grafana's variables filled in: ready for Prometheus."""

    title: str
    unit: str
    expr: str
    legend: str


def panel_queries(dashboard: dict[str, Any], variables: dict[str, str] | None = None,
                  rate_interval: str = "1m") -> list[PanelQuery]:  # fmt: skip
    """Each panel's queries in order, ``$__rate_interval`` set to ``rate_interval`` and
    ``$name`` to ``variables[name]`` (default ``.+``: every value, as Grafana's "All")."""
    values = {"__rate_interval": rate_interval, "__interval": rate_interval, **(variables or {})}

    def fill(expr: str) -> str:
        return re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), ".+"), expr)

    return [
        PanelQuery(p.get("title", ""), p.get("fieldConfig", {}).get("defaults", {}).get("unit", ""),
                   fill(t["expr"]), t.get("legendFormat", ""))
        for p in dashboard.get("panels", []) if p.get("type") != "row"
        for t in p.get("targets", [])
    ]  # fmt: skip


def legend(template: str, labels: dict[str, str]) -> str:
    """A series name as Grafana writes it from ``legendFormat`` (``rank {{rank}}`` -> ``rank 1``)."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template) or str(labels)


def plot_panels(prom: Any, dashboard: dict[str, Any], start: float, end: float, step: float = 1.0,
                variables: dict[str, str] | None = None, rate_interval: str = "10s",
                title: str = "") -> Any:  # fmt: skip
    """Draw every panel of ``dashboard`` from range queries to ``prom`` (a
    :class:`~ddtk.monitoring.prometheus.PrometheusServer`) between Unix times ``start`` and
    ``end``: one matplotlib axis per panel, x in seconds from ``start``. Returns the figure."""
    import matplotlib.pyplot as plt

    queries = panel_queries(dashboard, variables, rate_interval)
    titles = list(dict.fromkeys(q.title for q in queries))
    cols = 2
    fig, axes = plt.subplots((len(titles) + cols - 1) // cols, cols, figsize=(11, 2.4 * ((len(titles) + 1) // 2)),
                             squeeze=False)  # fmt: skip
    for ax, panel in zip(axes.flat, titles):
        unit = ""
        for q in (q for q in queries if q.title == panel):
            unit = q.unit
            for series in prom.query_range(q.expr, start, end, step):
                xs = [t - start for t, _ in series.points]
                ax.plot(xs, [v for _, v in series.points], label=legend(q.legend, series.labels), lw=1.2)
        ax.set_title(panel, fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
        if ax.has_data():
            ax.legend(fontsize=6, loc="best")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    for ax in list(axes.flat)[len(titles):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("seconds", fontsize=8)
    fig.suptitle(title or dashboard.get("title", ""), fontsize=10)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    for path in write_deploy():
        print(f"wrote {path}")
