"""The test suite's own machinery: how xdist's workers share the tests, and the timing report."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from scheduling import (
    EXCLUSIVE_FILES,
    EXCLUSIVE_PREFIX,
    GRADE_FILE,
    LAB_GROUPS,
    RAY_FILES,
    RAY_GROUP,
    RAY_LABS,
    group_of,
)

ROOT = Path(__file__).resolve().parents[1]
RAY = re.compile(r"pytest\.mark\.ray\b|import_or_require\(\"ray|import ray\b|ray\.init\(")


def _root_conftest():
    """The repository's root conftest.py as a module of its own (tests/ has another)."""
    spec = importlib.util.spec_from_file_location("ddtk_root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_everything_that_starts_ray_runs_in_one_group() -> None:
    """Two Ray clusters at once would clash: each file that starts one is in one group."""
    users = {
        f"tests/{p.name}"
        for p in (ROOT / "tests").glob("test_*.py")
        if p.name != Path(__file__).name and RAY.search(p.read_text())
    }
    users |= {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "course").rglob("*.ipynb")
        if RAY.search(p.read_text())
    }
    assert GRADE_FILE in users  # its Ray-marked tests: the classes of the labs that start Ray
    users.discard(GRADE_FILE)
    assert users and {group_of(f"{u}::x") for u in users} == {RAY_GROUP}, sorted(users)
    for lab in RAY_LABS:
        assert group_of(f"{GRADE_FILE}::test_a_generated_class_of_a_real_lab[{lab}]") == RAY_GROUP
        assert f'pytest.param("{lab}", marks=pytest.mark.ray)' in (ROOT / GRADE_FILE).read_text()
    for path in (*RAY_FILES, *LAB_GROUPS, *EXCLUSIVE_FILES):
        assert (ROOT / path).is_file(), path


def test_labs_run_with_their_graded_classes() -> None:
    """A lab's test reads the runs its class stores, so both go to the same worker."""
    for lab in ("lab01", "lab02", "lab03", "lab04"):
        test = next((ROOT / "tests").glob(f"test_{lab}.py")).relative_to(ROOT).as_posix()
        graded = f"tests/test_course_grade.py::test_a_generated_class_of_a_real_lab[{lab}]"
        assert group_of(f"{test}::test_every_check") == group_of(graded), lab
    tiny = "tests/test_course_grade.py::test_a_class_of_every_kind_of_submission"
    assert group_of(tiny) == GRADE_FILE  # starts no Ray: off the Ray group


def test_other_tests_are_grouped_by_file_and_timing_ones_run_alone() -> None:
    assert group_of("tests/test_zero.py::test_a[2-gloo]") == "tests/test_zero.py"
    assert group_of("course/01-distributed-fundamentals.ipynb::Cell 3") == (
        "course/01-distributed-fundamentals.ipynb"
    )
    assert group_of("course/04-nccl-and-networking.ipynb::Cell 22").startswith(EXCLUSIVE_PREFIX)
    assert group_of("tests/test_net_emulate.py::test_probe").startswith(EXCLUSIVE_PREFIX)


def test_the_timing_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _root_conftest()
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


def test_exclusive_groups_run_alone_after_the_rest(tmp_path: Path) -> None:
    """A real ``pytest -n 2`` over a small project: the exclusive file starts only after
    every other test has ended, on one worker; lab 02's group, last in xdist's order (it
    has the fewest tests), starts once the Ray group has ended, before the groups still
    queued; and nothing hangs."""
    import subprocess
    import sys

    (tmp_path / "tests").mkdir()
    (tmp_path / "conftest.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "from scheduling import scheduler\n"
        "def pytest_xdist_make_scheduler(config, log):\n"
        "    return scheduler(config, log)\n"
    )
    test = (
        "import json, os, time\n"
        "import pytest\n"
        "@pytest.mark.parametrize('k', range({n}))\n"
        "def test_it(k):\n"
        "    start = time.time()\n"
        "    time.sleep({sleep})\n"
        "    with open({log!r}, 'a') as f:\n"
        "        f.write(json.dumps(['{name}', os.environ['PYTEST_XDIST_WORKER'], start, time.time()]) + '\\n')\n"
    )
    log = tmp_path / "log.jsonl"
    files = (("test_net_emulate", 3, 0.2), ("test_lab02", 2, 0.05), ("test_a", 6, 0.3),
             ("test_b", 5, 0.3), ("test_ray_procs", 4, 0.2),
             *((f"test_{c}", 3, 0.3) for c in "cdefg"))  # fmt: skip
    for name, n, sleep in files:
        (tmp_path / "tests" / f"{name}.py").write_text(
            test.format(n=n, sleep=sleep, log=str(log), name=name)
        )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    by_file = {name: [r for r in rows if r[0] == name] for name, _, _ in files}
    assert {name: len(r) for name, r in by_file.items()} == {name: n for name, n, _ in files}
    exclusive = by_file.pop("test_net_emulate")
    others = [r for rs in by_file.values() for r in rs]
    assert len({r[1] for r in others}) == 2  # the rest did run on both workers
    assert len({r[1] for r in exclusive}) == 1
    assert min(r[2] for r in exclusive) >= max(r[3] for r in others)
    lab02 = min(r[2] for r in by_file["test_lab02"])
    assert lab02 >= max(r[3] for r in by_file["test_ray_procs"])  # after the Ray group
    starts = [min(r[2] for r in rs) for name, rs in by_file.items() if name != "test_lab02"]
    assert any(t > lab02 for t in starts)  # and not last, though it has the fewest tests
