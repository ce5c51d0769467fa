"""Lab 01's judged exercises (:mod:`ddtk.course.judges.lab01`): verdicts from outside the kernel.

- the mutant matrix: the stub fails, the solution passes, and every plausible wrong
  answer in ``solutions/mutants/lab01.py`` fails, with the message saying why;
- answers that import what an exercise asks to build earn nothing, and no process is
  started to find that out; the data helpers the lab hands out stay allowed;
- the seeded Prometheus expositions the judge writes parse, with ``prometheus_client``,
  into exactly the samples the judge expects (the judge's own reference is right);
- exercise 7, the free-text interpretation, is not judged.
"""

from __future__ import annotations

import random
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
LAB01 = ROOT / "solutions" / "lab01-ray-train.ipynb"

pytestmark = pytest.mark.notebook


def _lab01() -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    return notebook_pair(LAB01)


@pytest.mark.slow
def test_lab01_mutant_matrix_stub_fails_solution_passes_every_mutant_fails() -> None:
    solution, stub = _lab01()
    judge = judge_for(LAB01.stem)
    mutants = load_mutants(mutants_file(LAB01))
    words = proved_matrix(judge, solution, stub, mutants)
    assert sorted(judge.exercises) == [1, 2, 3, 4, 5, 6]  # 7 is free text: not judged
    for number in judge.exercises:
        assert len(mutants.get(number, {})) >= 3, number
    # each failure says what is wrong, not only that something is
    assert "(the head and" in words["one node too many: num_nodes worker nodes besides the head"]
    assert (
        "the CPUs each node advertises" in words["the CPU count hard-coded to the laptop default"]
    )
    assert "changed the template passed in" in words["the template passed in is edited in place"]
    assert (
        "the rest of the template changed"
        in words["the notebook's template instead of the one passed in"]
    )
    assert "not wrapped in DistributedDataParallel" in words["no DDP: the model is never prepared"]
    assert (
        "the global accuracy over both ranks" in words["the accuracy of this worker's shard only"]
    )
    assert "no 'module.' prefix" in words["the checkpoint holds the DDP wrapper's keys"]
    assert "seeded exposition" in words["the timestamp read as the value"]
    assert "each rank trained alone" in words["no DDP wrapper: each rank trains alone"]
    assert (
        "the sum of the parameters the grader read"
        in words["a checksum reported instead of computed"]
    )
    assert "sorted, named 'workers'" in words["rows in the order the runs came"]


def test_lab01_shortcuts_earn_nothing_and_start_no_process(monkeypatch) -> None:
    import ddtk.course.judging as judging

    solution, _stub = _lab01()
    judge = judge_for(LAB01.stem)
    monkeypatch.setattr(judging, "Worker", None)  # a shortcut must be caught before any process
    cases = {
        1: ("c497dfd5", "from ddtk.examples.ray_digits import fit as start_local_cluster",
            "imports ddtk.examples.ray_digits.fit"),
        2: ("7f0c1c5d", "from ddtk.manifests import load_documents\n"
            "def complete_raycluster(t, workers, cpus, memory):\n"
            "    return load_documents('deploy/kuberay/raycluster.yaml')[0]",
            "imports ddtk.manifests.load_documents"),
        3: ("a8b3465f", "from ddtk.examples.ray_digits import train_loop_per_worker",
            "imports ddtk.examples.ray_digits.train_loop_per_worker"),
        4: ("28124bec", "from prometheus_client.parser import text_string_to_metric_families\n"
            "def parse_prometheus(text):\n"
            "    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text)"
            " for s in f.samples]", "imports prometheus_client.parser"),
        5: ("661c2225", "from ddtk.examples.cnn_ddp import main as ddp_train",
            "imports ddtk.examples.cnn_ddp.main"),
        6: ("cb951e0e", "import ddtk.course.checks as c\nc.expect = lambda *a, **k: None",
            "imports ddtk.course.checks"),
    }  # fmt: skip
    assert_shortcuts_earn_nothing(judge, solution, cases)
    # the data helpers the lab hands out for exercise 5 stay allowed, from either module
    ddp = judge.exercises[5]
    for module in ("ddtk.examples.ray_digits", "ddtk.examples.digits_data"):
        source = f"from {module} import digits_split, scale_pixels"
        assert audit(source, (*ddp.forbid, "ddtk.course"), ddp.allow) == [], module


def test_lab01_seeded_expositions_parse_as_the_judge_expects() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from ddtk.course.judges.lab01 import _canonical, prometheus_text

    escaped = 0
    for seed in range(40):
        text, want = prometheus_text(random.Random(seed))
        reference = [(s.name, dict(s.labels), s.value)
                     for f in text_string_to_metric_families(text) for s in f.samples]  # fmt: skip
        assert _canonical(reference) == _canonical(want), seed
        escaped += any(e in text for e in ('\\"', "\\\\", '="line1\\n'))
    assert escaped >= 30  # most expositions hold escaped label values


def test_lab01_scaling_cases_never_come_sorted() -> None:
    """The judge's seed is secret and fresh each time: an answer that keeps the order the
    runs came in must fail under every seed, so no case may arrive already sorted."""
    from ddtk.course.judges.lab01 import scaling_cases

    for seed in range(500):
        for ray_runs, ddp_runs in scaling_cases(random.Random(seed)):
            for runs in (ray_runs, ddp_runs):
                if 1 in runs:  # the cases without a 1-worker run must raise anyway
                    assert list(runs) != sorted(runs), seed


def test_lab01_loop_cases_tell_a_ranks_own_accuracy_from_the_global(monkeypatch) -> None:
    """Seeds 1, 10 and 11 first draw shards on which the reference model scores the same on
    both ranks' val shards (a rank's own accuracy would pass as the global one): the
    judge draws again; seeds 0 and 2 keep their first draw."""
    from ddtk.course.judges import lab01

    draws: list[int] = []
    first_draw = lab01._loop_inputs
    monkeypatch.setattr(
        lab01, "_loop_inputs", lambda seed: (draws.append(seed), first_draw(seed))[1]
    )
    for seed in (0, 1, 2, 10, 11):
        draws.clear()
        _data, _config, _nodes, ref = lab01._loop_case(seed)
        assert any(abs(own - ev[0]) > 1e-3 for ev in ref["evals"] for own in ev[1:]), seed
        assert len(draws) == (2 if seed in (1, 10, 11) else 1), (seed, draws)


def test_lab01_judge_template_is_the_notebooks() -> None:
    import ast

    import yaml

    from ddtk.course.judges.lab01 import RAYCLUSTER_TEMPLATE

    solution, _stub = _lab01()
    cell = next(c for c in solution.cells if c.get("id") == "7f0c1c5d").source
    text = next(
        node.value.value
        for node in ast.parse(cell).body
        if isinstance(node, ast.Assign) and node.targets[0].id == "RAYCLUSTER_TEMPLATE"
    )
    assert yaml.safe_load(text) == RAYCLUSTER_TEMPLATE
