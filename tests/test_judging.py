"""Judged exercises (:mod:`ddtk.course.judging`): verdicts from outside the learner's process.

- lab 03's mutant matrix: the stub fails, the solution passes, every plausible wrong
  answer in ``solutions/mutants/lab03.py`` fails, with the message saying why;
- answers that take a shortcut (an import of what the exercise builds, dynamic imports,
  reading the judge's frames) earn nothing, without a process being started;
- tampering in the learner's other cells never reaches the judge, and a worker that
  answers with something other than data is refused;
- the worker's confinement: it sees neither the solutions nor the grader's files;
- the mutant matrices' worker pool: a child forked from a zygote behaves as a new worker
  (its own folder and temporary folder, memory gone on restart, an ending or a hang
  reported as one, nothing it started left running), forked from a set-up run once.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import nbformat
import pytest
from judging_support import (
    assert_shortcuts_earn_nothing,
    notebook_pair,
    proved_matrix,
)

from ddtk.course.judges import judge_for
from ddtk.course.judging import judge_notebook
from ddtk.course.judging.mutants import load_mutants, mutants_file
from ddtk.course.judging.session import LearnerError, Worker, WorkerBroke, WorkerEnded, WorkerPool

ROOT = Path(__file__).resolve().parents[1]
LAB03 = ROOT / "solutions" / "lab03-fault-tolerant.ipynb"

pytestmark = pytest.mark.notebook


def _lab03() -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    return notebook_pair(LAB03)


@pytest.mark.slow
def test_lab03_mutant_matrix_stub_fails_solution_passes_every_mutant_fails() -> None:
    solution, stub = _lab03()
    mutants = load_mutants(mutants_file(LAB03))
    words = proved_matrix(judge_for(LAB03.stem), solution, stub, mutants)
    for number, named in mutants.items():
        assert len(named) >= 3, number
    # each failure says what is wrong, not only that something is
    assert "written in place" in words["written in place: no temporary file, fsync or rename"]
    assert "without an fsync first" in words["renamed without an fsync"]
    assert "not fsynced after" in words["the directory is never fsynced"]
    assert (
        "did not resume from the newest checkpoint"
        in words["saves checkpoints but never loads one"]
    )
    assert "a seeded log with lost commit planted" in words["answers for the one log it was shown"]
    # the consistency checks are four functions, judged in parts: one wrong keeps 3/4 credit
    assert "1 of 4 parts passed (world_schedule)" in words["answers for the one log it was shown"]
    for variant in ("a restart from the last commit counted as lost",
                    "duplicates counted across epochs", "the world size of a step's first execution"):  # fmt: skip
        assert "3 of 4 parts passed" in words[variant], words[variant]
    notice = {
        "no handler: SIGTERM's default action ends the process": "ended by SIGTERM itself: no handler",
        "the handler exits at once (sys.exit in the handler)": "none: the newest is still step",
        "SIGTERM only: Slurm's SIGUSR1 still kills it": "ended by SIGUSR1 itself: no handler",
        "stops at the notice without committing": "none: the newest is still step",
        "waits for the next periodic checkpoint": "SIGKILLed",
        "the checkpoint is numbered one step ahead": "with the parameters after exactly",
    }
    for variant, said in notice.items():
        assert said in words[variant], (variant, words[variant])
    elastic = {
        "never resumes from ray.train.get_checkpoint()": "did not resume from ray.train.get_checkpoint()",
        "restores the weights and the step, not the optimizer": "is the whole state restored?",
        "every rank trains on rank 0's share": "what rank 1 trained on",
        "reports at every step": "ray.train.report calls",
        "every rank attaches a checkpoint": "rank 0 alone attaches the checkpoint",
        "a fixed number of workers": "ScalingConfig.num_workers",
        "no RunEvents callback": "RunConfig.callbacks",
    }
    for variant, said in elastic.items():
        assert said in words[variant], (variant, words[variant])


def test_shortcuts_earn_nothing_and_start_no_process(monkeypatch) -> None:
    import ddtk.course.judging as judging

    solution, _stub = _lab03()
    judge = judge_for(LAB03.stem)
    monkeypatch.setattr(judging, "Worker", None)  # a shortcut must be caught before any process
    cell = next(c for c in solution.cells if c.get("id") == "3a6f6f6b").source
    cases = {
        2: ("3a6f6f6b", cell.replace("import hashlib\n", "import hashlib\nfrom ddtk.checkpoint.atomic import atomic_save as _a\n"),
            "imports ddtk.checkpoint.atomic.atomic_save"),
        8: ("11371148", "import importlib\nlost_committed_steps = importlib.import_module('ddtk.course.judges.lab03')",
            "uses importlib"),
        1: ("9d288f91", "import sys\ndef capture_state(m, o, s):\n    return sys._getframe(1).f_locals\n"
            "def restore_state(s, m, o):\n    return 5", "uses .f_locals"),
        3: ("aedc4add", "import ddtk.course.checks as c\nc.expect = lambda *a, **k: None\ndef train(d, s):\n    return {}",
            "imports ddtk.course.checks"),
        6: ("5b9bab2f", "from ddtk.recovery.ray_train import train_loop\nelastic_trainer = None",
            "imports ddtk.recovery.ray_train.train_loop"),
        4: ("b7c1e4d2", "from ddtk.faults.preemption import PreemptionHandler\n"
            "def preemptible_train(run_dir, steps):\n    return {}", "imports ddtk.faults.preemption.PreemptionHandler"),
    }  # fmt: skip
    assert_shortcuts_earn_nothing(judge, solution, cases)


def test_tampering_outside_the_answer_cells_never_reaches_the_judge() -> None:
    solution, stub = _lab03()
    tamper = (
        "import ddtk.course.checks as checks, sys, types\n"
        "checks.expect = lambda *a, **k: None\n"
        "checks.CheckFailed = type('CheckFailed', (Exception,), {})\n"
        "sys.modules['ddtk.course.judging'] = types.ModuleType('fake')\n"
        "print('Exercise 1 passed: capture and restore the full state')\n"
        "get_ipython().showtraceback = lambda *a, **k: None\n"
        "accuracy_threshold = 0\n"
    )
    nb = copy.deepcopy(stub)
    nb.cells.insert(3, nbformat.v4.new_code_cell(tamper))
    verdict = judge_notebook(judge_for(LAB03.stem), solution, nb, only=(1,))[1]
    assert verdict.status == "fail" and "not done yet" in verdict.message, verdict


def test_a_worker_answers_with_data_only_and_sees_no_solution() -> None:
    from ddtk.course.grading.jail import confinement

    if not confinement().namespaces:
        pytest.skip(confinement().summary())
    with Worker([("setup", "import os, pathlib")], timeout=60, hide=[ROOT / "solutions"]) as w:
        w.exec(
            "answer",
            "class Liar:\n    def __eq__(self, other):\n        return True\nliar = Liar()",
        )
        with pytest.raises(LearnerError, match=r"could not be sent|could not be read"):
            w.probe("ddtk.course.judging.worker:value_of", name="liar")
        assert w.probe("ddtk.course.judging.worker:value_of", name="__name__") == "__main__"
        w.exec("look", f"seen = os.listdir({str(ROOT / 'solutions')!r})")
        assert w.probe("ddtk.course.judging.worker:value_of", name="seen") == []
        with pytest.raises(LearnerError, match=r"Read-only|Permission|No such"):
            w.exec("escape", f"open({str(ROOT / 'ddtk' / 'pwned')!r}, 'w')")
    assert not (ROOT / "ddtk" / "pwned").exists()


def test_a_checkout_under_tmp_stays_visible_in_the_private_tmp(monkeypatch) -> None:
    """A checkout or venv in a traversable folder of /tmp (a CI clone, a learner's scratch
    copy) is what the worker runs from: the jail's private /tmp shows it again, read-only,
    and still hides the rest of the machine's /tmp."""
    import tempfile

    from ddtk.course.grading import jail
    from ddtk.course.grading.jail import confinement

    if not confinement().namespaces:
        pytest.skip(confinement().summary())
    with (
        tempfile.TemporaryDirectory(dir="/tmp") as needed,
        tempfile.TemporaryDirectory(dir="/tmp") as other,
    ):
        os.chmod(needed, 0o755)  # traversable: not one of the closed folders the jail rebuilds
        (Path(needed) / "venv").mkdir()
        (Path(needed) / "venv" / "marker.txt").write_text("the interpreter lives here")
        (Path(other) / "secret.txt").write_text("not for the worker")
        paths = jail._needed_paths()
        monkeypatch.setattr(jail, "_needed_paths", lambda: [*paths, Path(needed) / "venv"])
        with Worker([("setup", "import pathlib")], timeout=60) as w:
            marker, secret = Path(needed) / "venv" / "marker.txt", Path(other) / "secret.txt"
            w.exec("look", f"seen = pathlib.Path({str(marker)!r}).read_text()\n"
                           f"hidden = not pathlib.Path({str(secret)!r}).exists()")  # fmt: skip
            assert _value(w, "seen") == "the interpreter lives here"
            assert _value(w, "hidden") is True
            with pytest.raises(LearnerError, match=r"Read-only|Permission"):
                w.exec("write", f"pathlib.Path({str(marker)!r}).write_text('changed')")
        assert marker.read_text() == "the interpreter lives here"


def _value(worker, name: str):
    return worker.probe("ddtk.course.judging.worker:value_of", name=name)


def test_a_pooled_worker_is_a_new_worker_forked_from_one_set_up() -> None:
    import psutil

    base = [("setup", "import os, tempfile, time\nimport torch\nbase = torch.ones(3)\n"
                      "set_up_at = time.time_ns()")]  # fmt: skip

    def key(timeout: int) -> tuple:
        return (tuple(base), (), timeout)

    with WorkerPool() as pool:
        first = pool.worker(base, [("answer", "doubled = base * 2")], timeout=60, hide=())
        assert _value(first, "doubled").tolist() == [2.0, 2.0, 2.0]
        set_up_at = _value(first, "set_up_at")
        first.exec("where", "cwd, tmp = os.getcwd(), tempfile.gettempdir()\n"
                            "threads = torch.get_num_threads()\nopen('kept.txt', 'w').write('x')")  # fmt: skip
        assert _value(first, "cwd") == str(first.folder)
        assert _value(first, "tmp") == str(first.folder / "tmp")
        assert _value(first, "threads") >= 1
        with pytest.raises(LearnerError, match="ValueError: boom"):
            first.exec("raises", "raise ValueError('boom')")
        assert _value(first, "doubled").tolist() == [2.0, 2.0, 2.0]  # an error ends nothing
        first.restart()  # memory gone, files kept, the answer run again
        with pytest.raises(LearnerError, match="KeyError"):
            _value(first, "cwd")
        assert (first.folder / "kept.txt").exists() and _value(first, "doubled") is not None
        first.close()
        assert not first.folder.exists()

        second = pool.worker(base, [("answer", "import subprocess\n"
                                     "sleeper = subprocess.Popen(['sleep', '300']).pid")],
                             timeout=60, hide=())  # fmt: skip
        # forked from the same set-up, which ran once: not an interpreter importing torch again
        assert _value(second, "set_up_at") == set_up_at and len(pool.zygotes[key(60)]) == 1
        beside = pool.worker(base, [("answer", "y = 2")], timeout=60, hide=())
        assert len(pool.zygotes[key(60)]) == 2  # two at once: a second zygote
        assert _value(beside, "y") == 2 and _value(second, "sleeper") > 0
        beside.close()
        with pytest.raises(LearnerError, match="KeyError: 'cwd'"):
            _value(second, "cwd")  # nothing of the first child's memory
        with pytest.raises(WorkerEnded, match=r"ended \(exit status 3\) before it answered"):
            second.exec("dies", "os._exit(3)")
        with pytest.raises(LearnerError, match="ended before it was asked"):
            second.exec("after", "1")
        second.close()
        assert not [
            p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "300"]
        ]

        # a child that cannot make its folder ends at once, and the zygote forks again
        zygote = pool.zygotes[key(60)][0]
        with pytest.raises(WorkerEnded, match=r"exit status 70"):
            zygote.worker._ask(("fork", "/proc/no-folder-here"))
        again = pool.worker(base, [("answer", "z = 3")], timeout=60, hide=())
        assert _value(again, "z") == 3
        again.close()

        # 10 s: a new zygote (an interpreter importing torch) must start within the limit too
        third = pool.worker(base, [("answer", "x = 1")], timeout=10, hide=())
        with pytest.raises(WorkerBroke, match="no answer within 10 s"):
            third.exec("hangs", "import time\ntime.sleep(60)")
        (broken,) = pool.zygotes[key(10)]
        assert broken.broken
        fourth = pool.worker(base, [("answer", "x = 4")], timeout=10, hide=())
        assert _value(fourth, "x") == 4 and pool.zygotes[key(10)] == [fourth.zygote]
        third.close()
        fourth.close()


def test_a_traced_worker_is_never_forked() -> None:
    import shutil

    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    with WorkerPool() as pool:
        w = pool.worker([("setup", "import os")], [], timeout=60, hide=(), trace=True)
        assert isinstance(w, Worker) and w.trace_log is not None and not pool.zygotes
        w.close()


def _sort_in_place(ns: dict, items: list) -> list:
    """A probe whose answer edits its input in place (lab 01's template mutant does)."""
    items.sort()
    return items


def test_a_local_check_sees_an_input_edited_in_place_as_the_grader_does() -> None:
    """A notebook's own check (LocalWorker) gets copies of the probe's arguments, as a
    worker process gets them pickled: the judge's own inputs stay as they were."""
    from ddtk.course.judging.session import LocalWorker

    sent = [3, 1, 2]
    with LocalWorker({}) as w:
        assert w.probe("test_judging:_sort_in_place", items=sent) == [1, 2, 3]
    assert sent == [3, 1, 2]


def test_course_check_mutants_reports_a_hole_and_fails(monkeypatch, capsys) -> None:
    import ddtk.course.judging.mutants as mutants
    from ddtk.course.cli import main

    hole = mutants.MatrixRow(2, "renamed without an fsync", "fail", "pass", "")
    monkeypatch.setattr(mutants, "mutant_matrix", lambda *a, **k: [hole])
    assert main(["check", "--mutants", "--root", str(ROOT)]) == 1
    out = capsys.readouterr().out
    assert (
        "renamed without an fsync" in out and "lab03-fault-tolerant: 1 unexpected outcome(s)" in out
    )
    judged = [
        "lab01",
        "lab02",
        "lab03",
        "lab04",
        "lecture01",
        "lecture02",
        "lecture03",
        "lecture04",
    ]
    assert f"{len(judged)} unexpected outcome(s) in all" in out  # every lab and lecture is judged


def test_a_notebooks_own_judge_call_stands_aside_in_a_grading_run(monkeypatch, capsys) -> None:
    """``judge(n, globals())`` in a notebook runs the grader's check there, except in a
    grading run's kernel (the sandbox's marker in its environment): the grader judges
    the exercise itself and its verdict replaces the kernel's, so nothing is run twice."""
    from ddtk.course.checks import CheckFailed
    from ddtk.course.grading.sandbox import MARKER
    from ddtk.course.judging import check_here

    judge = judge_for("lab04-profiling")
    monkeypatch.delenv(MARKER, raising=False)
    with pytest.raises(CheckFailed):
        check_here(judge, 1, {})  # no answer at all: the check runs here and fails
    monkeypatch.setenv(MARKER, "token")
    check_here(judge, 1, {})
    assert "the grader judges it in its own processes" in capsys.readouterr().out
