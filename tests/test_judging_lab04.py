"""Lab 04's judged exercises (:mod:`ddtk.course.judges.lab04`): verdicts from outside the kernel.

- the mutant matrix: the stub fails, the solution passes, every plausible wrong answer
  in ``solutions/mutants/lab04.py`` fails, with the message saying why;
- answers that import what the exercise asks to write (ddtk's profiler, breakdown,
  diagnosis, the judge itself) earn nothing, without a process being started, while
  the names the lab hands out may be imported.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from judging_support import (
    assert_shortcuts_earn_nothing,
    notebook_pair,
    proved_matrix,
)

from ddtk.course.judges import judge_for
from ddtk.course.judging.audit import audit
from ddtk.course.judging.mutants import load_mutants, mutants_file

ROOT = Path(__file__).resolve().parents[1]
LAB04 = ROOT / "solutions" / "lab04-profiling.ipynb"

pytestmark = pytest.mark.notebook


def _lab04() -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    return notebook_pair(LAB04)


@pytest.mark.slow
def test_lab04_mutant_matrix_stub_fails_solution_passes_every_mutant_fails() -> None:
    solution, stub = _lab04()
    mutants = load_mutants(mutants_file(LAB04))
    judge = judge_for(LAB04.stem)
    assert sorted(judge.exercises) == [1, 2, 3, 4, 5, 6]
    words = proved_matrix(judge, solution, stub, mutants)
    for number in judge.exercises:
        assert len(mutants.get(number, {})) >= 3, number
    # each failure says what is wrong, not only that something is
    assert "record_shapes" in words["no record_shapes: the all-reduces carry no message size"]
    assert "expected ['rank0.json', 'rank1.json']" in words["only rank 0 writes its trace"]
    assert "ProfilerStep#2, #3 and #4" in words["no warm-up step in the schedule"]
    assert "communication" in words["all time in flight counted as communication"]
    assert "straggler.rank" in words["mean busy time instead of the median"]
    assert "RULES set to" in words["the lab's thresholds written into the code"]
    assert "states its number" in words["a sentence without its number"]
    assert "or more workers" in words["two workers whatever the job"]
    assert "not absurdly many" in words["sixteen workers, to be safe"]
    assert "only the row's fields" in words["accumulation dropped instead of no_sync"]
    assert "a ValueError naming" in words["an unknown kind changes nothing"]
    # where keep-or-revert first goes wrong depends on the seeded throughputs
    assert (
        "optimise on seeded measurements (min_gain="
        in words["compared with the previous measurement, not the best"]
    )
    assert "after trying" in words["each fix tried on the start, not on the kept ones"]


def test_lab04_shortcuts_earn_nothing_and_start_no_process(monkeypatch) -> None:
    import ddtk.course.judging as judging

    solution, _stub = _lab04()
    judge = judge_for(LAB04.stem)
    monkeypatch.setattr(judging, "Worker", None)  # a shortcut must be caught before any process
    cases = {
        1: ("75451cf2", "from ddtk.profiling.collect import StepProfiler\n"
            "def profiled_ddp(ctx, trace_dir, steps=6):\n    pass",
            "imports ddtk.profiling.collect.StepProfiler"),
        2: ("4a51ad7b", "from ddtk.profiling.breakdown import step_parts\n"
            "def step_times(ln, lo, hi):\n    return step_parts(ln, lo, hi)",
            "imports ddtk.profiling.breakdown.step_parts"),
        3: ("1f2ce6b5", "from ddtk.profiling import diagnose\ndef read_evidence(bd):\n    return {}",
            "imports ddtk.profiling.diagnose"),
        4: ("98d73259", "from ddtk.profiling.diagnose import THRESHOLDS as RULES\n"
            "def name_bottlenecks(e):\n    return {}", "imports ddtk.profiling.diagnose.THRESHOLDS"),
        5: ("65d95908", "from ddtk.course.judges import lab04\nfix = lab04.probe_fix",
            "imports ddtk.course.judges.lab04"),
        6: ("d0705fc0", "import importlib\noptimise = importlib.import_module('ddtk.course')",
            "uses importlib"),
    }  # fmt: skip
    assert_shortcuts_earn_nothing(judge, solution, cases)


def test_lab04_answers_may_import_what_the_lab_hands_out() -> None:
    judge = judge_for(LAB04.stem)
    given = (
        "from ddtk.profiling.intervals import clip, intersect, length, subtract, union\n"
        "from ddtk.profiling.breakdown import Breakdown, StepBreakdown, lanes\n"
        "from ddtk.profiling import JOBS, JobConfig, stragglers\n"
    )
    for exercise in judge.exercises.values():
        assert audit(given, (*exercise.forbid, "ddtk.course"), exercise.allow) == [], (
            exercise.number
        )


def test_lab04_step_cases_always_hold_the_edges_each_mutant_needs() -> None:
    """Exercise 2's seeded steps, under any seed: a fetch crossing the window's edge (an
    answer that does not clip it counts time outside the step) and an optimizer span
    inside a compute span (an answer that keeps it in compute counts it twice)."""
    import random

    from ddtk.course.judges.lab04 import step_cases
    from ddtk.profiling.intervals import clip, intersect, length

    for seed in range(200):
        cases = step_cases(random.Random(seed))
        assert any(length(c["data"]) > length(clip(c["data"], c["lo"], c["hi"])) for c in cases)
        assert any(length(intersect(c["optimizer"], c["compute"])) > 0 for c in cases), seed
