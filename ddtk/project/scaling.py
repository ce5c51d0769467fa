"""The scaling study: the submission's report against the checker's own runs at 1, 2 and 4 ranks.

The report (``reports.scaling``, JSON) lists one entry per world size::

    {"runs": [{"ranks": 1, "throughput": 950.0, "speedup": 1.0, "efficiency": 1.0}, ...]}

with throughput in global samples/s (all ranks together) from the check
configuration. The checker verifies that speedup = throughput / throughput at 1 rank
and efficiency = speedup / ranks (relative tolerance ``consistency_rtol``), reruns the
check configuration at each world size and times it itself: throughput is
``check.global_batch`` samples per optimizer step over the steps the checker's probe
saw arrive (:mod:`ddtk.project.observe`), on the checker's clock, never the program's
own report. Each measured speedup must lie within ``speedup_rtol`` (25 %) of the
reported one, and a reported speedup (> 1) where the checker measured a slowdown
(< 1) fails whatever the tolerance.
Speedups, not absolute throughputs, are compared, because they depend much less on
the machine and its load.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ddtk.project.evidence import distribution_problems
from ddtk.project.manifest import ProjectSpec
from ddtk.project.observe import Probe, samples_per_s
from ddtk.project.rubric import Criterion, CriterionResult
from ddtk.project.run import new_run_folder, run


class ReportError(ValueError):
    """The scaling report is missing or malformed."""


def _number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def read_report(path: Path, ranks: list[int], rtol: float) -> dict[int, dict[str, float]]:
    """The report's entries by world size, checked for format and internal consistency."""
    if not path.is_file():
        raise ReportError(
            f"no scaling report at {path.name}: run your scaling study at {ranks} ranks and save its JSON there"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ReportError(f"the scaling report {path.name} is not valid JSON") from None
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list):
        raise ReportError(f"the scaling report {path.name} has no 'runs' list")
    table: dict[int, dict[str, float]] = {}
    for entry in runs:
        if isinstance(entry, dict) and isinstance(entry.get("ranks"), int):
            table[entry["ranks"]] = entry
    for n in ranks:
        entry = table.get(n)
        if entry is None:
            raise ReportError(f"the scaling report has no entry for {n} ranks")
        bad = [k for k in ("throughput", "speedup", "efficiency") if not _number(entry.get(k))]
        if bad:
            raise ReportError(
                f"the scaling report's entry for {n} ranks has no valid {bad[0]!r} (a number > 0)"
            )
    base = table[ranks[0]]["throughput"]
    for n in ranks:
        e = table[n]
        if not math.isclose(e["speedup"], e["throughput"] / base, rel_tol=rtol):
            raise ReportError(
                f"the scaling report's speedup at {n} ranks is {e['speedup']}, its throughputs give {e['throughput'] / base:.3f}"
            )
        if not math.isclose(e["efficiency"], e["speedup"] / n * ranks[0], rel_tol=rtol):
            raise ReportError(
                f"the scaling report's efficiency at {n} ranks is {e['efficiency']}, speedup / ranks gives {e['speedup'] / n:.3f}"
            )
    return {n: table[n] for n in ranks}


def scaling_study(
    criterion: Criterion, spec: ProjectSpec, work: Path, timeout_s: float,
    hide: tuple[Path, ...] = (),
) -> tuple[CriterionResult, dict[int, dict[str, float]] | None, dict[int, Probe]]:  # fmt: skip
    """Check the report, rerun every world size back to back (so the machine's load drifts
    least) timing each run itself, compare; also return what each rerun's probe saw."""
    ranks = [int(n) for n in criterion.params.get("ranks", [1, 2, 4])]
    tol = float(criterion.params.get("speedup_rtol", 0.25))
    rtol = float(criterion.params.get("consistency_rtol", 0.02))
    try:
        report = read_report(spec.root / spec.scaling, ranks, rtol)
    except ReportError as exc:
        return CriterionResult(criterion, "fail", f"{exc}; nothing was rerun"), None, {}
    measured: dict[str, Any] = {"reported_speedup": {n: report[n]["speedup"] for n in ranks}}
    results: dict[int, float] = {}
    probes: dict[int, Probe] = {}
    for n in ranks:
        res = run(spec, n, new_run_folder(work), timeout_s, hide=hide)
        if not res.ok or res.probe is None:
            return CriterionResult(
                criterion, "error", f"could not rerun the study: {res.failure()}", measured
            ), report, probes  # fmt: skip
        probes[n] = res.probe
        unseen = distribution_problems(res.probe, n, spec.steps)
        rate = samples_per_s(res.probe.final()[0], spec.global_batch) if not unseen else None
        if rate is None:
            why = "; ".join(unseen) or "too few optimizer steps to time"
            return CriterionResult(
                criterion, "fail", f"the checker could not time the {n}-rank rerun: {why}", measured
            ), report, probes  # fmt: skip
        results[n] = rate
    speedups = {n: results[n] / results[ranks[0]] for n in ranks}
    measured["measured_throughput"] = {n: round(t, 2) for n, t in results.items()}
    measured["measured_speedup"] = {n: round(s, 3) for n, s in speedups.items()}
    problem = compare_speedups({n: report[n]["speedup"] for n in ranks}, speedups, tol)
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    measured["load_average"] = round(load, 2)
    if problem:
        if load > cores / 2:  # other work shared the cores: a 1-rank run suffers most
            problem += (f"; this machine's load average was {load:.1f} on {cores} cores during "
                        "the reruns: check on a quiet machine before you trust the comparison")  # fmt: skip
        return CriterionResult(criterion, "fail", problem, measured), report, probes
    pairs = ", ".join(f"{n}: {report[n]['speedup']:.2f} vs {speedups[n]:.2f}" for n in ranks)
    return CriterionResult(
        criterion, "pass",
        f"speedups reported vs timed by the checker within {tol:.0%} ({pairs})", measured,
    ), report, probes  # fmt: skip


def compare_speedups(
    reported: dict[int, float], measured: dict[int, float], rtol: float
) -> str | None:
    """Why the reported speedups disagree with the measured ones, or None when they agree.

    A reported speedup (> 1) over a measured slowdown (< 1) always disagrees; otherwise
    each measured speedup must be within ``rtol`` of the reported one.

    >>> compare_speedups({1: 1.0, 2: 1.9}, {1: 1.0, 2: 0.8}, 0.25)
    'the report claims a speedup at [2] ranks where the checker measured a slowdown (1: 1.00 vs 1.00, 2: 1.90 vs 0.80)'
    >>> compare_speedups({1: 1.0, 2: 0.8}, {1: 1.0, 2: 0.92}, 0.25) is None
    True
    >>> compare_speedups({1: 1.0, 2: 0.8}, {1: 1.0, 2: 1.6}, 0.25)
    'reported vs measured speedup differ by more than 25% at [2] ranks (1: 1.00 vs 1.00, 2: 0.80 vs 1.60)'
    """
    pairs = ", ".join(f"{n}: {reported[n]:.2f} vs {measured[n]:.2f}" for n in sorted(reported))
    claimed = [n for n in sorted(reported) if reported[n] > 1 and measured[n] < 1]
    if claimed:
        return f"the report claims a speedup at {claimed} ranks where the checker measured a slowdown ({pairs})"
    off = [n for n in sorted(reported) if abs(measured[n] / reported[n] - 1) > rtol]
    if off:
        return (
            f"reported vs measured speedup differ by more than {rtol:.0%} at {off} ranks ({pairs})"
        )
    return None
