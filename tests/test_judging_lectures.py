"""Judged lecture exercises (:mod:`ddtk.course.judges.lecture01` .. ``lecture04``).

- each lecture's mutant matrix: the stub (the lecture with its solution blocks stubbed
  in memory, as ``ddtk course build`` stubs a lab) fails, the solution passes, every
  plausible wrong answer in ``solutions/mutants/lectureNN.py`` fails, with the message
  saying why;
- answers that take a shortcut (Ray Tune's schedulers, ddtk's own network diagnosis,
  the judge's module) earn nothing, without a process being started;
- a lecture finds its judge and its mutants by its notebook name.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from judging_support import assert_shortcuts_earn_nothing, proved_matrix

from ddtk.course.judges import judge_for
from ddtk.course.judging.mutants import load_mutants, mutants_file, solution_notebook, stub_lecture

ROOT = Path(__file__).resolve().parents[1]
LECTURES = {
    "01-distributed-fundamentals": {
        "TP may cross nodes": "crosses nodes",
        "2·N·D, the forward pass only": "backward adds 4·N·D",
        "MFU multiplies the time instead of dividing it": "MFU applied the wrong way",
        "GPU-seconds taken for GPU-hours": "divide by 3,600",
        "days not spread over the GPUs": "spread the GPU-hours over the gpus",
        "an MFU of 40 taken for 40%": "must raise ValueError",
    },
    "02-ray": {
        "the last rung stops short of max_t": "up to and including max_t",
        "every exploiter clones the best trial": "drawn at random from the whole top quantile",
        "the cluster's resources pooled as if one node": "a bundle never spans nodes",
    },
    "03-horovod-and-ddp": {
        "offloading never considered": "yet deepspeed_config raised ValueError",
        "offloading with ZeRO stage 0": "offloading needs stage 1 or more",
    },
    "04-nccl-and-networking": {
        "any IB channel counts as GPUDirect RDMA": "expected IB, got IB+GDR",
        "NCCL_IB_HCA without the leading '='": "a leading '='",
        "TP is the slowest dimension": "spans several nodes",
        "the notebook's threshold hard-coded": "slow paths found",
        "the MTU rule applied to InfiniBand ports too": "the MTU rule is for RoCE",
        "the line rate compared in bytes": "below 80 %: 'link rate'",
        "every IB without GDR blamed on the peer-memory module": "the reason names a distance",
        "a port in INIT sent to the cable": "no subnet manager has made the port active",
    },
}

pytestmark = pytest.mark.notebook


def _lecture(stem: str) -> tuple[Path, nbformat.NotebookNode, nbformat.NotebookNode]:
    path = ROOT / "course" / f"{stem}.ipynb"
    solution = solution_notebook(path)
    stub, count = stub_lecture(solution, path.name)
    assert count == len(judge_for(stem).exercises), (stem, count)
    return path, solution, stub


def test_each_lecture_finds_its_judge_and_mutants() -> None:
    for stem in LECTURES:
        judge = judge_for(stem)
        assert judge is not None and judge.lab == stem, stem
        path = ROOT / "course" / f"{stem}.ipynb"
        file = mutants_file(path)
        assert file == ROOT / "solutions" / "mutants" / f"lecture{stem[:2]}.py", file
        assert set(load_mutants(file)) == set(judge.exercises), stem
    lab = ROOT / "solutions" / "lab03-fault-tolerant.ipynb"
    assert mutants_file(lab) == ROOT / "solutions" / "mutants" / "lab03.py"


@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(LECTURES))
def test_lecture_mutant_matrix_stub_fails_solution_passes_every_mutant_fails(stem: str) -> None:
    path, solution, stub = _lecture(stem)
    mutants = load_mutants(mutants_file(path))
    judge = judge_for(stem)
    words = proved_matrix(judge, solution, stub, mutants)
    for number in judge.exercises:
        assert len(mutants.get(number, {})) >= 3, (stem, number)
    for variant, said in LECTURES[stem].items():
        assert said in words[variant], (variant, words[variant])
    assert "not done yet" in words["stub"]


def test_shortcuts_earn_nothing_and_start_no_process(monkeypatch) -> None:
    import ddtk.course.judging as judging

    monkeypatch.setattr(judging, "Worker", None)  # a shortcut must be caught before any process
    cases = [
        ("02-ray", 1, "code-ex_asha",
         "from ray.tune.schedulers import ASHAScheduler\n\ndef asha_rungs(g, r, m):\n    return [g]\n",
         "imports ray.tune.schedulers.ASHAScheduler"),
        ("04-nccl-and-networking", 5, "898be430",
         "from ddtk.net.probe import find_slow_links\n\ndef culprits(bw, threshold=0.5):\n"
         "    return {'nics': [], 'paths': [(s.src, s.dst) for s in find_slow_links(bw, threshold)]}\n",
         "imports ddtk.net.probe.find_slow_links"),
        ("01-distributed-fundamentals", 1, "70a5bfb7",
         "from ddtk.course.judges.lecture01 import simplest as choose_parallelism\n",
         "imports ddtk.course.judges.lecture01.simplest"),
        ("01-distributed-fundamentals", 2, "l01-size",
         "from ddtk.profiling.mfu import size_run\n\ndef size_the_run(params, tokens_per_param, peak_tflops, mfu, gpus, usd_per_gpu_hour):\n"
         "    return size_run(params, tokens_per_param=tokens_per_param, peak_tflops=peak_tflops, mfu=mfu,\n"
         "                    gpus=gpus, usd_per_gpu_hour=usd_per_gpu_hour).as_dict()\n",
         "imports ddtk.profiling.mfu.size_run"),
        ("03-horovod-and-ddp", 1, "l03-ex1",
         "from ddtk.frameworks.zero_memory import ds_config\n\ndef deepspeed_config(n, w, g, micro_batch):\n"
         "    return ds_config(3)\n", "imports ddtk.frameworks.zero_memory.ds_config"),
        ("04-nccl-and-networking", 6, "l04-ex6",
         "from ddtk.net.rdma_check import link_findings, nccl_findings, port_findings\n\n"
         "def rdma_fixes(ports, bw, rate, nccl):\n"
         "    found = port_findings(ports) + link_findings(bw, rate) + nccl_findings(nccl)\n"
         "    return [(f.where, f.key) for f in found]\n", "imports ddtk.net.rdma_check"),
        ("04-nccl-and-networking", 2, "1907ac93",
         "import sys\n\ndef usable_ports(text, rate):\n    return sys._getframe(1).f_locals['want']\n",
         "uses .f_locals"),
    ]  # fmt: skip
    for stem, number, cell_id, source, words in cases:
        _path, solution, _stub = _lecture(stem)
        assert_shortcuts_earn_nothing(judge_for(stem), solution, {number: (cell_id, source, words)})


def test_the_given_imports_are_allowed() -> None:
    """The names an exercise cell itself imports (the lecture hands them out) are no shortcut."""
    from ddtk.course.judging.audit import audit

    for stem in LECTURES:
        _path, solution, _stub = _lecture(stem)
        cells = {c.get("id"): c.source for c in solution.cells}
        for exercise in judge_for(stem).exercises.values():
            for cell_id in exercise.cells:
                found = audit(cells[cell_id], (*exercise.forbid, "ddtk.course"), exercise.allow)
                assert not found, (stem, cell_id, found)


def test_course_check_mutants_judges_the_lectures_too(monkeypatch, capsys) -> None:
    import ddtk.course.judging.mutants as mutants
    from ddtk.course.cli import _check_mutants

    seen: list[tuple[str, int]] = []

    def matrix(judge, solution, stub, named, **_kw):
        seen.append((judge.lab, len(named)))
        assert "raise NotImplementedError(" in "".join(c.source for c in stub.cells)
        return [mutants.MatrixRow(1, "a hole", "fail", "pass", "")]

    monkeypatch.setattr(mutants, "mutant_matrix", matrix)
    assert _check_mutants(ROOT) == 1
    out = capsys.readouterr().out
    for stem in LECTURES:
        assert (stem, len(load_mutants(mutants_file(ROOT / "course" / f"{stem}.ipynb")))) in seen
        assert f"{stem}: 1 unexpected outcome(s)" in out
    assert "solutions/mutants/lecture02.py" in out
