"""Alerting and recording rules for training jobs and GPUs, defined once, written twice.

The rules live here as data (:func:`rule_groups`); :func:`rule_file` writes them as a
plain Prometheus rule file (``rule_files:`` of a Prometheus on a Slurm head node, or of
:class:`~ddtk.monitoring.prometheus.PrometheusServer`), :func:`prometheus_rule` as the
``PrometheusRule`` object that the Prometheus operator (kube-prometheus-stack) loads.
``deploy/monitoring/`` holds both, generated with the defaults (:func:`write_deploy`);
a test checks they equal a fresh generation, and ``promtool`` checks and unit-tests them.

What the alerts watch, and why each threshold is where it is (all in :class:`RuleParams`):

* **TrainingJobHung**: no rank of a job finished a step for ``hang_after``. Synchronous
  ranks stall together, so one alert per job. Default 5 min: above the longest normal gap
  between two steps of the kit's jobs (a checkpoint save, an evaluation pass: raise it if
  yours take longer), below PyTorch's default 10-minute collective timeout, so the alert
  arrives while the stuck processes still exist to be inspected.
* **TrainingStraggler**: one rank's *busy* time per step (step time minus exposed
  communication, from :mod:`ddtk.profiling`'s shares) above ``straggler_factor`` times the
  job's median. Not the step time: synchronous ranks leave every all-reduce together, so
  their step times are equal and the fast ranks' extra time is waiting. A uniformly slow
  job has no straggler. The median over ranks, not the mean, so one slow rank does not
  move the reference.
* **TrainingCheckpointOverdue**: the job's newest committed checkpoint is older than
  ``checkpoint_slack`` times the Young/Daly interval it declared. Slack 2: by then a whole
  checkpoint was missed (the next one was due one interval after the last, plus its few
  seconds of writing), so the alert means a failing or skipped checkpoint, not a slow one;
  and near the optimum the expected overhead is flat (first order: at twice the interval
  it is 25% above the minimum), so being late by less costs little.
* **TrainingRestarting**: ``restarts_max`` or more restarts within ``restarts_window``:
  a crash loop (a bad node, out of memory, a bug after resume). Counted from the highest
  and lowest ``ddtk_restarts_total`` the job's ranks showed in the window, because a
  restarted rank is a new series (new port, new pod) that starts at the new count.
* **GpuXidHardware** / **GpuXid**: DCGM's ``DCGM_FI_DEV_XID_ERRORS`` holds the last XID
  a GPU reported. XIDs that NVIDIA's XID catalogue attributes to the hardware or its
  firmware (:data:`HARDWARE_XIDS`) page; the others are usually the application's own
  fault (13, 31, 43: an illegal memory access, a kernel exception) and warn.
* **GpuEccUncorrectable** / **GpuEccCorrected**: double-bit (uncorrectable) volatile ECC
  errors in ``ecc_window``; single-bit (corrected) ones above ``sbe_per_hour``, an
  assumption to tune to the fleet (NVIDIA publishes no threshold; the driver itself
  raises XID 92 for a high single-bit rate). dcgm-exporter's default counters leave the
  ECC fields out: ``deploy/monitoring/dcgm-counters.csv`` adds them.

>>> [r["alert"] for g in rule_groups() for r in g["rules"] if "alert" in r][:4]
['TrainingJobHung', 'TrainingStraggler', 'TrainingCheckpointOverdue', 'TrainingRestarting']
>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "ddtk.rules"
>>> _ = path.write_text(rule_file(RuleParams(straggler_factor=2.0)))
>>> print(check_rules(path))  # doctest: +ELLIPSIS
Checking .../ddtk.rules
  SUCCESS: 13 rules found
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from ddtk.monitoring.prometheus import PrometheusError, find_binary

__all__ = [
    "HARDWARE_XIDS",
    "RuleCheckError",
    "RuleParams",
    "check_rules",
    "prometheus_rule",
    "rule_file",
    "rule_groups",
    "unit_test_rules",
    "write_deploy",
]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
RULE_FILE = "ddtk-training.rules"
PROMETHEUS_RULE = "prometheusrule.yaml"
# XIDs NVIDIA's catalogue attributes to the GPU, its memory, NVLink or firmware:
# 48 double-bit ECC, 61/62 internal micro-controller breakpoint/halt, 63/64 ECC page
# retirement or row remapping event/failure, 74 NVLink error, 79 fallen off the bus,
# 92 high single-bit ECC rate, 94/95 contained/uncontained ECC error, 119/120 GSP error.
HARDWARE_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120)
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d))+$")


class RuleCheckError(PrometheusError):
    """``promtool`` rejected a rule file or a rule unit test; the message is promtool's."""


@dataclass(frozen=True)
class RuleParams:
    """Every threshold and window of the rules; the defaults are for a cluster scraped every
    15–30 s. A demo on a laptop shortens the windows and ``for`` durations."""

    window: str = "5m"  # rate() window of the recording rules (>= 4 scrape intervals)
    hang_after_s: float = 300.0
    hang_for: str = "1m"
    straggler_factor: float = 1.5
    straggler_for: str = "10m"
    checkpoint_slack: float = 2.0
    restarts_window: str = "1h"
    restarts_max: int = 3
    ecc_window: str = "10m"
    sbe_per_hour: float = 10.0
    gpu_for: str = "0m"

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, str) and not _DURATION.match(value):
                raise ValueError(f"RuleParams.{name} must be a Prometheus duration such as 30s or 5m, got {value!r}")
            if not isinstance(value, str) and not value > 0 and name != "sbe_per_hour":
                raise ValueError(f"RuleParams.{name} must be > 0, got {value!r}")
        if self.straggler_factor <= 1:
            raise ValueError(f"RuleParams.straggler_factor must be > 1, got {self.straggler_factor}")


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description},
    }


def _training_records(p: RuleParams) -> list[dict[str, Any]]:
    """Recording rules: each alert and dashboard reads these instead of recomputing them."""
    w = p.window
    return [
        {"record": "job_rank:ddtk_step_seconds:mean",
         "expr": f"sum by (job, rank) (rate(ddtk_step_seconds_sum[{w}]))\n"
                 f"  / sum by (job, rank) (rate(ddtk_step_seconds_count[{w}]))"},
        {"record": "job_rank:ddtk_step_seconds:p99",
         "expr": f"histogram_quantile(0.99, sum by (job, rank, le) (rate(ddtk_step_seconds_bucket[{w}])))"},
        {"record": "job:ddtk_samples:rate",
         "expr": f"sum by (job) (rate(ddtk_samples_total[{w}]))"},
        # busy = step time not spent waiting in exposed communication; a rank without a
        # profiled window yet counts its whole step
        {"record": "job_rank:ddtk_step_busy_seconds:mean",
         "expr": "job_rank:ddtk_step_seconds:mean\n"
                 '  * on (job, rank) (1 - max by (job, rank) (ddtk_step_share_ratio{part="communication"}))\n'
                 "or job_rank:ddtk_step_seconds:mean"},
        {"record": "job:ddtk_step_busy_seconds:median",
         "expr": "quantile by (job) (0.5, job_rank:ddtk_step_busy_seconds:mean)"},
    ]  # fmt: skip


def _training_alerts(p: RuleParams) -> list[dict[str, Any]]:
    return [
        _alert("TrainingJobHung",
               f"time() - max by (job) (ddtk_last_step_timestamp_seconds) > {p.hang_after_s:g}",
               p.hang_for, "critical",
               "{{ $labels.job }}: no rank finished a step for {{ $value | humanizeDuration }}",
               "Every rank of the job is stuck, usually inside a collective that one rank never "
               "joined. While the processes live: `py-spy dump --pid PID` on each rank shows which "
               "one is elsewhere (a data loader, a dead peer, a deadlock); with "
               "`TORCH_NCCL_TRACE_BUFFER_SIZE` set, `TORCH_NCCL_DUMP_ON_TIMEOUT=1` dumps NCCL's "
               "flight recorder when the collective times out. Then restart from the "
               "last checkpoint, without the node if it is at fault."),
        _alert("TrainingStraggler",
               "job_rank:ddtk_step_busy_seconds:mean\n"
               "  / on (job) group_left () job:ddtk_step_busy_seconds:median\n"
               f"> {p.straggler_factor:g}",
               p.straggler_for, "warning",
               "{{ $labels.job }}: rank {{ $labels.rank }} computes {{ $value | printf \"%.2f\" }}x "
               "the median rank",
               "One rank is busy longer per step than the others, which wait for it in every "
               "all-reduce, so the whole job runs at its pace. Check that node: "
               "`nvidia-smi -q -d PERFORMANCE` (thermal or power throttling), `dcgmi diag -r 1`, "
               "its network link (`ibstat`), a noisy neighbour, an uneven data shard. "
               "Drain or replace it, or give it less work."),
        _alert("TrainingCheckpointOverdue",
               "min by (job) (time() - ddtk_last_checkpoint_timestamp_seconds)\n"
               f"> {p.checkpoint_slack:g} * max by (job) (ddtk_checkpoint_interval_seconds > 0)",
               "0m", "warning",
               "{{ $labels.job }}: last checkpoint {{ $value | humanizeDuration }} ago, "
               f"over {p.checkpoint_slack:g}x its interval",
               "At least one scheduled checkpoint was not committed, so a failure now loses "
               "more work than the interval was chosen for. Look at the checkpoint writer's log "
               "(storage full or slow, a failed upload, a background save that never "
               "finished) and at the storage's health before the next failure."),
        _alert("TrainingRestarting",
               f"max by (job) (max_over_time(ddtk_restarts_total[{p.restarts_window}]))\n"
               f"  - min by (job) (min_over_time(ddtk_restarts_total[{p.restarts_window}]))\n"
               f">= {p.restarts_max}",
               "0m", "warning",
               "{{ $labels.job }}: {{ $value }} restarts in " + p.restarts_window,
               "The job keeps failing and resuming: each restart costs the reload and the work "
               "since the last checkpoint. Read the first failure in the launcher's log (torchrun "
               "names the failed rank and its exit code): out of memory, a bad node (see the GPU "
               "alerts), or a bug that recurs after resuming."),
    ]  # fmt: skip


def _gpu_alerts(p: RuleParams) -> list[dict[str, Any]]:
    hardware = " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x in HARDWARE_XIDS)
    where = "{{ $labels.Hostname }} GPU {{ $labels.gpu }}"
    return [
        _alert("GpuXidHardware", hardware, p.gpu_for, "critical",
               f"{where}: XID {{{{ $value }}}}, a hardware or firmware error",
               "NVIDIA's XID catalogue attributes this XID to the GPU, its memory, NVLink or "
               "firmware. Drain the node (`kubectl drain` / `scontrol update state=drain`), run "
               "`dcgmi diag -r 3` and read `nvidia-smi -q` and the kernel log (`dmesg | grep -i "
               "xid`); jobs on it restart from their last checkpoint elsewhere."),
        _alert("GpuXid", f"DCGM_FI_DEV_XID_ERRORS > 0 unless ({hardware})", p.gpu_for, "warning",
               f"{where}: XID {{{{ $value }}}}",
               "Most other XIDs (13, 31, 43: an illegal memory access, a kernel exception) come "
               "from the application: read the failing job's log first. If the same GPU keeps "
               "reporting them under different jobs, treat it as hardware."),
        _alert("GpuEccUncorrectable", f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[{p.ecc_window}]) > 0",
               p.gpu_for, "critical",
               f"{where}: uncorrectable (double-bit) ECC error",
               "Memory returned data the ECC could not correct: results computed on this GPU "
               "since the last checkpoint may be wrong. Restart the job from that checkpoint "
               "without this GPU, drain the node and have the page retirement or row remapping "
               "checked (`nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT`)."),
        _alert("GpuEccCorrected",
               f"increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[1h]) > {p.sbe_per_hour:g}",
               p.gpu_for, "warning",
               f"{where}: {{{{ $value }}}} corrected (single-bit) ECC errors in an hour",
               "Corrected errors cost nothing now, but a GPU that keeps producing them is "
               "degrading. Watch for retired pages and remapped rows "
               "(`DCGM_FI_DEV_RETIRED_SBE`, `DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS`) and plan "
               "to replace it at the next maintenance."),
    ]  # fmt: skip


def rule_groups(params: RuleParams | None = None) -> list[dict[str, Any]]:
    """The rule groups (``groups:`` of a rule file): training records and alerts, then GPUs.

    Rules of a group are evaluated in order, so the alerts see this round's recordings.
    """
    p = params or RuleParams()
    return [
        {"name": "ddtk-training", "rules": [*_training_records(p), *_training_alerts(p)]},
        {"name": "ddtk-gpu", "rules": _gpu_alerts(p)},
    ]


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line PromQL as literal blocks, as a person would write it."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def rule_file(params: RuleParams | None = None) -> str:
    """The rules as a Prometheus rule file (YAML text)."""
    head = "# Generated by ddtk.monitoring.alerts (python -m ddtk.monitoring.alerts); do not edit.\n"
    return head + _dump({"groups": rule_groups(params)})


def prometheus_rule(params: RuleParams | None = None, name: str = "ddtk-training",
                    release: str = "kube-prometheus-stack") -> str:  # fmt: skip
    """The rules as a ``PrometheusRule`` (YAML text). kube-prometheus-stack's Prometheus loads
    the objects labelled ``release: <its Helm release>``."""
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "labels": {"release": release, "app.kubernetes.io/part-of": "ddtk"}},
        "spec": {"groups": rule_groups(params)},
    }
    return (
        "# Generated by ddtk.monitoring.alerts (python -m ddtk.monitoring.alerts); do not edit.\n"
        "#   kubectl apply -n monitoring -f deploy/monitoring/prometheusrule.yaml\n" + _dump(doc)
    )


def write_deploy(folder: str | Path = DEPLOY) -> list[Path]:
    """Write the rule file and the PrometheusRule with the default parameters."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in ((RULE_FILE, rule_file()), (PROMETHEUS_RULE, prometheus_rule())):
        (folder / name).write_text(text)
        written.append(folder / name)
    return written


def _promtool(*args: str) -> str:
    """Run ``promtool`` and return its output; :class:`RuleCheckError` with that output on failure."""
    done = subprocess.run([find_binary("promtool"), *args], capture_output=True, text=True, timeout=60)
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise RuleCheckError(f"promtool {' '.join(args[:2])} failed (exit {done.returncode}):\n{output}")
    return output


def check_rules(*paths: str | Path) -> str:
    """``promtool check rules``: syntax, PromQL and templates of each rule file, with its lint
    (two rules recording the same series) an error too."""
    if not paths:
        raise ValueError("check_rules needs at least one rule file")
    return _promtool("check", "rules", "--lint-fatal", *(str(p) for p in paths))


def unit_test_rules(*paths: str | Path) -> str:
    """``promtool test rules``: run rule unit tests (input series, expected alerts and values)."""
    if not paths:
        raise ValueError("unit_test_rules needs at least one unit-test file")
    return _promtool("test", "rules", *(str(p) for p in paths))


if __name__ == "__main__":
    for path in write_deploy():
        print(f"wrote {path}")
