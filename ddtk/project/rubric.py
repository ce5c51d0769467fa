"""The rubric: criteria with ids, points, automatic or manual, and the result of each.

``project/rubric.yaml`` is the single source: the checker scores the automatic
criteria it lists (with the tolerances under each one's ``params``) and lists the
manual ones, unscored, for the instructor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("automatic", "manual")
STATUSES = ("pass", "fail", "error", "manual")
AUTOMATIC_IDS = (
    "files-and-manifest",
    "runs-on-N-ranks",
    "survives-sigkill",
    "scaling-study",
    "sharded-state",
    "design-doc",
)


class RubricError(ValueError):
    """The rubric file is missing or malformed; the message names the problem."""


@dataclass(frozen=True)
class Criterion:
    """One line of the rubric."""

    id: str
    kind: str
    points: int
    description: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rubric:
    """Every criterion, in the order they are reported."""

    criteria: tuple[Criterion, ...]
    path: Path | None = None

    def get(self, cid: str) -> Criterion | None:
        """The criterion with id ``cid``, or None."""
        return next((c for c in self.criteria if c.id == cid), None)

    @property
    def automatic_points(self) -> int:
        """Points the checker can award."""
        return sum(c.points for c in self.criteria if c.kind == "automatic")

    @property
    def total_points(self) -> int:
        """Points of the whole project, manual ones included."""
        return sum(c.points for c in self.criteria)


@dataclass
class CriterionResult:
    """What the checker found for one criterion: ``status`` is pass, fail, error or manual.

    ``error`` means the criterion could not be evaluated (a prerequisite failed,
    or the submission crashed or hung before it gave anything to judge).
    """

    criterion: Criterion
    status: str
    message: str
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def earned(self) -> int | None:
        """Full points on pass, 0 on fail or error, None for manual criteria."""
        if self.status == "manual":
            return None
        return self.criterion.points if self.status == "pass" else 0


def _criterion(i: int, raw: Any) -> Criterion:
    where = f"criterion {i + 1}"
    if not isinstance(raw, dict):
        raise RubricError(f"rubric {where} must be a mapping")
    cid = raw.get("id")
    if not isinstance(cid, str) or not cid:
        raise RubricError(f"rubric {where} has no id")
    kind, points = raw.get("kind"), raw.get("points")
    if kind not in KINDS:
        raise RubricError(
            f"rubric criterion {cid!r}: kind must be automatic or manual, got {kind!r}"
        )
    if isinstance(points, bool) or not isinstance(points, int) or points < 0:
        raise RubricError(
            f"rubric criterion {cid!r}: points must be an integer >= 0, got {points!r}"
        )
    if kind == "automatic" and cid not in AUTOMATIC_IDS:
        raise RubricError(
            f"rubric criterion {cid!r} is automatic but the checker only scores {', '.join(AUTOMATIC_IDS)}"
        )
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise RubricError(f"rubric criterion {cid!r}: params must be a mapping")
    return Criterion(cid, kind, points, str(raw.get("description", "")).strip(), params)


def default_rubric_path() -> Path:
    """``project/rubric.yaml`` of the repository this package sits in."""
    return Path(__file__).resolve().parents[2] / "project" / "rubric.yaml"


def load_rubric(path: str | Path | None = None) -> Rubric:
    """Read and validate the rubric (default: :func:`default_rubric_path`)."""
    import yaml

    path = Path(path) if path else default_rubric_path()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RubricError(f"cannot read the rubric {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError:
        raise RubricError(f"the rubric {path} is not valid YAML") from None
    items = data.get("criteria") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise RubricError(f"the rubric {path} has no 'criteria' list")
    criteria = tuple(_criterion(i, raw) for i, raw in enumerate(items))
    ids = [c.id for c in criteria]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise RubricError(f"the rubric {path} lists {dupes[0]!r} twice")
    return Rubric(criteria, path)
