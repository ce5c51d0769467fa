"""Lab 01's judged exercises (:mod:`ddtk.course.judges.lab01`): verdicts from outside the kernel.

- the mutant matrix: the stub fails, the solution passes, and every plausible wrong
  answer in ``solutions/mutants/lab01.py`` fails, with the message saying why;
- answers that import what an exercise asks to build earn nothing, and no process is
  started to find that out; the data helpers the lab hands out stay allowed;
- the series the judge writes for exercise 4 tell its own PromQL from plausible wrong
  queries in a real Prometheus, and a recorded series that promtool refuses fails with
  promtool's reason;
- the stand-in of ``ray.util.metrics`` the loop runs under checks what Ray checks;
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


@pytest.fixture
def prometheus() -> None:
    """Exercise 4's judge runs Prometheus and promtool: skip without them, or fail under DDTK_REQUIRE."""
    from test_course_grade import require_prometheus

    require_prometheus()


@pytest.mark.slow
@pytest.mark.usefixtures("prometheus")
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
    assert "one per training step" in words["the samples counted once per epoch, not per step"]
    assert "the grader's run is named" in words[
        "the notebook's run name hard-coded in the counter's tags"
    ]
    assert "its series (label sets)" in words["one series for the whole cluster: no by (instance)"]
    assert "in MiB" in words["the object store in bytes, not MiB"]
    assert "the window passed in" in words["the notebook's window hard-coded"]
    assert "summed by ray_train_worker_world_rank" in words[
        "report time grouped by the counter's label, which Ray Train's series lack"
    ]
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
        4: ("28124bec", "from ddtk.course.judges.lab01 import reference_queries as cluster_queries",
            "imports ddtk.course.judges.lab01.reference_queries"),
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


WRONG_QUERIES = {  # plausible mistakes in exercise 4, each with the panel it answers
    "no run matcher": ("samples_per_s", "sum by (rank) (rate(ray_lab01_train_samples_total[{w}]))"),
    "avg for sum": ("samples_per_s", 'avg by (rank) (rate(ray_lab01_train_samples_total{{run="{r}"}}[{w}]))'),
    "another window": ("samples_per_s", 'sum by (rank) (rate(ray_lab01_train_samples_total{{run="{r}"}}[5s]))'),
    "irate": ("samples_per_s", 'sum by (rank) (irate(ray_lab01_train_samples_total{{run="{r}"}}[{w}]))'),
    "no run matcher (report)": ("report_blocked", "sum by (ray_train_worker_world_rank) (rate(ray_train_report_total_blocked_time_s[{w}]))"),
    "bytes": ("object_store_mib", "sum by (instance) (ray_object_store_used_memory)"),
    "every label kept": ("cpu_percent", "ray_node_cpu_utilization"),
}  # fmt: skip
RIGHT_QUERIES = {  # other spellings of the same answers
    "max by": ("cpu_percent", "max by (instance) (ray_node_cpu_utilization)"),
    "by after": ("object_store_mib", "sum(ray_object_store_used_memory) by (instance) / 1024 / 1024"),
}


@pytest.mark.usefixtures("prometheus")
def test_lab01_recorded_cluster_tells_the_judges_queries_from_wrong_ones() -> None:
    """On every seed, each wrong query differs from the judge's own in at least one of the
    three cases, each right spelling agrees in all, and the judge's series are not empty."""
    import time

    from ddtk.course.judges import lab01
    from ddtk.course.judges._recorded import recorded_prometheus

    for seed in range(4):
        recorded = lab01.recorded_cluster(random.Random(seed), time.time())
        caught = dict.fromkeys(WRONG_QUERIES, False)
        with recorded_prometheus(recorded.text) as prom:
            for run, window, at in recorded.cases:
                reference = lab01.reference_queries(run, window)
                want = {k: lab01._by_labels(prom.query(q, at=at)) for k, q in reference.items()}
                assert all(want.values()), (seed, run, want)
                for name, (panel, query) in WRONG_QUERIES.items():
                    text = query.format(r=run, w=window)
                    caught[name] |= lab01._query_problem(prom, text, want[panel], at) is not None
                for name, (panel, query) in RIGHT_QUERIES.items():
                    assert lab01._query_problem(prom, query, want[panel], at) is None, (seed, name)
        assert all(caught.values()), (seed, caught)


@pytest.mark.usefixtures("prometheus")
def test_recorded_series_that_promtool_refuses_fail_with_its_reason() -> None:
    from ddtk.course.judges._recorded import recorded_prometheus
    from ddtk.monitoring.prometheus import PrometheusError

    with pytest.raises(PrometheusError, match="promtool could not import"), recorded_prometheus(
        "demo_total 1 1700000000\n"  # no # EOF: not OpenMetrics
    ):
        pass


def test_lab01_metrics_stand_in_checks_what_ray_checks() -> None:
    from ddtk.course.judges.lab01 import MetricsLog, metrics_module

    log = MetricsLog()
    metrics = metrics_module(log)
    counter = metrics.Counter("lab01_train_samples", tag_keys=("run", "rank"))
    counter.inc(32, tags={"run": "r", "rank": "0"})
    counter.inc(8, tags={"run": "r", "rank": "0"})
    for call, error in (
        (lambda: counter.inc(0, tags={"run": "r", "rank": "0"}), "value must be >0"),
        (lambda: counter.inc(1, tags={"run": "r"}), "Missing value for tag key"),
        (lambda: counter.inc(1, tags={"run": "r", "rank": 0}), "Tag values must be str"),
        (lambda: metrics.Counter("x", tag_keys=["run"]), "tag_keys should be a tuple"),
        (lambda: metrics.Summary, "no ray.util.metrics.Summary"),
        (lambda: metrics.Histogram("h", tag_keys=("run",)), "boundaries argument should be"),
        (lambda: counter.inc("8", tags={"run": "r", "rank": "0"}), "value must be int or float"),
    ):
        with pytest.raises((ValueError, TypeError, AttributeError), match=error):
            call()
    metrics.Gauge("g").set(None)  # Ray ignores a None: nothing recorded
    assert log.totals() == [{"kind": "counter", "name": "lab01_train_samples",
                             "tags": {"run": "r", "rank": "0"}, "calls": 2, "sum": 40.0}]  # fmt: skip


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
