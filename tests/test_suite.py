"""The test suite's own machinery (the root conftest.py): worker groups and the timing report."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _root_conftest():
    """The repository's root conftest.py as a module of its own (tests/ has another)."""
    spec = importlib.util.spec_from_file_location("ddtk_root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


root = _root_conftest()


def test_everything_that_starts_ray_runs_in_the_serial_group() -> None:
    """Two Ray clusters at once would clash: each file that starts one is in one group."""
    ray_users = {
        f"tests/{p.name}"
        for p in (ROOT / "tests").glob("test_*.py")
        if p.name != Path(__file__).name
        if re.search(r"pytest\.mark\.ray\b|import_or_require\(\"ray|import ray\b|ray\.init\(", p.read_text())
    }
    ray_users |= {
        f"course/{p.name}"
        for p in (ROOT / "course").glob("*.ipynb")
        if re.search(r"import ray\b|ray\.init\(", p.read_text())
    }
    assert ray_users and ray_users <= root.SERIAL_FILES, sorted(ray_users - root.SERIAL_FILES)
    for name in ("test_lab01.py", "test_lab02.py", "test_lab03.py", "test_lab04.py"):
        assert root.xdist_group(f"tests/{name}::test_x") == root.SERIAL_GROUP  # with their classes
    assert (ROOT / "tests" / "test_course_grade.py").is_file()


def test_other_tests_are_grouped_by_file() -> None:
    assert root.xdist_group("tests/test_zero.py::test_a[2-gloo]") == "tests/test_zero.py"
    assert root.xdist_group("course/01-distributed-fundamentals.ipynb::Cell 3") == (
        "course/01-distributed-fundamentals.ipynb"
    )
    assert root.xdist_group("course/02-ray.ipynb::Cell 3") == root.SERIAL_GROUP
    assert all((ROOT / f).is_file() for f in root.SERIAL_FILES)


def test_the_timing_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(root, "_durations", {f"t{i}": float(i) for i in range(30)})
    monkeypatch.setattr(root, "_outcomes", {"t0": "failed", "t1": "skipped"} | {
        f"t{i}": "passed" for i in range(2, 30)
    })  # fmt: skip
    report = root.write_test_times(tmp_path / "build" / "times.json", 1234.56, 1)
    assert json.loads((tmp_path / "build" / "times.json").read_text()) == report
    assert report["total_s"] == 1234.6 and report["tests"] == 30 and report["exit_status"] == 1
    assert report["outcomes"] == {"failed": 1, "passed": 28, "skipped": 1}
    assert [s["test"] for s in report["slowest"]][:3] == ["t29", "t28", "t27"]
    assert len(report["slowest"]) == 25 and report["machine"]["cpus"] >= 1
