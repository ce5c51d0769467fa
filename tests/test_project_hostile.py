"""Hostile final-project submissions: each cheats in one way that self-reported metrics
cannot show, and ``ddtk project check`` catches it from what it observes itself.

The submissions are ``tests/data/hostile_train.py`` with one ``MODE`` each (see its
docstring), beside the reference's manifest, scaling report and design document.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil
import pytest
import yaml

from ddtk.course.grading.jail import confinement
from ddtk.project.check import check_project
from ddtk.project.rubric import load_rubric

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "project"
TRAIN = Path(__file__).with_name("data") / "hostile_train.py"

pytestmark = pytest.mark.slow


def _submission(tmp_path: Path, mode: str) -> Path:
    sub = tmp_path / f"sub-{mode}"
    sub.mkdir()
    for name in ("project.yaml", "DESIGN.md", "scaling.json"):
        shutil.copy(SOLUTION / name, sub / name)
    text = TRAIN.read_text().replace('MODE = "nothing"', f"MODE = {mode!r}")
    (sub / "train.py").write_text(text)
    return sub


def _rubric(tmp_path: Path, ids: tuple[str, ...]) -> Path:
    data = yaml.safe_load((ROOT / "project" / "rubric.yaml").read_text())
    data["criteria"] = [c for c in data["criteria"] if c["id"] in ids]
    path = tmp_path / "rubric.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _check(tmp_path: Path, mode: str, ids: tuple[str, ...] | None = None):
    """Check the ``mode`` submission; then nothing of it may run on, and its folder (the
    original: runs work on a copy) must be exactly as it was."""
    rubric = load_rubric(_rubric(tmp_path, ids) if ids else None)
    sub = _submission(tmp_path, mode)
    before = _files(sub)
    result = check_project(sub, rubric, timeout_s=60)
    assert _files(sub) == before, "a run changed the submission's own folder"
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        text = " ".join(proc.info.get("cmdline") or []) + " " + str(proc.info.get("cwd") or "")
        assert "ddtk-project-" not in text, (
            f"process {proc.pid} of the check is still running: {text}"
        )
    return result, {r.criterion.id: r for r in result.results}


def test_a_program_that_trains_nothing_scores_at_most_the_manifest(tmp_path):
    result, by_id = _check(tmp_path, "nothing")
    assert result.earned <= by_id["files-and-manifest"].criterion.points, {
        i: (r.status, r.message) for i, r in by_id.items()
    }
    assert "saw no optimizer step on rank 0" in by_id["runs-on-N-ranks"].message
    assert by_id["survives-sigkill"].status != "pass"
    assert by_id["scaling-study"].status == "fail"
    assert "could not time" in by_id["scaling-study"].message
    assert by_id["sharded-state"].status != "pass"
    # the reference's design document, beside runs that did not pass, earns nothing
    assert by_id["design-doc"].status != "pass", by_id["design-doc"].message


@pytest.mark.skipif(
    not confinement().namespaces, reason="the kernel's byte count needs a network namespace"
)
def test_ranks_that_train_alone_are_not_distributed(tmp_path):
    _result, by_id = _check(tmp_path, "alone", ("files-and-manifest", "runs-on-N-ranks"))
    run = by_id["runs-on-N-ranks"]
    assert run.status == "fail" and "do not train together" in run.message, run.message


@pytest.mark.parametrize(
    ("mode", "words"),
    [("recompute", "recomputed committed work"), ("skip", "differ from an uninterrupted run's")],
)
def test_a_resume_that_does_not_load_the_checkpoint_fails_the_drill(tmp_path, mode, words):
    ids = ("files-and-manifest", "runs-on-N-ranks", "survives-sigkill")
    _result, by_id = _check(tmp_path, mode, ids)
    assert by_id["runs-on-N-ranks"].status == "pass", by_id["runs-on-N-ranks"].message
    drill = by_id["survives-sigkill"]
    assert drill.status == "fail" and words in drill.message, drill.message
    # what the program reported would have passed the old check
    assert drill.measured["resumed_at"] >= drill.measured["committed_before_kill"]
