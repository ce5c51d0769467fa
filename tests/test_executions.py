"""The execution cache: one run per distinct notebook, parameters, limits and environment.

A fake ``execute`` stands in for the sandbox where the test is about keys and storage
(it counts its calls); one test runs a real sandboxed kernel to show that a stored run
reads back as the run it was.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path

import nbformat
import pytest

from ddtk.course.executions import ExecutionCache, code_of, environment_digest, execution_key
from ddtk.course.grading.sandbox import Execution


def notebook(*sources: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title")]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


class FakeExecute:
    """Counts runs; returns a completed run with one output and a hand-in file."""

    def __init__(self, status: str = "completed", delay: float = 0.0) -> None:
        self.calls = 0
        self.status = status
        self.delay = delay

    def __call__(self, nb, *, name, timeout, memory_mb, hide=()) -> Execution:
        self.calls += 1
        time.sleep(self.delay)
        nb = copy.deepcopy(nb)
        nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
        reason = None if self.status == "completed" else "the kernel died while running cell[1]"
        return Execution(nb, self.status, 1.5, reason, {1}, {"lab99-report.json": b'{"ok": 1}'})


def sandboxed(cache: ExecutionCache, nb, fake, **limits) -> Execution:
    settings = {"name": "lab99.ipynb", "timeout": 60.0, "memory_mb": 2048} | limits
    return cache.sandboxed(nb, execute=fake, **settings)


def test_the_key_follows_code_parameters_and_limits_not_markdown_or_outputs() -> None:
    nb = notebook("x = 1", "print(x)")
    key = execution_key("sandbox", nb, {"timeout": 60})
    other = copy.deepcopy(nb)
    other.cells[0].source = "# another title"
    other.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="old\n")]
    other.cells[1].metadata["tags"] = ["parameters"]
    assert execution_key("sandbox", other, {"timeout": 60}) == key
    assert execution_key("sandbox", notebook("x = 2", "print(x)"), {"timeout": 60}) != key
    assert execution_key("sandbox", notebook("x = 1"), {"timeout": 60}) != key
    assert execution_key("sandbox", nb, {"timeout": 61}) != key
    assert execution_key("papermill", nb, {"timeout": 60}) != key
    assert code_of(json.loads(nbformat.writes(nb))) == ["x = 1", "print(x)"]  # raw JSON too
    assert len(environment_digest()) == 64 and environment_digest() == environment_digest()


def test_a_second_request_reads_the_stored_run_back(tmp_path: Path) -> None:
    fake = FakeExecute()
    cache = ExecutionCache(tmp_path / "cache")
    first = sandboxed(cache, notebook("x = 1"), fake)
    again = sandboxed(ExecutionCache(tmp_path / "cache"), notebook("x = 1"), fake)  # a new process
    assert fake.calls == 1
    assert (again.status, again.seconds, again.finished, again.handin) == (
        first.status, first.seconds, first.finished, first.handin,
    )  # fmt: skip
    assert again.notebook.cells[1].outputs[0]["text"] == "ran\n"
    sandboxed(cache, notebook("x = 1"), fake, timeout=30.0)  # other limits: another run
    sandboxed(cache, notebook("x = 2"), fake)  # other code: another run
    assert fake.calls == 3 and cache.stats.hits == 0 and cache.stats.executed == 3
    entries = sorted(p.name for p in (tmp_path / "cache" / "sandbox").iterdir() if p.is_dir())
    assert len(entries) == 3 and all(e.startswith("lab99-") for e in entries), entries


def test_runs_that_did_not_complete_are_not_kept(tmp_path: Path) -> None:
    fake = FakeExecute(status="died")
    cache = ExecutionCache(tmp_path)
    assert sandboxed(cache, notebook("import os; os._exit(1)"), fake).status == "died"
    assert sandboxed(cache, notebook("import os; os._exit(1)"), fake).status == "died"
    assert fake.calls == 2


def test_a_broken_entry_is_run_again_not_trusted(tmp_path: Path) -> None:
    fake = FakeExecute()
    cache = ExecutionCache(tmp_path)
    sandboxed(cache, notebook("x = 1"), fake)
    (entry,) = [p for p in (tmp_path / "sandbox").iterdir() if p.is_dir()]
    (entry / "run.json").write_text("{truncated")
    assert sandboxed(cache, notebook("x = 1"), fake).status == "completed"
    assert fake.calls == 2
    assert json.loads((entry / "run.json").read_text())["status"] == "completed"


def test_two_processes_asking_at_once_run_it_once(tmp_path: Path) -> None:
    fake = FakeExecute(delay=0.5)
    results = []

    def ask() -> None:  # each thread has its own cache object, as two pytest workers would
        results.append(sandboxed(ExecutionCache(tmp_path), notebook("x = 1"), fake))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls == 1 and len(results) == 3


def test_the_folder_comes_from_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DDTK_EXECUTED", str(tmp_path / "elsewhere"))
    assert ExecutionCache().root == tmp_path / "elsewhere"
    monkeypatch.delenv("DDTK_EXECUTED")
    assert ExecutionCache().root == Path("build/executed").absolute()


@pytest.mark.notebook
def test_a_real_sandboxed_run_reads_back_as_it_ran(tmp_path: Path) -> None:
    cache = ExecutionCache(tmp_path)
    nb = notebook("import os\nprint(os.getpid())", "open('lab99-report.md', 'w').write('# hi')")
    first = cache.sandboxed(nb, name="lab99.ipynb", timeout=60, memory_mb=0)
    again = cache.sandboxed(nb, name="lab99.ipynb", timeout=60, memory_mb=0)
    assert first.status == "completed" and (cache.stats.hits, cache.stats.executed) == (1, 1)
    assert again.notebook.cells[1].outputs == first.notebook.cells[1].outputs  # the same pid
    assert again.handin == first.handin == {"lab99-report.md": b"# hi"}
    assert again.finished == first.finished == {1, 2}
