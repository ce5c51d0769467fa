"""A real job watched by a real Prometheus: the alerts fire live, PromQL reads back what happened.

One run for the module (about 10-15 s): :func:`ddtk.monitoring.watch.watch_job` starts
Prometheus with the demo rules, then the ``straggler`` job on 2 ranks (``ddtk.launch``,
DDP over gloo) with rank 1 computing 100 ms longer per step, every rank exporting its
metrics and TensorBoard scalars. Beside it Prometheus scrapes a planted hang: an exporter
in this process that finished one step and then stopped, as a stuck rank looks from
outside (alive, serving its page, no progress). Both alerts must fire while the job runs,
each on its own job and rank only, and what Prometheus stored must agree with what the
job itself measured and wrote (its throughput, its profiled trace, its TensorBoard files).
"""

from __future__ import annotations

import math
from pathlib import Path

import psutil
import pytest
from support import import_or_require, nothing_listens_on, require_or_skip

from ddtk.monitoring.exporter import TrainingMetrics, shares_from_trace
from ddtk.monitoring.prometheus import PrometheusNotInstalled, ScrapeJob, find_binary

pytestmark = pytest.mark.distributed

JOB = "ddtk-demo"
STEPS = 40  # timed steps after the profiled window: about 5 s at 130 ms a step


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The watched run, with the server still up; afterwards nothing may be left running."""
    try:
        find_binary("prometheus")
    except PrometheusNotInstalled as exc:
        require_or_skip("prometheus", str(exc))
    import_or_require("tensorboard", "monitoring")
    from ddtk.monitoring.watch import watch_job
    from ddtk.profiling.jobs import job_config

    cfg = job_config("straggler").replace(straggler_ms=100.0, profile_steps=2, timed_steps=STEPS)
    hung = TrainingMetrics(0, 1)
    hung.step(0.05, 8, loss=1.0)  # one step, then nothing: a hang
    try:
        with watch_job(cfg, tmp_path_factory.mktemp("watched"), world_size=2, job_name=JOB,
                       expect=("TrainingStraggler", "TrainingJobHung"),
                       extra_jobs=[ScrapeJob("hung", [f"127.0.0.1:{hung.port}"])]) as watched:  # fmt: skip
            pid = watched.prom._process.pid
            yield watched
    finally:
        hung.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert all(nothing_listens_on(p) for p in watched.ports), f"a rank's metrics port is still taken: {watched.ports}"


def _at(run, expr: str) -> list:
    """``expr`` at the last moment both ranks were scraped (their last page, near the job's end)."""
    if not hasattr(run, "last_scraped"):
        series = run.prom.query_range(f'ddtk_steps_total{{job="{JOB}"}}', run.start, run.end, 0.25)
        assert len(series) == 2, series
        run.last_scraped = min(s.points[-1][0] for s in series)
    return run.prom.query(expr, at=run.last_scraped)


def test_the_planted_alerts_fire_live_on_their_own_job_and_rank(run) -> None:
    straggler, hang = run.fired["TrainingStraggler"], run.fired["TrainingJobHung"]
    assert straggler.labels["job"] == JOB and straggler.labels["rank"] == "1"
    assert straggler.annotations["summary"].startswith(f"{JOB}: rank 1 computes")
    assert hang.labels["job"] == "hung" and hang.labels["severity"] == "critical"
    assert run.seconds["targets up"] < run.seconds["TrainingStraggler firing"] < run.seconds["job done"]
    # Prometheus's own record of its alerts (the ALERTS series) holds no other firing alert
    history = run.prom.query_range('ALERTS{alertstate="firing"}', run.start, run.end, 0.5)
    seen = {(s.labels["alertname"], s.labels["job"], s.labels.get("rank")) for s in history}
    assert seen == {("TrainingStraggler", JOB, "1"), ("TrainingJobHung", "hung", None)}


def test_promql_names_the_straggler_and_the_exposed_communication(run) -> None:
    [top] = _at(run, f'topk(1, job_rank:ddtk_step_busy_seconds:mean{{job="{JOB}"}})')
    assert top.labels["rank"] == "1"
    shares = {s.labels["rank"]: s.value for s in _at(run, f'ddtk_step_share_ratio{{job="{JOB}",part="communication"}}')}
    for rank in ("0", "1"):  # what Prometheus stored is what the rank computed from its trace
        assert shares[rank] == pytest.approx(shares_from_trace(run.trace_dir / f"rank{rank}.json")["communication"])
    assert shares["0"] > 0.5 > shares["1"]  # the fast rank waits for the straggler


def test_promql_throughput_and_step_times_agree_with_the_job(run) -> None:
    [rate] = _at(run, f'job:ddtk_samples:rate{{job="{JOB}"}}')
    assert 0.5 < rate.value / run.job.samples_per_s < 1.5, (rate.value, run.job.samples_per_s)
    p99 = {s.labels["rank"]: s.value for s in _at(run, f'job_rank:ddtk_step_seconds:p99{{job="{JOB}"}}')}
    assert set(p99) == {"0", "1"}
    # synchronous ranks: equal step times, within the histogram bucket that holds the mean step
    step_s = run.job.step_ms / 1e3
    assert all(0.5 * step_s < v <= 2.5 for v in p99.values()), (p99, step_s)
    samples = {s.labels["rank"]: s.value for s in _at(run, f'ddtk_samples_total{{job="{JOB}"}}')}
    steps = {s.labels["rank"]: s.value for s in _at(run, f'ddtk_steps_total{{job="{JOB}"}}')}
    batch, total = run.job.config.batch_size, run.job.config.timed_steps + 4  # + the profiled window
    for rank in ("0", "1"):
        assert samples[rank] == steps[rank] * batch and 0 < steps[rank] <= total


def test_the_dashboards_queries_draw_the_run(run) -> None:
    import_or_require("grafana_foundation_sdk", "monitoring")
    from ddtk.monitoring.dashboards import panel_queries, plot_panels, training_dashboard

    board = training_dashboard()
    found = {}
    for q in panel_queries(board, {"job": JOB}, rate_interval="5s"):
        series = run.prom.query_range(q.expr, run.start, run.end, 0.5)
        found[q.title] = found.get(q.title, 0) + sum(1 for s in series if any(math.isfinite(v) for _, v in s.points))
    assert found["Samples per second"] == 1 and found["Loss by rank"] == 2
    assert found["Step time p50 and p99 by rank"] == 4 and found["Busy time per step by rank"] == 2
    assert found["Step shares by rank (profiled window)"] == 10 and found["Restarts"] == 1
    assert found["Checkpoint age and interval"] == 0  # this job declares no checkpoints
    fig = plot_panels(run.prom, board, run.start, run.end, step=0.5, variables={"job": JOB}, rate_interval="5s")
    assert len([ax for ax in fig.axes if ax.get_visible()]) == len(found)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_tensorboard_holds_every_step_of_every_rank(run) -> None:
    from ddtk.monitoring.tensorboard import TAGS, load_scalars

    steps = run.job.config.timed_steps + 4
    batch = run.job.config.batch_size
    for rank in (0, 1):
        scalars = load_scalars(Path(run.tensorboard_dir) / f"rank{rank}")
        assert set(scalars) == set(TAGS)
        assert [s for s, _ in scalars["train/step_seconds"]] == list(range(1, steps + 1))
        for (_, seconds), (_, per_s) in zip(scalars["train/step_seconds"], scalars["train/samples_per_second"]):
            assert per_s == pytest.approx(batch / seconds, rel=1e-5)
        assert all(math.isfinite(v) and v > 0 for _, v in scalars["train/loss"])

