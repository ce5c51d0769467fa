"""Lab 02's judged exercises (:mod:`ddtk.course.judges.lab02`).

- the mutant matrix: the stub fails, the solution passes, and every plausible wrong
  answer in ``solutions/mutants/lab02.py`` fails with a message that says why;
- answers that take a shortcut (Horovod's own slot assignment, the packaged recipe,
  ddtk's timeline reader, dynamic imports) earn nothing, without a process being started.
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
LAB02 = ROOT / "solutions" / "lab02-horovod.ipynb"

pytestmark = pytest.mark.notebook


def _lab02() -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    return notebook_pair(LAB02)


@pytest.mark.slow
@pytest.mark.horovod
def test_lab02_mutant_matrix_stub_fails_solution_passes_every_mutant_fails() -> None:
    solution, stub = _lab02()
    mutants = load_mutants(mutants_file(LAB02))
    judge = judge_for(LAB02.stem)
    words = proved_matrix(judge, solution, stub, mutants)
    assert set(mutants) == set(judge.exercises) == set(range(1, 9))
    for number, named in mutants.items():
        assert len(named) >= 3, number
    # each failure says what is wrong, not only that something is
    assert "chosen by local_rank, not rank" in words["the GPU is chosen by rank, not local_rank"]
    assert "local_size() is 1" in words["the ranks under this host name share the machine (local_size)"]
    assert "a machine of its own" in words["every rank of the job shares the machine (size)"]
    assert "rank 0's parameters and buffers" in words["parameters broadcast without the buffers"]
    assert "summed instead of averaged" in words["gradients summed, not averaged"]
    assert "compression argument is not used" in words["the compression argument is ignored"]
    assert "rank 0's only" in words["the first rank of every host saves (local_rank == 0)"]
    assert "insertion order" in words["metrics in each rank's insertion order, not sorted"]
    assert "overlapping spans count once" in words["overlapping spans summed, not counted once"]
    assert "the verdict of diagnose_allreduce" in words["the threshold fixed at 256 KiB"]
    assert "the predictions of" in words["no cap at one process per core"]
    assert "the trend of" in words["the trend read from every run, past the core count too"]
    assert "e(n) of" in words["efficiency in place of speedup in Karp-Flatt"]
    assert "warm-up ends at step" in words["the warm-up rounded down to whole steps"]


def test_lab02_shortcuts_earn_nothing_and_start_no_process(monkeypatch) -> None:
    import ddtk.course.judging as judging

    solution, _stub = _lab02()
    judge = judge_for(LAB02.stem)
    monkeypatch.setattr(judging, "Worker", None)  # a shortcut must be caught before any process
    cases = {
        1: ("1b5bee1f", "from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts\n"
            "def placement(np, hosts):\n    return get_host_assignments(parse_hosts(hosts), np, np)\n",
            "imports horovod.runner.common.util.hosts.get_host_assignments"),
        3: ("17015b3d", "from ddtk.examples.cnn_common import warmup_lr\n"
            "def scaled_lr(step, spe, base_lr, size, warmup):\n    return warmup_lr(step, spe, base_lr * size, warmup)\n",
            "imports ddtk.examples.cnn_common.warmup_lr"),
        6: ("6b540593", "import ddtk.frameworks.horovod_timeline as ht\n"
            "def timeline_spans(events):\n    return ht.parse_timeline(str(events))\n",
            "imports ddtk.frameworks.horovod_timeline"),
        8: ("3860097d", "import importlib\nscaling_model = importlib.import_module('ddtk.project.scaling')\n",
            "uses importlib"),
        4: ("b780aa0b", "import ddtk.course.judges.lab02 as j\ndef distribute(m, o, c):\n    return o\n",
            "imports ddtk.course.judges.lab02"),
    }  # fmt: skip
    assert_shortcuts_earn_nothing(judge, solution, cases)
    # the names the lab's set-up cell hands out stay usable in an answer
    given = "from ddtk.frameworks.launchers import free_port\n" + next(
        c.source for c in solution.cells if c.get("id") == "3860097d"
    )
    exercise = judge.exercises[8]
    assert audit(given, (*exercise.forbid, "ddtk.course"), exercise.allow) == []


def test_lab02_diagnosis_cases_plant_each_verdict_with_its_trap() -> None:
    """Exercise 7's seeded span tables give the verdict each was built for, under any seed,
    and the traps hold: summed negotiations win where latency is the answer, a call
    counted per tensor falls under the threshold where bandwidth is, and that call
    stays under the default 256 KiB (so a fixed threshold fails too)."""
    import random

    from ddtk.course.judges.lab02 import _VERDICTS, diagnosis_cases, expected_diagnosis

    for seed in range(200):
        cases = {c["bound"]: c for c in diagnosis_cases(random.Random(seed))}
        assert set(cases) == set(_VERDICTS), seed
        for bound, case in cases.items():
            got = expected_diagnosis(case["rows"], case["steps"], case["latency_bytes"])
            assert got["bound"] == bound, (seed, bound, got)
        late = cases["latency"]
        summed = sum(r["dur_ms"] for r in late["rows"] if r["phase"] == "NEGOTIATE_ALLREDUCE")
        assert (
            summed / late["steps"] > expected_diagnosis(late["rows"], late["steps"], 1)["reduce_ms"]
        )
        wide = cases["bandwidth"]
        per_call = expected_diagnosis(wide["rows"], wide["steps"], 1)["bytes_per_call"]
        assert per_call / 3 < wide["latency_bytes"] <= per_call < 256 * 1024, seed
