"""Score a submission folder against the rubric: run every automatic criterion in order.

Order and prerequisites: ``files-and-manifest`` first (without a valid
project.yaml nothing else can run: every other automatic criterion is an
``error`` naming it); then ``runs-on-N-ranks``, ``survives-sigkill`` (its resumed
run is compared with the check run), ``scaling-study``, ``sharded-state`` (from the
scaling reruns) and ``design-doc`` (it compares with the run's parameter count and
the scaling report). Manual criteria are listed with status ``manual``. Runs go into
a temporary folder that is removed afterwards; each run sees a copy of the submission,
with the original, the rubric and ``solutions/`` hidden where the machine can confine it.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ddtk.project.criteria import files_and_manifest, runs_on_n_ranks
from ddtk.project.designdoc import design_doc
from ddtk.project.evidence import sharding
from ddtk.project.manifest import ProjectSpec
from ddtk.project.rubric import Criterion, CriterionResult, Rubric
from ddtk.project.scaling import scaling_study
from ddtk.project.sigkill import survives_sigkill


@dataclass
class ProjectResult:
    """Every criterion's result, in rubric order."""

    root: Path
    rubric: Rubric
    name: str | None = None
    results: list[CriterionResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def earned(self) -> int:
        """Points earned on the automatic criteria."""
        return sum(r.earned or 0 for r in self.results)

    @property
    def exit_code(self) -> int:
        """0 when every automatic criterion passed, 1 otherwise."""
        auto = [r for r in self.results if r.criterion.kind == "automatic"]
        return 0 if auto and all(r.status == "pass" for r in auto) else 1


def _blocked(criterion: Criterion, reason: str) -> CriterionResult:
    return CriterionResult(criterion, "error", f"not evaluated: {reason}")


def _unmeasured(result: CriterionResult, found: dict[str, CriterionResult]) -> CriterionResult:
    """A design document that passes only counts when the runs its numbers are compared
    with passed too: numbers checked against nothing measured prove nothing."""
    unmet = [
        i for i in ("runs-on-N-ranks", "scaling-study") if i in found and found[i].status != "pass"
    ]
    if result.status != "pass" or not unmet:
        return result
    return _blocked(result.criterion, f"its numbers are compared with {' and '.join(unmet)}, "
                    "which did not pass")  # fmt: skip


def _sharded(criterion: Criterion, probes: dict | None) -> CriterionResult:
    """The second strategy, from the per-rank bytes the scaling reruns' probes saw."""
    if not probes or 1 not in probes or len(probes) < 2:
        return _blocked(criterion, "it reads the scaling study's reruns, which did not all run")
    problem, held = sharding(probes, float(criterion.params.get("rtol", 0.25)))
    if problem:
        return CriterionResult(criterion, "fail", problem, held)
    key = "state_bytes" if held["state_bytes"].get(1) else "param_bytes"
    pairs = ", ".join(f"{n}: {b / 2**20:.2f} MiB" for n, b in held[key].items())
    return CriterionResult(
        criterion, "pass", f"per-rank optimizer {key.split('_')[0]} shrinks about as 1/N ({pairs})",
        held,
    )  # fmt: skip


def check_project(
    root: str | Path, rubric: Rubric, timeout_s: float | None = None
) -> ProjectResult:
    """Check the submission in ``root``; ``timeout_s`` overrides project.yaml's per-run limit."""
    start = time.monotonic()
    root = Path(root).resolve()
    out = ProjectResult(root, rubric)
    found: dict[str, CriterionResult] = {}
    spec: ProjectSpec | None = None
    work = Path(tempfile.mkdtemp(prefix="ddtk-project-"))
    try:
        c = rubric.get("files-and-manifest")
        res, spec = files_and_manifest(
            c or Criterion("files-and-manifest", "automatic", 0, ""), root
        )
        found["files-and-manifest"] = res
        out.name = spec.name if spec else None
        ok = res.status == "pass" and spec is not None
        limit = timeout_s or (spec.timeout_s if spec else 60.0)
        runs: dict = {}
        speedups: dict[int, float] | None = None
        probes: dict | None = None
        hide = (rubric.path.parent,) if rubric.path else ()
        for c in rubric.criteria:
            if c.kind != "automatic" or c.id in found:
                continue
            if not ok or spec is None:
                found[c.id] = _blocked(c, "files-and-manifest failed")
            elif c.id == "runs-on-N-ranks":
                found[c.id], runs[spec.ranks] = runs_on_n_ranks(c, spec, work, limit, hide)
            elif c.id == "survives-sigkill":
                found[c.id] = survives_sigkill(c, spec, work, 2 * limit, runs.get(spec.ranks), hide)
            elif c.id == "scaling-study":
                found[c.id], report, probes = scaling_study(c, spec, work, limit, hide)
                speedups = {n: e["speedup"] for n, e in report.items()} if report else None
            elif c.id == "sharded-state":
                found[c.id] = _sharded(c, probes)
            elif c.id == "design-doc":
                first = runs.get(spec.ranks)
                params = first.metrics.get(0, {}).get("parameters") if first and first.ok else None
                params = (
                    params if isinstance(params, int) and not isinstance(params, bool) else None
                )
                found[c.id] = _unmeasured(
                    design_doc(c, root / spec.design, params, speedups), found
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for c in rubric.criteria:
        if c.kind == "manual":
            out.results.append(CriterionResult(c, "manual", "graded by the instructor"))
        elif c.id in found:
            out.results.append(found[c.id])
    out.seconds = time.monotonic() - start
    return out
