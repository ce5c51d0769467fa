"""The design document: required sections, no placeholder left, and its numbers recomputed.

The template (``project/starter/DESIGN.md``) ends with a ``## Numbers`` section
holding one fenced ``yaml`` block. The checker recomputes from it:

* ``young_interval_s`` = sqrt(2 ``checkpoint_cost_s`` ``mtbf_s``) and ``daly_interval_s``
  (:mod:`ddtk.checkpoint.interval`);
* ``checkpoint_every_steps`` = Young's or Daly's interval / ``step_time_s``;
* ``model_state_bytes_per_rank`` = ``parameters`` x ZeRO bytes per parameter for
  ``zero_stage`` at ``world_size`` (:func:`ddtk.parallel.zero.zero_memory_per_param`);
* ``parameters`` against what the run reported, ``speedup_2`` / ``speedup_4``
  against the scaling report.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from ddtk.checkpoint.interval import daly_interval, young_interval
from ddtk.parallel.zero import zero_memory_per_param
from ddtk.project.rubric import Criterion, CriterionResult

PLACEHOLDER = re.compile(r"\{\{.*?\}\}")
NUMBER_KEYS = (
    "parameters", "world_size", "zero_stage", "mixed_precision", "model_state_bytes_per_rank",
    "step_time_s", "checkpoint_cost_s", "mtbf_s", "young_interval_s", "daly_interval_s",
    "checkpoint_every_steps", "speedup_2", "speedup_4",
)  # fmt: skip
ZERO_ALLOWED = frozenset({"zero_stage"})  # every other number is a size, a time or a rate: > 0
DEFAULT_SECTIONS = (
    "Parallelism choice", "Memory budget", "Checkpoint interval", "Scaling study",
    "Profile: bottleneck and fix", "At 64 GPUs", "Numbers",
)  # fmt: skip


class DesignError(ValueError):
    """The design document cannot be checked; the message says why."""


def headings(text: str) -> list[str]:
    """The ``##`` headings of a Markdown text, stripped."""
    return [m.group(1).strip() for m in re.finditer(r"^##\s+(.+?)\s*#*\s*$", text, re.M)]


def numbers_block(text: str) -> dict[str, Any]:
    """The YAML block under ``## Numbers``, parsed; every key of :data:`NUMBER_KEYS` present."""
    import yaml

    match = re.search(r"^##\s+Numbers\b.*?^```ya?ml\s*\n(.*?)^```", text, re.M | re.S)
    if not match:
        raise DesignError("the design document has no ```yaml block under '## Numbers'")
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        raise DesignError("the ```yaml block under '## Numbers' is not valid YAML") from None
    if not isinstance(data, dict):
        raise DesignError("the ```yaml block under '## Numbers' is not a mapping")
    for key in NUMBER_KEYS:
        value = data.get(key)
        if key == "mixed_precision":
            if not isinstance(value, bool):
                raise DesignError(
                    f"'## Numbers' has no valid {key!r}: true or false (got {value!r})"
                )
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise DesignError(f"'## Numbers' has no valid {key!r}: a number (got {value!r})")
        least = 0 if key in ZERO_ALLOWED else None
        if (least is None and value <= 0) or (least is not None and value < least):
            want = ">= 0" if least is not None else "> 0"
            raise DesignError(f"'## Numbers': {key} must be {want}, got {value!r}")
    return data


def _close(claimed: float, expected: float, rtol: float) -> bool:
    return math.isclose(claimed, expected, rel_tol=rtol, abs_tol=1e-12)


def recompute(
    nums: dict[str, Any],
    rtol: float,
    measured_params: int | None,
    speedups: dict[int, float] | None,
) -> list[str]:
    """Every claimed number that disagrees with its recomputation, one sentence each."""
    bad = []
    young = young_interval(nums["checkpoint_cost_s"], nums["mtbf_s"])
    daly = daly_interval(nums["checkpoint_cost_s"], nums["mtbf_s"])
    if not _close(nums["young_interval_s"], young, rtol):
        bad.append(
            f"young_interval_s is {nums['young_interval_s']}, sqrt(2 x checkpoint_cost_s x mtbf_s) = {young:.4g}"
        )
    if not _close(nums["daly_interval_s"], daly, rtol):
        bad.append(f"daly_interval_s is {nums['daly_interval_s']}, Daly's formula gives {daly:.4g}")
    if nums["step_time_s"] > 0:
        every = [max(1.0, t / nums["step_time_s"]) for t in (young, daly)]
        if not any(_close(nums["checkpoint_every_steps"], e, max(rtol, 0.1)) for e in every):
            bad.append(
                f"checkpoint_every_steps is {nums['checkpoint_every_steps']}, the intervals / step_time_s give "
                f"{every[0]:.4g} (Young) or {every[1]:.4g} (Daly)"
            )
    try:
        per_param = zero_memory_per_param(
            nums["zero_stage"], nums["world_size"], nums["mixed_precision"]
        )["total"]
    except ValueError as exc:
        bad.append(f"the memory numbers cannot be recomputed: {exc}")
    else:
        expected = nums["parameters"] * per_param
        if not _close(nums["model_state_bytes_per_rank"], expected, rtol):
            bad.append(
                f"model_state_bytes_per_rank is {nums['model_state_bytes_per_rank']}, the ZeRO model gives {expected:.6g}"
            )
    if measured_params is not None and nums["parameters"] != measured_params:
        bad.append(f"parameters is {nums['parameters']}, the run reported {measured_params}")
    for n, s in (speedups or {}).items():
        key = f"speedup_{n}"
        if key in nums and not _close(nums[key], s, rtol):
            bad.append(f"{key} is {nums[key]}, the scaling report says {s}")
    return bad


def design_doc(
    criterion: Criterion, path: Path, measured_params: int | None, speedups: dict[int, float] | None
) -> CriterionResult:
    """Sections present, placeholders filled, numbers consistent; ``None`` inputs are not compared."""
    sections = [str(s) for s in criterion.params.get("sections", DEFAULT_SECTIONS)]
    rtol = float(criterion.params.get("rtol", 0.05))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return CriterionResult(criterion, "fail", f"cannot read the design document {path.name}")
    present = headings(text)
    missing = [s for s in sections if not any(h.lower().startswith(s.lower()) for h in present)]
    if missing:
        return CriterionResult(
            criterion,
            "fail",
            f"{path.name} lacks the section(s) " + ", ".join(f"'## {s}'" for s in missing),
        )
    left = PLACEHOLDER.findall(text)
    if left:
        return CriterionResult(
            criterion,
            "fail",
            f"{path.name} still has {len(left)} template placeholder(s), first {left[0]}",
        )
    try:
        nums = numbers_block(text)
    except DesignError as exc:
        return CriterionResult(criterion, "fail", str(exc))
    try:
        bad = recompute(nums, rtol, measured_params, speedups)
        measured = {
            "young_interval_s": round(young_interval(nums["checkpoint_cost_s"], nums["mtbf_s"]), 4),
            "daly_interval_s": round(daly_interval(nums["checkpoint_cost_s"], nums["mtbf_s"]), 4),
            "parameters_compared": measured_params is not None,
            "speedups_compared": bool(speedups),
        }
    except (
        ValueError,
        ArithmeticError,
    ) as exc:  # numbers no formula accepts: a failure, not a crash
        return CriterionResult(criterion, "fail", f"'## Numbers' cannot be recomputed: {exc}")
    if bad:
        return CriterionResult(criterion, "fail", "; ".join(bad), measured)
    notes = [] if measured_params is not None else ["parameters not compared (no run)"]
    notes += [] if speedups else ["speedups not compared (no valid scaling report)"]
    message = "sections present, numbers consistent" + (f" ({'; '.join(notes)})" if notes else "")
    return CriterionResult(criterion, "pass", message, measured)
