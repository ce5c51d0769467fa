"""The two basic criteria: a valid manifest with its files, and a clean run on N ranks."""

from __future__ import annotations

from pathlib import Path

from ddtk.project.evidence import distribution_problems, observed
from ddtk.project.manifest import ManifestError, ProjectSpec, load_project
from ddtk.project.rubric import Criterion, CriterionResult
from ddtk.project.run import RunResult, new_run_folder, run


def files_and_manifest(
    criterion: Criterion, root: Path
) -> tuple[CriterionResult, ProjectSpec | None]:
    """project.yaml is valid and the entry point and design document it declares exist."""
    try:
        spec = load_project(root)
    except ManifestError as exc:
        return CriterionResult(criterion, "fail", str(exc)), None
    inside = root.resolve()
    outside = [
        f"{key} {path.relative_to(root)}"
        for key, path in spec.declared_files().items()
        if path.exists() and inside not in path.resolve().parents
    ]
    if outside:
        return CriterionResult(
            criterion, "fail",
            "declared file resolves outside the submission (a link out of the folder): "
            + ", ".join(outside),
        ), None  # fmt: skip
    missing = [
        f"{key} {path.relative_to(root)}"
        for key, path in spec.declared_files().items()
        if not path.is_file()
    ]
    if missing:
        return CriterionResult(
            criterion, "fail", "declared file missing: " + ", ".join(missing)
        ), spec
    measured = {"name": spec.name, "entry": spec.entry, "ranks": spec.ranks, "steps": spec.steps}
    return CriterionResult(
        criterion, "pass", f"project.yaml valid; {spec.entry} and {spec.design} exist", measured
    ), spec


def checksums_agree(result: RunResult) -> str | None:
    """None when every rank ended with the same parameter checksum, else what differs."""
    sums = {rank: m["param_checksum"] for rank, m in sorted(result.metrics.items())}
    if len(set(sums.values())) <= 1:
        return None
    return "ranks disagree on the final parameters: " + ", ".join(
        f"rank {r} {s[:12]}" for r, s in sums.items()
    )


def runs_on_n_ranks(
    criterion: Criterion, spec: ProjectSpec, work: Path, timeout_s: float,
    hide: tuple[Path, ...] = (),
) -> tuple[CriterionResult, RunResult]:  # fmt: skip
    """The check run on ``spec.ranks`` ranks exits 0 and every rank reports the full run
    with the same checksum; and the checker saw it: each rank stepped its optimizer
    ``steps`` times in one process, and the ranks exchanged data every step."""
    result = run(spec, spec.ranks, new_run_folder(work), timeout_s, hide=hide)
    measured = {
        "ranks": spec.ranks,
        "seconds": round(result.seconds, 2),
        "returncode": result.returncode,
        **observed(result.probe, spec.global_batch),
    }
    if not result.ok:
        status = "error" if result.timed_out else "fail"
        return CriterionResult(criterion, status, result.failure(), measured), result
    measured["param_checksum"] = result.metrics[0]["param_checksum"]
    problems = distribution_problems(result.probe, spec.ranks, spec.steps)
    disagree = checksums_agree(result)
    if disagree or problems:
        return CriterionResult(criterion, "fail", "; ".join([*problems, disagree or ""]).strip("; "),
                               measured), result  # fmt: skip
    rate = measured.get("samples_per_s")
    message = (
        f"{spec.ranks} ranks ran {spec.steps} steps in {result.seconds:.1f} s; parameters identical "
        f"on every rank; the checker counted {spec.steps} optimizer steps per rank"
        + (f" at {rate:.0f} samples/s" if rate else "")
        + ("" if result.probe.lo_bytes is None else
           f" and {result.probe.lo_bytes / spec.steps / 2**20:.2f} MiB exchanged per step")
    )  # fmt: skip
    return CriterionResult(criterion, "pass", message, measured), result
