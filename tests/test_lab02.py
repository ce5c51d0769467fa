"""Lab 02 (Horovod): every check fails on its stub and passes on the solution; four ranks.

The first test runs the solution notebook once, at its laptop defaults, in one
kernel: before each check cell it runs the stub that ``ddtk course build`` writes
for the exercises that check covers, and the check must fail with a teaching
``CheckFailed``; then the solution and the check again, which must pass
(:func:`ddtk.course.labcheck.verify_lab_checks`). The second runs the notebook
through papermill with four Horovod ranks over two host names and other epochs and
process counts, as a cluster run would change them. Both then require that no
Horovod launcher, rank or torchrun is left running.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest
from support import assert_none_left, executed_text

from ddtk.course import catalog
from ddtk.course.labcheck import verify_lab_checks
from ddtk.course.run import run_notebook

pytestmark = [pytest.mark.notebook, pytest.mark.horovod, pytest.mark.slow]
EXERCISES = 9
MARKERS = ("horovod", "ddtk.examples.cnn_", "torchrun", "lab02-")


def horovod_processes(since: float) -> list[psutil.Process]:
    """Live processes started since ``since`` that run Horovod, a recipe or torchrun.

    Counts this process's descendants and orphans (adopted by init once their launcher
    died); a Horovod job that another program on the machine runs is not ours.
    """
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    found = []
    for proc in psutil.process_iter(["pid", "ppid", "cmdline", "create_time"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            ours = proc.info["pid"] in mine or proc.info["ppid"] == 1
            if (
                ours
                and proc.info["create_time"] >= since - 1.0
                and proc.status() != psutil.STATUS_ZOMBIE
                and any(m in cmd for m in MARKERS)
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_no_horovod_left(since: float, grace: float = 20.0) -> None:
    """Fail, and kill them, if Horovod processes started since ``since`` outlive ``grace``."""
    assert_none_left(horovod_processes, since, grace, "Horovod")


def test_every_check_fails_on_the_stub_and_passes_on_the_solution(
    tmp_path: Path, horovodrun: Path
) -> None:
    since = time.time()
    nb = catalog.find("lab02").file
    report = verify_lab_checks(nb, {"report_dir": str(tmp_path)}, cell_timeout=600)
    assert_no_horovod_left(since)
    assert report.ok, report.describe()
    assert len(report.outcomes) == EXERCISES, report.describe()
    for number, outcome in enumerate(report.outcomes, start=1):
        assert outcome.stub_error.startswith(f"CheckFailed: Exercise {number} ("), outcome
        # Exercise 9's stub keeps the template text: its check names the blanks left.
        expected = "is not done yet" if number < EXERCISES else "blanks left"
        assert expected in outcome.stub_error, outcome
    assert (tmp_path / "lab02-report.json").is_file()
    print(f"\n{report.describe()}")


def test_runs_with_four_ranks_on_two_hosts(tmp_path: Path, horovodrun: Path) -> None:
    since = time.time()
    params = {"np": 4, "epochs": 8, "accuracy_threshold": 0.5, "comm_epochs": 2,
              "scaling_processes": [1, 2], "bench_epochs": 3, "report_dir": str(tmp_path)}  # fmt: skip
    result = run_notebook(catalog.find("lab02").file, params, out_dir=tmp_path, timeout=600)
    assert_no_horovod_left(since)
    assert result.ok, result.failure.describe() if result.failure else result.status
    text = executed_text(result.output)
    assert "horovodrun --gloo -np 4 -H localhost:2,127.0.0.1:2" in text
    for number in range(1, EXERCISES + 1):
        assert f"Exercise {number} passed" in text, number
    assert "4 ranks on localhost:2,127.0.0.1:2: accuracy" in text
    assert "horovod 2 process(es)" in text and "ddp 2 process(es)" in text
    assert "horovod 4 process(es)" not in text  # scaling_processes=[1, 2] was honoured
    assert "Horovod processes left: none" in text
    assert "ports this kernel opened and still listens on: none" in text
    report = json.loads((tmp_path / "lab02-report.json").read_text())
    assert report["parameters"]["np"] == 4
    placement = report["part1"]["placement"]
    assert [(p["host"], p["local_rank"], p["cross_rank"]) for p in placement] == [
        ("localhost", 0, 0), ("localhost", 1, 0), ("127.0.0.1", 0, 1), ("127.0.0.1", 1, 1),
    ]  # fmt: skip
    assert len(set(report["part2"]["params_fingerprints"])) == 1
    assert report["part2"]["accuracy"] > 0.5
    assert [row["processes"] for row in report["part4"]["table"]] == [1, 2]
    assert (tmp_path / "lab02-report.md").read_text().startswith("# Lab 02 report")
    print(f"\nlab 02 with 4 ranks: {result.seconds:.0f} s")
