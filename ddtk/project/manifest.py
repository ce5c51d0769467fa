"""``project.yaml``: what a submission declares, read and validated with one-sentence errors.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "project.yaml").write_text('''
... name: demo
... entry: train.py
... check: {steps: 20, global_batch: 32, args: [--steps, "{steps}", --out, "{out}"]}
... outputs: {metrics: "metrics/rank-{rank}.json", checkpoints: checkpoints,
...           commit_marker: "step-*/manifest.json"}
... reports: {scaling: scaling.json, design: DESIGN.md}
... ''')
>>> spec = load_project(d)
>>> spec.command_args("/tmp/o")
['--steps', '20', '--out', '/tmp/o']
>>> spec.ranks, spec.timeout_s
(2, 60.0)
>>> _ = (d / "project.yaml").write_text("name: demo\\nentri: train.py\\n")
>>> try:
...     load_project(d)
... except ManifestError as exc:
...     print(exc)
project.yaml: unknown key 'entri' (expected one of: check, entry, name, outputs, reports)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "project.yaml"
_TOP = {"name", "entry", "check", "outputs", "reports"}
_CHECK = {"steps", "args", "global_batch", "ranks", "timeout_s"}
_OUTPUTS = {"metrics", "checkpoints", "commit_marker"}
_REPORTS = {"scaling", "design"}


class ManifestError(ValueError):
    """project.yaml is missing, not YAML, or does not follow the format; the message says where."""


@dataclass(frozen=True)
class ProjectSpec:
    """A validated project.yaml; paths are relative to ``root`` (the submission folder)."""

    root: Path
    name: str
    entry: str
    steps: int
    args: tuple[str, ...]
    global_batch: int
    ranks: int
    timeout_s: float
    metrics: str
    checkpoints: str
    commit_marker: str
    scaling: str
    design: str

    def command_args(self, out: str | Path) -> list[str]:
        """The entry point's arguments with ``{out}`` and ``{steps}`` filled in."""
        return [a.replace("{out}", str(out)).replace("{steps}", str(self.steps)) for a in self.args]

    def metrics_path(self, out: str | Path, rank: int) -> Path:
        """Where rank ``rank`` of a run into ``out`` writes its metrics JSON."""
        return Path(out) / self.metrics.replace("{rank}", str(rank))

    def checkpoint_dir(self, out: str | Path) -> Path:
        """The run's checkpoint folder."""
        return Path(out) / self.checkpoints

    def declared_files(self) -> dict[str, Path]:
        """The files the submission must contain: the entry point and the design document."""
        return {"entry": self.root / self.entry, "reports.design": self.root / self.design}


def _keys(where: str, data: Any, allowed: set[str], required: set[str]) -> dict:
    if not isinstance(data, dict):
        raise ManifestError(f"{where} must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(map(str, data)) - allowed)
    if unknown:
        raise ManifestError(
            f"{where}: unknown key {unknown[0]!r} (expected one of: {', '.join(sorted(allowed))})"
        )
    missing = sorted(required - set(data))
    if missing:
        raise ManifestError(f"{where}: missing required key {missing[0]!r}")
    return data


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ManifestError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _relative(where: str, value: Any) -> str:
    text = _text(where, value)
    if Path(text).is_absolute() or ".." in Path(text).parts:
        raise ManifestError(f"{where} must be a path inside the submission, got {text!r}")
    return text


def _int(where: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ManifestError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


def _seconds(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ManifestError(f"{where} must be a number of seconds > 0, got {value!r}")
    if value <= 0:
        raise ManifestError(f"{where} must be a number of seconds > 0, got {value!r}")
    return float(value)


def parse_project(data: Any, root: Path) -> ProjectSpec:
    """Validate the parsed YAML ``data`` of ``root/project.yaml``."""
    top = _keys(MANIFEST, data, _TOP, _TOP)
    check = _keys(f"{MANIFEST}: check", top["check"], _CHECK, {"steps", "args", "global_batch"})
    outputs = _keys(f"{MANIFEST}: outputs", top["outputs"], _OUTPUTS, _OUTPUTS)
    reports = _keys(f"{MANIFEST}: reports", top["reports"], _REPORTS, _REPORTS)
    entry = _relative(f"{MANIFEST}: entry", top["entry"])
    if not entry.endswith(".py"):
        raise ManifestError(
            f"{MANIFEST}: entry must be a Python file run by torchrun, got {entry!r}"
        )
    args = check["args"]
    if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
        raise ManifestError(f"{MANIFEST}: check.args must be a list of strings, got {args!r}")
    args = [str(a) for a in args]
    if not any("{out}" in a for a in args):
        raise ManifestError(
            f"{MANIFEST}: check.args must pass the output folder as '{{out}}' (the checker fills it in)"
        )
    metrics = _relative(f"{MANIFEST}: outputs.metrics", outputs["metrics"])
    if "{rank}" not in metrics:
        raise ManifestError(f"{MANIFEST}: outputs.metrics must contain '{{rank}}', got {metrics!r}")
    return ProjectSpec(
        root=root,
        name=_text(f"{MANIFEST}: name", top["name"]),
        entry=entry,
        steps=_int(f"{MANIFEST}: check.steps", check["steps"], 1),
        args=tuple(args),
        global_batch=_int(f"{MANIFEST}: check.global_batch", check["global_batch"], 1),
        ranks=_int(f"{MANIFEST}: check.ranks", check.get("ranks", 2), 2),
        timeout_s=_seconds(f"{MANIFEST}: check.timeout_s", check.get("timeout_s", 60)),
        metrics=metrics,
        checkpoints=_relative(f"{MANIFEST}: outputs.checkpoints", outputs["checkpoints"]),
        commit_marker=_relative(f"{MANIFEST}: outputs.commit_marker", outputs["commit_marker"]),
        scaling=_relative(f"{MANIFEST}: reports.scaling", reports["scaling"]),
        design=_relative(f"{MANIFEST}: reports.design", reports["design"]),
    )


def load_project(root: str | Path) -> ProjectSpec:
    """Read and validate ``root/project.yaml``; :class:`ManifestError` names any problem."""
    import yaml

    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise ManifestError(f"no {MANIFEST} in {root}: copy project/starter/{MANIFEST} and edit it")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ManifestError(f"{MANIFEST} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid syntax"
        raise ManifestError(f"{MANIFEST} is not valid YAML{where}: {problem}") from None
    if data is None:
        raise ManifestError(f"{MANIFEST} is empty")
    return parse_project(data, root)
